"""``sp.mix`` (issue 14 §1): weighted mixing, exactly once, deterministic, resumable."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes._core.mixing import BLOCK, MixDraws, check_weights
from tests.conftest import Dataset


def source(data: Dataset, *, seed: int = 1) -> Any:
    """A source chain: keys and sources of samples, shuffled within a buffer."""
    return (
        sp.list_shards(data.urls)
        .split_shards(shuffle=True, seed=seed)
        .open_tar()
        .shuffle_samples(buffer_size=20, seed=seed)
    )


@pytest.fixture
def two(make_shards: Callable[..., Dataset], tmp_path: Path) -> tuple[Dataset, Dataset]:
    """Source "a": 6 shards of 100 samples; "b": 4 shards of 50."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_shards(6, 100, base=str(tmp_path / "a"))
    b = make_shards(4, 50, base=str(tmp_path / "b"))
    return a, b


def keyed(samples: Any) -> list[tuple[str, str]]:
    return [
        (s["__source__"], s["__url__"].rsplit("/", 2)[-2] + ":" + s["__key__"]) for s in samples
    ]


def mixed(two: tuple[Dataset, Dataset], **options: Any) -> sp.Mixer:
    a, b = two
    return sp.mix({"a": source(a), "b": source(b, seed=2)}, **options)


def loader(pipe: Any, workers: int = 2) -> Any:
    return DataLoader(pipe, batch_size=None, num_workers=workers)


def test_every_sample_once_in_the_weights_proportions(two: tuple[Dataset, Dataset]) -> None:
    """2 workers, weights 3:1 over 600 + 200 samples: all 800 once, in proportion.

    While both sources last, every window of 100 holds "a" at 3/4 within 5 %.
    """
    a, b = two
    got = keyed(loader(mixed(two, weights={"a": 3, "b": 1}, seed=5)))
    expected = {("a", f"a:{k}") for k in a.keys} | {("b", f"b:{k}") for k in b.keys}
    assert len(got) == 800 and set(got) == expected
    last_b = max(i for i, (name, _) in enumerate(got) if name == "b")
    assert last_b > 700  # b lasts until about the end: 200 of 800 at 1/4
    for start in range(0, last_b - 100, 10):
        window = [name for name, _ in got[start : start + 100]]
        assert abs(window.count("a") / 100 - 0.75) <= 0.05, (start, window.count("a"))


def test_deterministic_and_new_each_epoch(two: tuple[Dataset, Dataset]) -> None:
    """The same seed gives the same order; the next epoch, and another seed, another."""
    first = keyed(loader(mixed(two, seed=5)))
    assert keyed(loader(mixed(two, seed=5))) == first
    assert keyed(loader(mixed(two, seed=6))) != first
    pipe = mixed(two, seed=5)
    epochs = [keyed(loader(pipe)) for _ in range(2)]
    assert epochs[0] == first and epochs[1] != first
    assert sorted(epochs[1]) == sorted(first)
    sp.set_epoch(pipe, 0)  # the sources' splits and the draws alike
    assert keyed(loader(pipe)) == first


def test_a_source_that_runs_out_leaves_the_others(two: tuple[Dataset, Dataset]) -> None:
    """Weights 1:3 over 600 + 200: "b" runs out first, then "a" alone to the end."""
    got = [name for name, _ in keyed(mixed(two, weights={"a": 1, "b": 3}))]
    assert Counter(got) == {"a": 600, "b": 200}
    last_b = max(i for i, name in enumerate(got) if name == "b")
    assert abs(last_b - 266) <= 2 * BLOCK  # 200 b at 3/4: ~267 draws
    assert set(got[last_b + 1 :]) == {"a"}


def test_resumes_exactly_with_the_plain_stateful_dataloader(
    two: tuple[Dataset, Dataset],
) -> None:
    """Stopped after 17 batches with 2 workers: the rest, then the same as uninterrupted."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> Any:
        return mixed(two, weights={"a": 2, "b": 1}, seed=3).batch(8)

    def names(batch: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return keyed(batch)

    whole = [names(b) for b in StatefulDataLoader(make(), batch_size=None, num_workers=2)]
    first = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    before = []
    for batch in first:
        before.append(names(batch))
        if len(before) == 17:
            state = first.state_dict()
            break
    second = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    second.load_state_dict(state)
    after = [names(b) for b in second]
    assert before + after == whole


def test_bad_weights_are_refused_at_construction(two: tuple[Dataset, Dataset]) -> None:
    with pytest.raises(ValueError, match="'a' is negative"):
        mixed(two, weights={"a": -1, "b": 1})
    with pytest.raises(ValueError, match="all zero"):
        mixed(two, weights={"a": 0, "b": 0})
    with pytest.raises(ValueError, match="name no source: c"):
        mixed(two, weights={"a": 1, "b": 1, "c": 1})
    with pytest.raises(ValueError, match="no weight for source"):
        mixed(two, weights={"a": 1})
    with pytest.raises(ValueError, match="finite number"):
        mixed(two, weights={"a": math.nan, "b": 1})
    with pytest.raises(TypeError, match=r"mix \(source 'a'\) takes a shardpipes pipeline"):
        sp.mix({"a": [1, 2]})  # type: ignore[dict-item]


def test_a_mix_ending_a_chain_gives_the_chains_state(two: tuple[Dataset, Dataset]) -> None:
    """mix.state_dict() is the pipeline's: its draws alone would read the sources anew."""
    whole = keyed(mixed(two, seed=3))
    first = mixed(two, seed=3)
    samples = iter(first)
    before = keyed(next(samples) for _ in range(23))
    state = first.state_dict()
    samples.close()
    assert state == sp.Resumable(first).state_dict()
    assert sorted(state["pipeline"]["sources"]) == ["a", "b"]
    assert state["pipeline"]["yielded"] == 23
    second = mixed(two, seed=3)
    second.load_state_dict(state)
    assert before + keyed(second) == whole


def test_a_state_of_other_sources_is_refused(two: tuple[Dataset, Dataset]) -> None:
    pipe = mixed(two)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    other = sp.mix({"a": source(two[0]), "c": source(two[1])})
    with pytest.raises(ValueError, match="saved for a mix of"):
        other.load_state_dict(state)


def test_draws_hold_the_weights_within_a_block() -> None:
    """The core draws: after any n draws, each count within 1 + a block of n × share."""
    weights = check_weights(["x", "y", "z"], {"x": 5, "y": 3, "z": 0.5})
    draws = MixDraws(weights, "seed")
    counts: Counter[str] = Counter()
    total = sum(weights.values())
    for n in range(1, 2001):
        counts[draws.next()] += 1
        for name, w in weights.items():
            assert abs(counts[name] - n * w / total) <= BLOCK + 1
    again = MixDraws(weights, "seed")
    assert [again.next() for _ in range(2000)] == list(_replay(weights, "seed", 2000))


def _replay(weights: dict[str, float], seed: str, n: int) -> list[str]:
    draws = MixDraws(weights, seed)
    half = [draws.next() for _ in range(n // 2)]
    state = draws.state()
    resumed = MixDraws(weights, "another seed")
    resumed.restore(state)
    return half + [resumed.next() for _ in range(n - n // 2)]


def test_epoch_size_draws_exactly_that_many_in_proportion(
    two: tuple[Dataset, Dataset],
) -> None:
    """epoch_size=1000, weights 1:1 over 600 + 200 samples, 2 workers: 500 of each.

    "b" runs out and starts new passes, each sample once per pass (2 or 3 times in all).
    """
    got = keyed(loader(mixed(two, seed=4, epoch_size=1000)))
    assert len(got) == 1000
    by_source = Counter(name for name, _ in got)
    assert by_source == {"a": 500, "b": 500}
    a_keys = Counter(key for name, key in got if name == "a")
    b_keys = Counter(key for name, key in got if name == "b")
    assert set(a_keys.values()) == {1}
    assert len(b_keys) == 200 and set(b_keys.values()) == {2, 3}
    first_pass = [key for name, key in got if name == "b"][:50]
    assert len(set(first_pass)) == 50  # a pass draws without replacement


def test_epoch_size_resumes_exactly_across_passes(two: tuple[Dataset, Dataset]) -> None:
    """Stopped in "b"'s second pass: the rest, then the same as uninterrupted."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> Any:
        return mixed(two, weights={"a": 1, "b": 3}, seed=8, epoch_size=640).batch(8)

    whole = [keyed(b) for b in StatefulDataLoader(make(), batch_size=None, num_workers=2)]
    assert sum(map(len, whole)) == 640
    first = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    before = []
    for batch in first:
        before.append(keyed(batch))
        if len(before) == 50:  # 400 samples: ~300 of "b", past its 200
            state = first.state_dict()
            break
    second = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    second.load_state_dict(state)
    assert before + [keyed(b) for b in second] == whole


def test_epoch_size_below_the_workers_is_an_error(two: tuple[Dataset, Dataset]) -> None:
    with pytest.raises(ValueError, match="positive int"):
        mixed(two, epoch_size=0)
    with pytest.raises(Exception, match=r"epoch_size=1 is below the number of workers"):
        list(loader(mixed(two, epoch_size=1)))


def test_epoch_size_with_persistent_workers_keeps_the_workers_together(
    two: tuple[Dataset, Dataset],
) -> None:
    """Workers that made different numbers of passes still agree on the next epoch."""
    pipe = mixed(two, weights={"a": 1, "b": 3}, seed=9, epoch_size=900)
    persistent = DataLoader(pipe, batch_size=None, num_workers=2, persistent_workers=True)
    epochs = [keyed(persistent) for _ in range(2)]
    for got in epochs:
        assert len(got) == 900
        a_keys = Counter(key for name, key in got if name == "a")
        assert set(a_keys.values()) == {1} and abs(a_keys.total() - 225) <= 2  # ±1 a worker
    assert epochs[0] != epochs[1]


def test_a_pass_is_a_new_order_in_the_same_epoch(two: tuple[Dataset, Dataset]) -> None:
    """next_pass (a mix's epoch_size, cycle_epochs): a new order, the epoch untouched.

    So workers that made different numbers of passes still agree on the loader's epochs.
    """
    splitter = sp.list_shards(two[0].urls).split_shards(shuffle=True, seed=1)
    first = list(splitter)
    epoch = splitter.epoch
    splitter.next_pass()
    again = list(splitter)
    assert (splitter.epoch, splitter.pass_) == (epoch, 1)
    assert splitter.state()["pass"] == 1
    assert sorted(again) == sorted(first) and again != first
    after = list(splitter)  # a bare iteration: the next epoch, from its first pass
    assert (splitter.epoch, splitter.pass_) == (epoch + 1, 0)
    assert after not in (first, again)


def test_set_epoch_on_the_mix_sets_its_sources(two: tuple[Dataset, Dataset]) -> None:
    """mix.set_epoch(n) == sp.set_epoch(mix, n): the sources' orders follow, not only draws."""
    one, other = mixed(two, seed=5), mixed(two, seed=5)
    one.set_epoch(2)
    sp.set_epoch(other, 2)
    assert keyed(one) == keyed(other)
    assert keyed(one) != keyed(mixed(two, seed=5))  # epoch 3 now, and epoch 0 differs


def test_mistakes_are_named_at_construction(two: tuple[Dataset, Dataset]) -> None:
    a, _ = two
    with pytest.raises(TypeError, match=r"give tar_shards a dict of sources"):
        sp.mix({"a": sp.recipes.tar_shards(a.urls), "b": source(a)})
    with pytest.raises(TypeError, match=r"yields tuples or batches: put it before to_tuple"):
        sp.mix({"a": source(a).to_tuple("__key__")})
    with pytest.raises(TypeError, match=r"weights must be a dict"):
        mixed(two, weights=[3, 1])  # type: ignore[arg-type]


def test_a_mix_that_cannot_fill_its_epoch_says_so(make_shards: Callable[..., Dataset]) -> None:
    empty = make_shards(1, 0)
    pipe = sp.mix({"e": sp.list_shards(empty.urls).split_shards().open_tar()}, epoch_size=10)
    with pytest.raises(ValueError, match=r"ran out of samples .* after 0"):
        list(pipe)


def test_a_state_of_another_seed_is_refused(two: tuple[Dataset, Dataset]) -> None:
    pipe = mixed(two, seed=1)
    next(iter(pipe))
    with pytest.raises(ValueError, match=r"saved for a mix with seed=1; this one has seed=2"):
        mixed(two, seed=2).load_state_dict(pipe.state_dict())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_at_the_end_of_an_epoch_resumes_the_next(
    two: tuple[Dataset, Dataset], workers: int
) -> None:
    """Loaded, a state taken after the last batch gives the next epoch, as uninterrupted.

    With workers, the loader's first iteration after loading ends at once (the epoch had
    ended) and begins only the sources it drew from: a mix counts every source's epoch
    when its own begins (ShardSplitter.begin_now), or the others would lag one behind.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> Any:
        return mixed(two, seed=5).to_tuple("__source__", "__key__")

    persistent = workers > 0
    reference = StatefulDataLoader(
        make(), batch_size=None, num_workers=workers, persistent_workers=persistent
    )
    epochs = [[tuple(x) for x in reference] for _ in range(2)]
    first = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    assert [tuple(x) for x in first] == epochs[0]
    state = first.state_dict()
    second = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    second.load_state_dict(state)
    assert [tuple(x) for x in second] == epochs[1]


def test_epoch_size_with_even_sources_gives_every_worker_as_many(
    two: tuple[Dataset, Dataset],
) -> None:
    """even=True sources (DDP): epoch_size 101 over 2 workers is 50 each."""
    a, b = two
    for url in [*a.urls, *b.urls]:
        sp.write_index(url)

    def even(data: Dataset) -> Any:
        return sp.list_shards(data.urls).split_shards(seed=1, even=True).open_tar()

    pipe = sp.mix({"a": even(a), "b": even(b)}, epoch_size=101, seed=2)
    assert len(DataLoader(pipe, batch_size=None, num_workers=2)) == 100
    got = keyed(loader(pipe))
    assert len(got) == 100
    odd = sp.mix({"a": source(a), "b": source(b)}, epoch_size=101, seed=2)
    assert len(keyed(loader(odd))) == 101


def _sources(samples: Any) -> Counter[str]:
    return Counter(name for name, _ in keyed(samples))


@pytest.mark.parametrize("kind", ["plain", "epoch_size", "limit", "cycle"])
@pytest.mark.parametrize("into", [1, 3])
def test_a_checkpoint_before_a_sources_first_draw_of_an_epoch(
    two: tuple[Dataset, Dataset], kind: str, into: int
) -> None:
    """Epoch 1, a few samples in, one source not drawn yet: resumed, it is read in full.

    Its reading still held epoch 0's end; the state must be the epoch it was begun for.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    options: dict[str, Any] = {"weights": {"a": 1, "b": 19}, "seed": 9}
    if kind == "epoch_size":
        options["epoch_size"] = 700
    a, b = two

    def make() -> Any:
        if kind in ("limit", "cycle"):  # a count in the source: its epoch's start too
            first = source(a).limit_samples(50) if kind == "limit" else source(a).cycle_epochs(1)
            pipe = sp.mix({"a": first, "b": source(b, seed=2)}, **options)
        else:
            pipe = mixed(two, **options)
        return StatefulDataLoader(pipe, batch_size=None, num_workers=0)

    reference = make()
    list(reference)
    whole = keyed(reference)  # epoch 1
    first = make()
    list(first)
    it = iter(first)
    before = keyed(next(it) for _ in range(into))
    assert "a" not in {name for name, _ in before}  # a is not drawn yet
    state = first.state_dict()
    second = make()
    second.load_state_dict(state)
    assert before + keyed(second) == whole


def test_a_source_spent_before_the_checkpoint_reads_the_next_epoch_whole(
    two: tuple[Dataset, Dataset],
) -> None:
    """Resumed one sample before the epoch's end, iterated plainly: the next epoch is whole.

    The spent source is not read again in the resumed epoch; its loaded state is dropped
    when the mix's epoch ends, not carried into the next one.
    """
    first = mixed(two, seed=5)
    samples = iter(first)
    for _ in range(799):
        next(samples)
    state = first.state_dict()
    samples.close()
    second = mixed(two, seed=5)
    second.load_state_dict(state)
    assert len(keyed(second)) == 1
    assert _sources(second) == {"a": 600, "b": 200}


def test_a_state_with_its_keys_sorted_resumes_exactly(two: tuple[Dataset, Dataset]) -> None:
    """A checkpoint that sorts its keys (JSON sort_keys, some loaders' workers): same draws.

    A block of draws is made in the order of the weights; a restored order ("books" before
    "web") drew other blocks after the first (the same samples, in another interleaving).
    """

    def make() -> Any:
        web, books = two
        return sp.mix({"web": source(web), "books": source(books, seed=2)}, seed=4)

    whole = keyed(make())
    first = make()
    samples = iter(first)
    before = keyed(next(samples) for _ in range(23))
    state = json.loads(json.dumps(first.state_dict(), sort_keys=True))
    second = make()
    second.load_state_dict(state)
    assert before + keyed(second) == whole
