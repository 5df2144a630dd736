"""``sp.resume_from`` (issue 14 §3): the rest of an epoch on another number of workers or ranks.

Shards of uneven sizes, keys in shard order (class-ordered data looks the same to the
split), shuffle buffers on; ranks are played in one process with ``apply_sharding`` (the
numbering a DataLoader gives workers × ranks), and real ``StatefulDataLoader`` workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import graph_settings
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from tests.conftest import Dataset, write_tar

SIZES = [23, 31, 17, 40, 29]  # 140 samples


@pytest.fixture
def data(make_shards: Callable[..., Dataset]) -> Dataset:
    return make_shards(len(SIZES), SIZES)


def recipe(data: Dataset, *, even: bool = True, seed: int | None = 3, **options: Any) -> Any:
    return sp.recipes.tar_shards(
        data.urls, fields=("__key__",), seed=seed, buffer_size=8, even=even, **options
    )


def keys_of(batches: Any) -> list[str]:
    return [key for batch in batches for key in batch[0]]


def rank_run(pipe: Any, total: int, worker: int, count: int | None) -> tuple[list[str], Any]:
    """Global worker ``worker`` of ``total`` reads ``count`` samples (all: None); (keys, state).

    The state is the pipeline's (``Resumable``'s) for a chain, the recipe's own for a recipe.
    """
    graph_settings.apply_sharding(pipe, total, worker)
    samples, keys = iter(pipe), []
    for (key,) in samples:
        keys.append(key)
        if len(keys) == count:
            break
    state = sp.Resumable(pipe).state_dict()
    samples.close()
    return keys, state


def resumed_on(data: Dataset, state: Any, total: int, **options: Any) -> list[list[str]]:
    """Each of ``total`` new workers' keys, each from a new pipe resumed from ``state``."""
    return [
        rank_run(sp.resume_from(recipe(data, **options), state), total, w, None)[0]
        for w in range(total)
    ]


def flat(lists: list[list[str]]) -> list[str]:
    return [key for keys in lists for key in keys]


def check_once(data: Dataset, before: list[str], after: list[str], dropped_at_most: int) -> None:
    seen = Counter(before + after)
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) <= set(data.keys)
    assert len(data.keys) - len(seen) <= dropped_at_most


def test_two_loader_workers_resume_on_none_and_on_three(data: Dataset) -> None:
    """A StatefulDataLoader with 2 workers stopped after 7 batches; resumed with 0 and 3."""
    loader = StatefulDataLoader(recipe(data), batch_size=4, num_workers=2)
    batches = iter(loader)
    before = keys_of(next(batches) for _ in range(7))
    state = loader.state_dict()
    del batches
    for workers in (0, 3):
        pipe = sp.resume_from(recipe(data), state)
        after = keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers))
        check_once(data, before, after, dropped_at_most=2 + max(workers, 1))
        # the epoch after is whole again, on the new topology
        later = keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers))
        assert Counter(later).most_common(1)[0][1] == 1
        assert len(data.keys) - len(later) < max(workers, 1)


def test_one_ranks_state_is_enough_with_even(data: Dataset) -> None:
    """2 ranks stop after 9 samples each; rank 1's state alone resumes on 3, every one once.

    The other rank's position comes from a replay of its epoch; each new worker delivers
    as many samples.
    """
    before, states = [], []
    for rank in range(2):
        keys, state = rank_run(recipe(data), 2, rank, 9)
        before += keys
        states.append(state)
    after = resumed_on(data, states[1], 3)
    check_once(data, before, flat(after), dropped_at_most=2 + 3)
    assert len({len(keys) for keys in after}) == 1


def test_every_ranks_state_without_even(data: Dataset) -> None:
    """Without even, a list of every rank's state: nothing is dropped at all."""
    before, states = [], []
    for rank, count in enumerate((11, 4, 30)):
        keys, state = rank_run(recipe(data, even=False), 3, rank, count)
        before += keys
        states.append(state)
    after = resumed_on(data, states, 2, even=False)
    check_once(data, before, flat(after), dropped_at_most=0)
    with pytest.raises(ValueError, match=r"states of 2 of 3 workers are missing: without even"):
        sp.resume_from(recipe(data, even=False), states[0])


def test_a_resumed_epoch_resumes_again(data: Dataset) -> None:
    """Stopped while resumed: same topology with load_state_dict, or another with resume_from."""
    before, states = [], []
    for rank in range(2):
        keys, state = rank_run(recipe(data), 2, rank, 6)
        before += keys
        states.append(state)
    middle, mid_states = [], []
    for worker in range(3):
        keys, state = rank_run(sp.resume_from(recipe(data), states[0]), 3, worker, 10)
        middle += keys
        mid_states.append(state)
    # the same 3 workers go on with the plain load_state_dict
    plain = []
    for worker in range(3):
        pipe = recipe(data)
        pipe.load_state_dict(mid_states[worker])
        plain += rank_run(pipe, 3, worker, None)[0]
    check_once(data, before + middle, plain, dropped_at_most=2 + 3)
    # or 4 workers take over from one of them
    after = resumed_on(data, mid_states[2], 4)
    check_once(data, before + middle, flat(after), dropped_at_most=2 + 3 + 4)


def test_a_resumed_epoch_of_two_ranks_of_three_workers_resumes_from_one_rank(
    data: Dataset,
) -> None:
    """From one rank's loader state (its worker k is global worker 2k): nothing twice."""
    before, states = [], []
    for rank in range(2):
        keys, state = rank_run(recipe(data), 2, rank, 9)
        before += keys
        states.append(state)
    middle, mids = [], {}
    for worker, count in enumerate([2, 2, 3, 3, 4, 4]):  # 2 ranks x 3 loader workers
        keys, mids[worker] = rank_run(sp.resume_from(recipe(data), states[1]), 6, worker, count)
        middle += keys
    workers = {  # rank 0's loader state: its loader worker k is global worker k * 2
        f"worker_{k}": {"fetcher_state": {"dataset_iter_state": mids[2 * k]}} for k in range(3)
    }
    rank0 = {"_snapshot": {"_worker_snapshots": workers}}
    after = flat(resumed_on(data, rank0, 2))
    seen = Counter(before + middle + after)
    assert [key for key, n in seen.items() if n > 1] == []


def test_bad_states_are_refused(data: Dataset, make_shards: Callable[..., Dataset]) -> None:
    _, state = rank_run(recipe(data), 2, 0, 5)
    with pytest.raises(ValueError, match=r"^the state was saved with seed=3: give the pipe that"):
        sp.resume_from(recipe(data, seed=None), state)
    with pytest.raises(ValueError, match=r"^the state was saved with seed 3; this pipe has seed=4"):
        sp.resume_from(recipe(data, seed=4), state)
    _, unseeded = rank_run(recipe(data, seed=None), 2, 0, 5)
    with pytest.raises(ValueError, match=r"the job ran without a fixed seed= .*all_gather_object"):
        sp.resume_from(recipe(data, seed=None), unseeded)
    with pytest.raises(
        ValueError, match=r"pass the loader's entry \(e.g. checkpoint\['loader'\]\)"
    ):
        sp.resume_from(recipe(data), {"loader": state, "step": 10})
    other = make_shards(3, 10)
    with pytest.raises(ValueError, match="another shard list"):
        sp.resume_from(
            sp.recipes.tar_shards(other.urls, fields=("__key__",), seed=3, even=True), state
        )
    with pytest.raises(ValueError, match="saved with even=True"):
        sp.resume_from(recipe(data, even=False), state)
    with pytest.raises(
        TypeError, match=r"not a file name: load it first, e.g. torch.load\('s.pt'\)"
    ):
        sp.resume_from(recipe(data), "s.pt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not a mix state \(it has no 'sources'\)"):
        sp.resume_from(sp.mix({"a": source(data, 3)}, epoch_size=50), state)


def test_workers_that_had_not_begun_left_everything(data: Dataset) -> None:
    """Stopped after one batch (the second worker not asked yet), or before any batch."""
    loader = StatefulDataLoader(recipe(data), batch_size=4, num_workers=2)
    batches = iter(loader)
    before = keys_of([next(batches)])
    state = loader.state_dict()
    del batches
    after = resumed_on(data, state, 2)
    check_once(data, before, flat(after), dropped_at_most=2 + 2)
    assert len(flat(after)) >= len(data.keys) - len(before) - 2 - 2
    untouched = StatefulDataLoader(recipe(data), batch_size=4, num_workers=2)
    iter(untouched)
    after = resumed_on(data, untouched.state_dict(), 3)
    check_once(data, [], flat(after), dropped_at_most=3)


def source(data: Dataset, seed: int, *, even: bool = True) -> Any:
    return (
        sp.list_shards(data.urls)
        .split_shards(shuffle=True, seed=seed, even=even)
        .open_tar()
        .shuffle_samples(buffer_size=8, seed=seed)
    )


def mixed(a: Dataset, b: Dataset, *, even: bool = True) -> Any:
    return sp.mix(
        {"a": source(a, 1, even=even), "b": source(b, 2, even=even)}, {"a": 2, "b": 1}, seed=4
    )


def mix_run(pipe: Any, total: int, worker: int, count: int | None) -> tuple[list[str], Any]:
    graph_settings.apply_sharding(pipe, total, worker)
    samples, keys = iter(pipe), []
    for sample in samples:
        keys.append(f"{sample['__source__']}:{sample['__key__']}")
        if len(keys) == count:
            break
    state = sp.Resumable(pipe).state_dict()
    samples.close()
    return keys, state


@pytest.mark.parametrize("even", [True, False])
def test_a_mix_resumes_on_another_topology(
    make_shards: Callable[..., Dataset], tmp_path: Path, even: bool
) -> None:
    """Two sources mixed 2:1 on 2 ranks, stopped; on 3 workers each sample of each comes once.

    With even, rank 0's state alone (the draws replayed); without, every rank's.
    """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_shards(4, [21, 30, 14, 25], base=str(tmp_path / "a"))
    b = make_shards(3, [17, 12, 26], base=str(tmp_path / "b"))
    before, states = [], []
    for rank in range(2):
        keys, state = mix_run(mixed(a, b, even=even), 2, rank, 15)
        before += keys
        states.append(state)
    assert {k.split(":")[0] for k in before} == {"a", "b"}
    given = states[0] if even else states
    after = []
    for worker in range(3):
        after += mix_run(sp.resume_from(mixed(a, b, even=even), given), 3, worker, None)[0]
    everything = [f"a:{k}" for k in a.keys] + [f"b:{k}" for k in b.keys]
    seen = Counter(before + after)
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) <= set(everything)
    assert len(everything) - len(seen) <= (2 + 2 + 3 + 3 if even else 0)


def test_a_recipe_of_two_sources_resumes_under_another_loader(
    make_shards: Callable[..., Dataset], tmp_path: Path
) -> None:
    """tar_shards({"a": ..., "b": ...}) under StatefulDataLoader: 2 workers, then 1."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_shards(3, [20, 33, 15], base=str(tmp_path / "a"))
    b = make_shards(2, [24, 19], base=str(tmp_path / "b"))

    def pipe() -> Any:
        return sp.recipes.tar_shards(
            {"a": a.urls, "b": b.urls}, weights={"a": 1, "b": 2}, fields=("__source__", "__key__"),
            seed=5, even=True, buffer_size=6,
        )  # fmt: skip

    loader = StatefulDataLoader(pipe(), batch_size=5, num_workers=2)
    batches = iter(loader)
    before = [f"{s}:{k}" for _ in range(5) for s, k in zip(*next(batches), strict=True)]
    state = loader.state_dict()
    del batches
    again = StatefulDataLoader(sp.resume_from(pipe(), state), batch_size=5, num_workers=1)
    after = [f"{s}:{k}" for batch in again for s, k in zip(*batch, strict=True)]
    everything = [f"a:{k}" for k in a.keys] + [f"b:{k}" for k in b.keys]
    seen = Counter(before + after)
    assert [k for k, n in seen.items() if n > 1] == []
    assert set(seen) <= set(everything)
    assert len(everything) - len(seen) <= 2 * (2 + 1)  # each source's even split and rest


def ided(urls: list[str], **options: Any) -> Any:
    options = {"seed": 3, "buffer_size": 8, "even": True, **options}
    return sp.recipes.tar_shards(urls, fields=("__key__",), batch_size=4, **options)


def ids_of(batches: Any) -> list[str]:
    return [key for (keys,) in batches for key in keys]


@pytest.fixture
def with_gzip(make_shards: Callable[..., Dataset], tmp_path: Path) -> tuple[list[str], set[str]]:
    """Four .tar shards and one .tar.gz: (URLs, every sample's key)."""
    plain = make_shards(4, [21, 33, 18, 27])
    url = str(tmp_path / "more.tar.gz")
    write_tar(url, [(f"gz/{i:05d}.cls", b"%d" % i) for i in range(31)])
    return [*plain.urls, url], {*plain.keys, *(f"gz/{i:05d}" for i in range(31))}


@pytest.mark.parametrize("buffer_size", [0, 8])
@pytest.mark.parametrize("stop", [1, 5, 12])
def test_a_gzip_shard_resumes_elsewhere(
    with_gzip: tuple[list[str], set[str]], buffer_size: int, stop: int
) -> None:
    """A .tar.gz among the shards: its rest is read from its start (no byte ranges)."""
    urls, ids = with_gzip
    loader = StatefulDataLoader(ided(urls, buffer_size=buffer_size), batch_size=None, num_workers=2)
    batches = iter(loader)
    before = ids_of(next(batches) for _ in range(stop))
    state = loader.state_dict()
    del batches
    for workers in (1, 3):
        pipe = sp.resume_from(ided(urls, buffer_size=buffer_size), state)
        after = ids_of(StatefulDataLoader(pipe, batch_size=None, num_workers=workers))
        seen = Counter(before + after)
        assert [k for k, n in seen.items() if n > 1] == []
        assert set(seen) <= ids
        assert len(ids) - len(seen) < 2 + workers


def test_nothing_or_almost_nothing_left(data: Dataset) -> None:
    """A checkpoint at the epoch's end resumes to an empty epoch; the next one is whole."""
    loader = StatefulDataLoader(recipe(data), batch_size=4, num_workers=2)
    everything = keys_of(loader)
    state = loader.state_dict()
    for workers in (0, 3):
        pipe = sp.resume_from(recipe(data), state)
        assert keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers)) == []
        later = keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers))
        assert len(set(later)) == len(later) > len(data.keys) - 3
    assert len(everything) == len(data.keys)


def test_a_mix_whose_source_ran_out(make_shards: Callable[..., Dataset], tmp_path: Path) -> None:
    """Stopped once one source is spent: the other's rest comes, every sample once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_shards(2, [30, 26], base=str(tmp_path / "a"))
    b = make_shards(1, [6], base=str(tmp_path / "b"))
    before, states = [], []
    for rank in range(2):
        keys, state = mix_run(mixed(a, b), 2, rank, 20)
        before += keys
        states.append(state)
    assert sum(k.startswith("b:") for k in before) == 6  # b is spent
    after = []
    for worker in range(3):
        after += mix_run(sp.resume_from(mixed(a, b), states[0]), 3, worker, None)[0]
    seen = Counter(before + after)
    assert [k for k, n in seen.items() if n > 1] == []
    assert len(a.keys) + len(b.keys) - len(seen) <= 2 + 2 + 3


@pytest.mark.parametrize("name", ["tar_images", "indexed_tar"])
def test_one_tar_split_by_sample_resumes_elsewhere(
    make_shards: Callable[..., Dataset], name: str
) -> None:
    """One tar read by 2 workers (every 2nd sample when streamed, blocks when indexed)."""
    data = make_shards(1, 37, images=True)

    def pipe() -> Any:
        return sp.recipes.load(name, url=data.urls[0], image="bytes", batch_size=3)

    loader = StatefulDataLoader(pipe(), batch_size=None, num_workers=2)
    batches = iter(loader)
    before = [int(x) for _ in range(3) for x in next(batches)[1]]
    state = loader.state_dict()
    del batches
    for workers in (1, 3):
        again = StatefulDataLoader(
            sp.resume_from(pipe(), state), batch_size=None, num_workers=workers
        )
        after = [int(x) for _, labels in again for x in labels]
        assert Counter(before + after) == Counter(data.labels.values())


def limited(data: Dataset, n: int, **options: Any) -> Any:
    return recipe(data, **options).limit_samples(n)


def stopped(make: Callable[[], Any], counts: list[int | None]) -> tuple[list[str], list[Any]]:
    """Global workers ``0..len(counts)-1`` each read their count: (every key, their states)."""
    before, states = [], []
    for worker, count in enumerate(counts):
        keys, state = rank_run(make(), len(counts), worker, count)
        before += keys
        states.append(state)
    return before, states


def limited_epoch(data: Dataset, n: int, total: int, **options: Any) -> list[str]:
    """What ``total`` workers deliver of an uninterrupted limited epoch."""
    return flat([rank_run(limited(data, n, **options), total, w, None)[0] for w in range(total)])


def check_limited(whole: list[str], before: list[str], after: list[str], dropped: int) -> None:
    """Nothing more often than in the uninterrupted epoch, fewer than ``dropped`` left out.

    A sample comes once, or once per pass under ``cycle_epochs``.
    """
    seen, wanted = Counter(before + after), Counter(whole)
    assert seen - wanted == Counter()
    assert wanted.total() - seen.total() < max(dropped, 1)


@pytest.mark.parametrize("stop", [2, 9, 13])
def test_a_limited_epoch_resumes_under_another_loader(data: Dataset, stop: int) -> None:
    """limit_samples(100) of 140 on 2 workers (50 each), stopped, resumed on 0 and 3 workers.

    The rest is what the old workers would still have delivered of their 50: never a
    sample past the limit; then the epochs after give 100 // 3 per worker.
    """
    whole = limited_epoch(data, 100, 2)
    assert len(whole) == 100
    loader = StatefulDataLoader(limited(data, 100), batch_size=4, num_workers=2)
    batches = iter(loader)
    before = keys_of(next(batches) for _ in range(stop))  # 13 batches: worker 1 is done
    state = loader.state_dict()
    del batches
    for workers in (0, 3):
        pipe = sp.resume_from(limited(data, 100), state)
        after = keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers))
        check_limited(whole, before, after, dropped=workers)
        later = keys_of(StatefulDataLoader(pipe, batch_size=4, num_workers=workers))
        assert len(set(later)) == len(later) == 100 // max(workers, 1) * max(workers, 1)


def test_a_limited_epoch_from_one_ranks_state(data: Dataset) -> None:
    """2 ranks stop after 9 samples of 50 each; rank 1's state alone resumes it on 3."""
    whole = limited_epoch(data, 100, 2)
    before, states = stopped(lambda: limited(data, 100), [9, 9])
    after = [
        rank_run(sp.resume_from(limited(data, 100), states[1]), 3, w, None)[0] for w in range(3)
    ]
    check_limited(whole, before, flat(after), dropped=3)
    assert len({len(keys) for keys in after}) == 1


def test_a_limited_epoch_without_even(data: Dataset) -> None:
    """A limit of 101 over 3 ranks (at most 34, 34, 33), every rank's state: the rest, all of it.

    Without even, whole shards are split: a rank's shards may hold less than its share.
    """
    whole = limited_epoch(data, 101, 3, even=False)
    assert 90 < len(whole) <= 101
    # rank 1 had given its whole share
    before, states = stopped(lambda: limited(data, 101, even=False), [11, None, 5])
    after = flat(
        [
            rank_run(sp.resume_from(limited(data, 101, even=False), states), 2, w, None)[0]
            for w in range(2)
        ]
    )
    assert Counter(before + after) == Counter(whole)


def test_a_resumed_limited_epoch_resumes_again(data: Dataset) -> None:
    """Stopped again while resumed: on the same workers, or on 4 others."""
    whole = limited_epoch(data, 100, 2)
    before, states = stopped(lambda: limited(data, 100), [20, 20])
    middle, mid_states = [], []
    for worker in range(3):
        keys, state = rank_run(sp.resume_from(limited(data, 100), states[0]), 3, worker, 7)
        middle += keys
        mid_states.append(state)
    plain = []
    for worker in range(3):
        pipe = sp.Resumable(limited(data, 100))
        pipe.load_state_dict(mid_states[worker])
        plain += rank_run(pipe, 3, worker, None)[0]
    # a rest is the root's to hold: a bare stage refuses it, naming the way
    with pytest.raises(ValueError, match=r"rest of an epoch .*load it into sp.Resumable\(pipe\)"):
        limited(data, 100).load_state_dict(mid_states[0])
    check_limited(whole, before + middle, plain, dropped=3)
    after = [
        rank_run(sp.resume_from(limited(data, 100), mid_states[1]), 4, w, None)[0] for w in range(4)
    ]
    check_limited(whole, before + middle, flat(after), dropped=3 + 4)


def keys_in(item: Any) -> list[str]:
    """The keys of an item of any shape: a sample's tuple, a batch of them, a collated one."""
    if isinstance(item, str):
        return [item]
    if isinstance(item, dict):  # a mix's sample: both sources read the same shards here
        return [f"{item['__source__']}:{item['__key__']}"]
    return [key for part in item for key in keys_in(part)]


def run_items(pipe: Any, total: int, worker: int, count: int | None) -> tuple[list[str], Any]:
    """As ``rank_run``, for items of any shape: ``count`` items' keys, and the state."""
    graph_settings.apply_sharding(pipe, total, worker)
    items, keys = iter(pipe), []
    for n, item in enumerate(items, 1):
        keys += keys_in(item)
        if n == count:
            break
    state = sp.Resumable(pipe).state_dict()
    items.close()
    return keys, state


def mixed_sources(data: Dataset, **options: Any) -> Any:
    return sp.mix({"a": source(data, 1), "b": source(data, 2)}, seed=5, **options)


SHAPES: dict[str, Callable[[Dataset], Any]] = {
    "limit of batches": lambda data: recipe(data).batch(4).limit_samples(10),
    "limit of a mix": lambda data: mixed_sources(data).limit_samples(90),
    "mix with epoch_size": lambda data: mixed_sources(data, epoch_size=110),
    "limit with cycle_epochs": lambda data: limited(data, 60).cycle_epochs(2),
    "limit with prefetch": lambda data: limited(data, 100).prefetch_items(4),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_resume_from_takes_limits_mixes_cycles_and_prefetch(data: Dataset, shape: str) -> None:
    """2 workers stopped after 3 items each, the rest on 3: nothing twice.

    The rest is what the old workers would still have delivered (a replay on
    references), dealt over the new: with ``even`` (the recipe's here) fewer than the 3
    new workers are left out, so that each delivers as many.
    """
    make = SHAPES[shape]
    whole = [k for w in range(2) for k in run_items(make(data), 2, w, None)[0]]
    stops = [run_items(make(data), 2, w, 3) for w in range(2)]
    before = [k for keys, _ in stops for k in keys]
    states = [state for _, state in stops]
    after = [
        k for w in range(3) for k in run_items(sp.resume_from(make(data), states), 3, w, None)[0]
    ]
    assert before and after
    check_limited(whole, before, after, dropped=3)


def not_a_seventh(sample: tuple[str]) -> bool:
    return not sample[0].endswith("7")


def test_resume_from_refuses_what_a_replay_cannot_know(data: Dataset) -> None:
    """Refused, saying why: counts a filter decides, no fixed seed, a state given twice."""
    _, state = rank_run(limited(data, 100), 2, 0, 5)
    filtered = recipe(data).filter(not_a_seventh).limit_samples(100)
    with pytest.raises(ValueError, match=r"counts the items of a filter, which a replay"):
        sp.resume_from(filtered, state)
    _, unseeded = stopped(lambda: limited(data, 100, seed=None), [5, 5])
    with pytest.raises(ValueError, match=r"the job ran without a fixed seed="):
        sp.resume_from(limited(data, 100, seed=None), unseeded[0])
    with pytest.raises(ValueError, match=r"^global worker 0's state is given twice"):
        sp.resume_from(limited(data, 100, seed=None), [unseeded[0], unseeded[0]])
    with pytest.raises(ValueError, match=r"saved with limit_samples\(n=100\); this pipe has limit"):
        sp.resume_from(limited(data, 120), state)
    with pytest.raises(ValueError, match=r"not a mix state|saved for a mix"):
        sp.resume_from(mixed_sources(data), state)


def stopped_loader(make: Callable[[], Any], *, workers: int, items: int) -> Any:
    """The state of a StatefulDataLoader of samples over ``make()`` after ``items`` of them."""
    loader = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    samples = iter(loader)
    for _ in range(items):
        next(samples)
    return loader.state_dict()


@pytest.mark.parametrize("limit", [None, 100])
def test_len_of_a_resumed_epoch_is_what_it_yields(data: Dataset, limit: int | None) -> None:
    """len() of the loader resumed elsewhere: the samples of the rest, not a whole epoch.

    (Batched by the DataLoader, torch divides one total by the batch size; samples here.)
    """
    for url in data.urls:
        sp.write_index(url)

    def make() -> Any:
        return recipe(data) if limit is None else limited(data, limit)

    state = stopped_loader(make, workers=2, items=21)
    for workers in (0, 3):
        again = StatefulDataLoader(
            sp.resume_from(make(), state), batch_size=None, num_workers=workers
        )
        expected = len(again)
        assert expected == len(list(again)) <= len(data.keys) - 21


def test_a_limited_rest_near_n_is_not_cut_by_the_new_shares(data: Dataset) -> None:
    """A rest of 100 of limit 101, without even: not cut by the new workers' shares of n.

    It is dealt 33/33/34, their shares of 101 are 34/34/33; nothing may be lost.
    """
    whole = limited_epoch(data, 101, 1, even=False)
    before, states = stopped(lambda: limited(data, 101, even=False), [1])
    resumed = [sp.resume_from(limited(data, 101, even=False), states[0]) for _ in range(3)]
    after = flat([rank_run(pipe, 3, w, None)[0] for w, pipe in enumerate(resumed)])
    assert Counter(before + after) == Counter(whole)
    # stopped again in the resumed epoch, its rest resumes on the same 3 workers
    middle, mid_states = stopped(lambda: sp.resume_from(limited(data, 101, even=False),
                                                        states[0]), [5, 5, 40])  # fmt: skip
    plain = []
    for worker in range(3):
        pipe = sp.Resumable(limited(data, 101, even=False))
        pipe.load_state_dict(mid_states[worker])
        plain += rank_run(pipe, 3, worker, None)[0]
    assert Counter(before + middle + plain) == Counter(whole)


def test_len_counts_streamed_parts_as_read(make_shards: Callable[..., Dataset]) -> None:
    """index=False (the recipe's default), 4 workers over 2 shards: every 2nd sample each."""
    data = make_shards(2, [41, 37])
    for url in data.urls:
        sp.write_index(url)

    def make() -> Any:
        return sp.recipes.tar_shards(data.urls, fields=("__key__",), seed=3, buffer_size=8)

    fresh = StatefulDataLoader(make(), batch_size=None, num_workers=4)
    assert len(fresh) == len(list(fresh)) == 78
    state = stopped_loader(make, workers=4, items=9)
    again = StatefulDataLoader(sp.resume_from(make(), state), batch_size=None, num_workers=3)
    assert len(again) == len(list(again)) == 78 - 9
