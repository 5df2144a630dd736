"""``limit_samples``, ``cycle_epochs``, ``prefetch_items`` (issue 15 §3): counted, resumable."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from shardpipes.errors import TarFormatError
from tests.conftest import Dataset, state_part
from tests.realdata import build_shards

slow = pytest.mark.slow


@pytest.fixture
def data(make_shards: Callable[..., Dataset]) -> Dataset:
    """5 shards of 40 samples."""
    return make_shards(5, 40)


def chain(data: Dataset, *, seed: int = 3) -> Any:
    """Shuffled shards, a shuffle buffer: an order that depends on the epoch."""
    return (
        sp.list_shards(data.urls)
        .split_shards(shuffle=True, seed=seed)
        .open_tar()
        .shuffle_samples(buffer_size=16, seed=seed)
    )


def keys(items: Any) -> list[str]:
    return [s["__url__"][-10:-4] + "/" + s["__key__"] for s in items]


def batch_keys(batches: Any) -> list[list[str]]:
    return [keys(batch) for batch in batches]


def interrupted(make: Callable[[], Any], workers: int, stop: int) -> tuple[list[Any], list[Any]]:
    """Batches before a checkpoint after ``stop`` of them, and after resuming from it."""
    first = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    before: list[Any] = []
    state = first.state_dict()
    for batch in first:
        before.append(batch_keys([batch])[0])
        if len(before) == stop:
            state = first.state_dict()
            break
    second = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    second.load_state_dict(state)
    return before, [batch_keys([b])[0] for b in second]


# --- limit_samples ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "end",
    [lambda p: p.limit_samples(37), lambda p: p.cycle_epochs(2), lambda p: p.prefetch_items(3)],
)
def test_the_stage_ending_a_chain_gives_the_chains_state(data: Dataset, end: Any) -> None:
    """pipe.state_dict() / load_state_dict() on a chain ending in one: the whole pipeline's.

    Its own count alone would resume the reading from the epoch's start (repeated samples).
    """
    whole = keys(end(chain(data)))
    first = end(chain(data))
    items = iter(first)
    before = keys(next(items) for _ in range(15))
    state = first.state_dict()
    items.close()
    assert state == sp.Resumable(first).state_dict()
    assert state_part(state, "position")  # the reading stage's, below the one ending it
    second = end(chain(data))
    second.load_state_dict(state)
    assert before + keys(second) == whole


def test_limit_is_the_first_n_items_of_the_epoch(data: Dataset) -> None:
    whole = keys(chain(data))
    assert keys(chain(data).limit_samples(37)) == whole[:37]
    assert keys(chain(data).limit_samples(1000)) == whole  # fewer than n: all of them


@slow
@pytest.mark.parametrize("workers", [2, 3])
def test_limit_counts_over_all_workers_each_its_share(data: Dataset, workers: int) -> None:
    """50 over 2 or 3 workers: 50 distinct samples, each worker 50 // W (the first one more).

    The loader takes the workers' items in turn; each worker reads shards of its own.
    """
    got = keys(DataLoader(chain(data).limit_samples(50), batch_size=None, num_workers=workers))
    assert len(got) == len(set(got)) == 50
    assert set(got) <= set(keys(chain(data)))
    turns = [got[w::workers] for w in range(workers)]
    assert [len(t) for t in turns] == [50 // workers + (w < 50 % workers) for w in range(workers)]
    shards = [{key.split("/")[0] for key in turn} for turn in turns]
    assert sum(map(len, shards)) == len(set().union(*shards))


def test_limit_starts_again_every_epoch(data: Dataset) -> None:
    pipe = chain(data).limit_samples(30)
    first, second = keys(pipe), keys(pipe)
    assert len(first) == len(second) == 30
    assert first != second  # the next epoch's order
    assert second == keys(sp.set_epoch(chain(data), 1))[:30]


def test_limit_length_with_indexed_shards(data: Dataset) -> None:
    for url in data.urls:
        sp.write_index(url)
    pipe = chain(data).batch(8).limit_samples(7)
    assert len(pipe) == 7
    assert len(DataLoader(chain(data).limit_samples(75), batch_size=None, num_workers=2)) == 75
    assert len(DataLoader(chain(data).limit_samples(500), batch_size=None, num_workers=2)) == 200


@slow
@pytest.mark.parametrize(("workers", "stop"), [(0, 4), (2, 5), (2, 13)])
def test_limit_resumes_where_it_stopped(data: Dataset, workers: int, stop: int) -> None:
    """Checkpoints mid-epoch and at its last batch: the same batches as uninterrupted."""

    def make() -> Any:
        return chain(data).limit_samples(105).batch(8)

    whole = batch_keys(StatefulDataLoader(make(), batch_size=None, num_workers=workers))
    assert sum(map(len, whole)) == 105
    before, after = interrupted(make, workers, stop)
    assert before + after == whole


def test_limit_refuses_a_count_that_is_not_positive(data: Dataset) -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n must be a positive int"):
            chain(data).limit_samples(bad)


# --- cycle_epochs ----------------------------------------------------------------------


def test_cycle_reads_every_sample_once_per_pass_in_a_new_order(data: Dataset) -> None:
    got = keys(chain(data).cycle_epochs(3))
    passes = [got[i * 200 : (i + 1) * 200] for i in range(3)]
    assert all(sorted(p) == sorted(data_keys(data)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3
    assert passes[0] == keys(chain(data))
    pipe = chain(data).cycle_epochs(2)
    list(pipe)
    # the passes are not the loader's epochs: the next iteration is epoch 1
    assert keys(pipe)[:200] == keys(sp.set_epoch(chain(data), 1))


def data_keys(data: Dataset) -> list[str]:
    return [
        f"{url[-10:-4]}/{key}" for url in data.urls for key in data.keys if key[1:3] == url[-6:-4]
    ]


def test_endless_cycle_under_a_limit(data: Dataset) -> None:
    pipe = chain(data).cycle_epochs().limit_samples(450)
    got = keys(pipe)
    assert len(got) == 450
    assert Counter(Counter(got).values()) == {3: 50, 2: 150}
    for url in data.urls:
        sp.write_index(url)
    assert len(chain(data).cycle_epochs().limit_samples(450)) == 450
    assert len(chain(data).cycle_epochs(2)) == 400
    with pytest.raises(TypeError, match="never ends"):
        len(chain(data).cycle_epochs())


def test_a_limit_under_a_cycle_gives_its_count_each_pass(data: Dataset) -> None:
    """limit_samples(30).cycle_epochs(3): 30 a pass, 90 in all, as len() says."""
    got = keys(chain(data).limit_samples(30).cycle_epochs(3))
    assert len(got) == 90
    passes = [got[i * 30 : (i + 1) * 30] for i in range(3)]
    assert passes[0] == keys(chain(data))[:30]
    assert len({tuple(p) for p in passes}) == 3
    for url in data.urls:
        sp.write_index(url)
    assert len(chain(data).limit_samples(30).cycle_epochs(3)) == 90


@slow
def test_cycle_with_workers_every_sample_count_times(data: Dataset) -> None:
    got = keys(DataLoader(chain(data).cycle_epochs(2), batch_size=None, num_workers=2))
    assert Counter(got) == dict.fromkeys(data_keys(data), 2)


@slow
@pytest.mark.parametrize(("workers", "stop"), [(0, 30), (2, 31), (2, 50)])
def test_cycle_resumes_in_a_later_pass(data: Dataset, workers: int, stop: int) -> None:
    """3 passes of 25 batches: stopped in pass 2 (or at the end of it), the same rest."""

    def make() -> Any:
        return chain(data).cycle_epochs(3).batch(8)

    whole = batch_keys(StatefulDataLoader(make(), batch_size=None, num_workers=workers))
    before, after = interrupted(make, workers, stop)
    assert before + after == whole


def test_an_endless_cycle_over_nothing_raises() -> None:
    with pytest.raises(ValueError, match="would spin"):
        list(IterableWrapper([]).cycle_epochs())
    assert list(IterableWrapper([]).cycle_epochs(5)) == []


# --- prefetch_items --------------------------------------------------------------------


def test_prefetch_gives_the_same_items_in_the_same_order(data: Dataset) -> None:
    assert keys(chain(data).prefetch_items(5)) == keys(chain(data))
    nested = chain(data).prefetch_items(3).batch(4).prefetch_items(2)
    assert batch_keys(nested) == batch_keys(chain(data).batch(4))


@slow
@pytest.mark.parametrize(("workers", "stops"), [(0, [1, 2, 3, 7, 24]), (2, [1, 2, 6, 11, 25])])
def test_prefetch_resumes_exactly_from_any_batch(
    data: Dataset, workers: int, stops: list[int]
) -> None:
    """Checkpoints between snapshots (items to skip) and at them: the same rest each time."""

    def make() -> Any:
        return chain(data).prefetch_items(3).batch(8).prefetch_items(2)

    whole = batch_keys(StatefulDataLoader(make(), batch_size=None, num_workers=workers))
    skips = set()
    for stop in stops:
        before, after = interrupted(make, workers, stop)
        assert before + after == whole, stop
        loader = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
        for n, _ in enumerate(loader, 1):
            if n == stop:
                skips.add(str(held(loader.state_dict())))
                break
    assert any("'skip': 1" in s or "'skip': 2" in s for s in skips)  # the skip is exercised


def held(state: dict[str, Any]) -> list[Any]:
    """The prefetch stages' skip counts in a loader's state (every worker's)."""
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if "skip" in value and "source" in value:
                found.append({"skip": value["skip"]})
            for sub in value.values():
                walk(sub)

    walk(state)
    return found


@slow
def test_prefetch_of_a_recipe_on_real_jpegs_with_workers(tmp_path: Path) -> None:
    """Mixed-size JPEG/PNG batches, 2 workers: the same batches, and resumable."""
    real = build_shards(tmp_path / "real", shards=4, per_shard=12)

    def make(prefetch: bool) -> Any:
        pipe = sp.recipes.tar_shards(real.pattern, seed=1, batch_size=5, resize=32, crop=32)
        return pipe.prefetch_items(2) if prefetch else pipe

    def labels(loader: Any) -> list[list[int]]:
        return [batch[1].tolist() for batch in loader]

    plain = labels(DataLoader(make(False), batch_size=None, num_workers=2))
    assert labels(DataLoader(make(True), batch_size=None, num_workers=2)) == plain
    first = StatefulDataLoader(make(True), batch_size=None, num_workers=2)
    before = []
    for batch in first:
        before.append(batch[1].tolist())
        if len(before) == 3:
            state = first.state_dict()
            break
    second = StatefulDataLoader(make(True), batch_size=None, num_workers=2)
    second.load_state_dict(state)
    assert before + labels(second) == plain
    assert sorted(x for b in plain for x in b) == real.labels


def test_prefetch_raises_the_readers_error_naming_the_shard(tmp_path: Path, data: Dataset) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(Path(data.urls[0]).read_bytes()[:3000] + b"\x01" * 2000)
    pipe = sp.list_shards([str(bad)]).open_tar().prefetch_items(2)
    with pytest.raises(TarFormatError, match=r"bad\.tar"):
        list(pipe)


def prefetch_threads(before: Collection[threading.Thread] = ()) -> list[threading.Thread]:
    """The prefetch threads alive, less ``before`` (an earlier test's garbage not yet collected)."""
    return [t for t in threading.enumerate() if t.name == "shardpipes-prefetch" and t not in before]


def test_stopping_early_leaves_no_thread(data: Dataset) -> None:
    before = set(prefetch_threads())
    items = iter(chain(data).prefetch_items(4))
    next(items)
    assert len(prefetch_threads(before)) == 1
    items.close()  # type: ignore[attr-defined]
    assert not prefetch_threads(before)


def test_prefetch_size_must_be_positive(data: Dataset) -> None:
    with pytest.raises(ValueError, match="size must be a positive int"):
        chain(data).prefetch_items(0)


def test_a_state_of_another_shape_is_refused(data: Dataset) -> None:
    saved = sp.Resumable(chain(data).limit_samples(5)).state_dict()
    with pytest.raises(ValueError, match=r"not a prefetch_items state \(it has no 'skip'\)"):
        sp.Resumable(chain(data).limit_samples(5).prefetch_items(2)).load_state_dict(saved)


@pytest.mark.parametrize(
    "end",
    [lambda p: p.limit_samples(150), lambda p: p.cycle_epochs(2), lambda p: p.prefetch_items(2)],
)
def test_resume_from_another_topology_takes_them(data: Dataset, end: Any) -> None:
    """Saved by 1 worker, resumed by 2 (replayed on references): the rest, each sample once."""
    whole = Counter(keys(end(chain(data))))
    first = StatefulDataLoader(end(chain(data)), batch_size=None, num_workers=0)
    items = iter(first)
    before = keys(next(items) for _ in range(37))
    state = first.state_dict()
    del items
    rest = sp.resume_from(end(chain(data)), state)
    after = keys(StatefulDataLoader(rest, batch_size=None, num_workers=2))
    assert Counter(before) + Counter(after) == whole


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (
            lambda d: sp.list_shards(d.urls).split_shards(seed=1).prefetch_items(2).open_tar(),
            "prefetch_items",
        ),
        (
            lambda d: sp.list_shards(d.urls).split_shards(seed=1).limit_samples(3).open_tar(),
            "limit_samples",
        ),
        (
            lambda d: sp.list_shards(d.urls).cycle_epochs(2).split_shards(seed=1).open_tar(),
            "cycle_epochs",
        ),
    ],
)
def test_before_open_tar_they_are_refused_for_checkpoints(
    data: Dataset, build: Callable[[Dataset], Any], name: str
) -> None:
    """There they count shards: a state cannot be taken, and the error says where they go."""
    with pytest.raises(ValueError, match=f"{name} stands before open_tar.*after open_tar"):
        StatefulDataLoader(build(data), batch_size=None, num_workers=0).state_dict()


@slow
def test_prefetch_in_workers_while_the_loader_takes_states(
    make_shards: Callable[..., Dataset],
) -> None:
    """The prefetch thread's snapshots and the worker's states walk the graph one at a time.

    Two threads walking a pipe graph at once broke torch's traversal (a class-wide
    pickling hook): "Attempt to override existing reduce_ex_hook".
    """
    data = make_shards(12, 50)
    for seed in range(3):
        pipe = chain(data, seed=seed).prefetch_items(1)
        loader = StatefulDataLoader(pipe, batch_size=None, num_workers=2)
        got = []
        for sample in loader:
            loader.state_dict()
            got.append(sample["__key__"])
        assert len(got) == 600


def test_states_from_two_threads_at_once(data: Dataset) -> None:
    """A prefetch thread and a loader take states at once: no walk of torch's to collide.

    Two threads running torch's graph traversal at once broke it (a class-wide pickling
    hook): "Attempt to override existing reduce_ex_hook".
    """
    pipe = sp.Resumable(chain(data).prefetch_items(2).batch(4))
    items = iter(pipe)
    next(items)
    failures: list[BaseException] = []

    def take() -> None:
        try:
            for _ in range(300):
                assert state_part(pipe.state_dict(), "position")
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_states_under_a_prefetch_do_not_walk_the_graph(
    data: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the loader's states nor the prefetch thread's snapshots run torch's walk.

    The loader walks the graph when it starts (torch's seeding and sharding), never again.
    """
    from torch.utils.data import graph, graph_settings

    walks = []
    real = graph.traverse_dps
    counted = lambda pipe: walks.append(1) or real(pipe)  # noqa: E731
    monkeypatch.setattr(graph, "traverse_dps", counted)
    monkeypatch.setattr(graph_settings, "traverse_dps", counted)
    loader = StatefulDataLoader(chain(data).prefetch_items(1), batch_size=None, num_workers=0)
    counts = []
    for _ in loader:
        loader.state_dict()
        counts.append(len(walks))
    assert len(counts) == 200
    assert counts[0] > 0  # the patch sees torch's own walks
    assert counts[-1] == counts[0]  # none per item or per state


@slow
def test_limit_with_even_gives_every_worker_as_many(make_shards: Callable[..., Dataset]) -> None:
    """even=True (DDP): 51 over 2 workers is 25 each, so that ranks never differ by one."""
    data = make_shards(4, 20)
    for url in data.urls:
        sp.write_index(url)
    pipe = sp.list_shards(data.urls).split_shards(even=True, seed=1).open_tar().limit_samples(51)
    got = keys(DataLoader(pipe, batch_size=None, num_workers=2))
    assert len(got) == len(set(got)) == 50
    assert len(DataLoader(pipe, batch_size=None, num_workers=2)) == 50


def test_a_new_iteration_stops_the_thread_of_one_left_early(data: Dataset) -> None:
    """The loop of epoch 0 left early, its iterator still held: epoch 1 has one thread."""
    before = set(prefetch_threads())
    pipe = chain(data).prefetch_items(4)
    first = iter(pipe)
    next(first)
    second = iter(pipe)
    next(second)
    assert len(prefetch_threads(before)) == 1
    second.close()  # type: ignore[attr-defined]
    del first


def test_another_num_workers_points_to_resume_from(data: Dataset) -> None:
    """Another num_workers is refused, with the way out: resume_from, which takes them."""
    for end in (lambda p: p.cycle_epochs(2), lambda p: p.limit_samples(50)):
        first = StatefulDataLoader(end(chain(data)), batch_size=None, num_workers=0)
        items = iter(first)
        next(items)
        state = first.state_dict()
        second = StatefulDataLoader(end(chain(data)), batch_size=None, num_workers=2)
        with pytest.raises(ValueError, match=r"saved with num_workers=0.*resume_from"):
            second.load_state_dict(state)


def test_a_state_of_another_n_or_count_is_refused(data: Dataset) -> None:
    """A count saved with limit_samples(5) (cycle_epochs(2)) cut its epoch there: not 6 (3)."""
    saved = sp.Resumable(chain(data).limit_samples(5)).state_dict()
    with pytest.raises(ValueError, match=r"saved with limit_samples\(n=5\); this pipe has limit"):
        sp.Resumable(chain(data).limit_samples(6)).load_state_dict(saved)
    saved = sp.Resumable(chain(data).cycle_epochs(2)).state_dict()
    with pytest.raises(ValueError, match=r"saved with cycle_epochs\(count=2\); this pipe has"):
        sp.Resumable(chain(data).cycle_epochs(3)).load_state_dict(saved)


def test_a_state_at_its_limit_is_still_checked_against_the_shards(data: Dataset) -> None:
    """A state saved where limit_samples' count ended the epoch reads nothing, yet is checked."""
    first = sp.Resumable(chain(data).limit_samples(6))
    items = iter(first)
    for _ in range(6):
        next(items)
    saved = first.state_dict()  # at the count: the rest of the epoch is empty
    again = sp.Resumable(chain(data).limit_samples(6))
    again.load_state_dict(saved)
    assert list(again) == []
    fewer = sp.Resumable(chain(Dataset(urls=data.urls[:4])).limit_samples(6))
    fewer.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"saved for another shard list \(5 shards"):
        list(fewer)


@slow
def test_a_state_at_its_limit_is_checked_in_the_loaders_workers(data: Dataset) -> None:
    """The same through a StatefulDataLoader with 2 workers, each at its share of the count."""
    first = StatefulDataLoader(chain(data).limit_samples(6), batch_size=None, num_workers=2)
    items = iter(first)
    for _ in range(6):
        next(items)
    saved = first.state_dict()
    fewer = chain(Dataset(urls=data.urls[:4])).limit_samples(6)
    second = StatefulDataLoader(fewer, batch_size=None, num_workers=2)
    second.load_state_dict(saved)
    with pytest.raises(ValueError, match=r"saved for another shard list \(5 shards"):
        list(second)


@slow
def test_the_pipes_own_state_beside_a_loader_with_workers_is_refused(data: Dataset) -> None:
    """Its workers read it: the main process's copy would resume the epoch from its start."""
    recipe = sp.recipes.tar_shards(data.urls, fields=("__key__",), seed=1)
    loader = StatefulDataLoader(recipe, batch_size=4, num_workers=2)
    batches = iter(loader)
    next(batches)
    with pytest.raises(ValueError, match=r"read by a DataLoader's 2 worker processes: .*loader\."):
        recipe.state_dict()
    assert loader.state_dict()  # the way out
    for _ in recipe:  # read here too, without the loader: its state is this process's
        break
    unread = sp.recipes.tar_shards(data.urls, fields=("__key__",), seed=1).state_dict()
    assert recipe.state_dict()["pipeline"] != unread["pipeline"]
    ended = chain(data).limit_samples(7)
    reader = StatefulDataLoader(ended, batch_size=None, num_workers=1)
    assert len(list(reader)) == 7
    with pytest.raises(ValueError, match=r"read by a DataLoader's 1 worker processes"):
        ended.state_dict()
    del reader  # no live loader reads it in workers: its own state again
    assert state_part(ended.state_dict(), "given") == 0  # this process read none of its 7
    again = chain(data).limit_samples(500)
    StatefulDataLoader(again, batch_size=None, num_workers=2)  # kept alive below
    keep = StatefulDataLoader(again, batch_size=None, num_workers=0)  # the newest: here
    assert again.state_dict()["shardpipes"] and keep.num_workers == 0
    alone = sp.recipes.tar_shards(data.urls, fields=("__key__",), seed=1)
    list(StatefulDataLoader(alone, batch_size=4, num_workers=0))
    assert alone.state_dict()["pipeline"] != unread["pipeline"]  # read here: its state is right


def test_a_chain_ending_in_torchs_stage_gets_its_state_from_resumable(data: Dataset) -> None:
    """A chain ending in torch's collate: sp.Resumable gives its state, as the docs show.

    torch's collate has no state_dict (its own AttributeError: shardpipes patches no
    IterDataPipe attribute).
    """
    piped = chain(data).batch(2).collate()
    with pytest.raises(AttributeError, match="state_dict"):
        piped.state_dict()
    state_part(sp.Resumable(piped).state_dict(), "position")  # the reading stage's is in it
