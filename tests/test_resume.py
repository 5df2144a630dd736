"""Mid-epoch resumption: state_dict / load_state_dict, alone and under StatefulDataLoader.

The guarantee: stop after k batches, save, build a new pipe (or loader), load, finish the
epoch — the batches before and after are those of one uninterrupted epoch, in order.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import graph_settings
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from shardpipes import fs
from tests.conftest import Dataset, state_part

PER_SHARD, BATCH = 9, 4


def make_pipe(urls: list[str], **options: Any) -> Any:
    """The tar_shards recipe yielding batches of (text, key), seed 3 (shards and buffer)."""
    options = {"seed": 3, "buffer_size": 7, "batch_size": BATCH, **options}
    return sp.recipes.tar_shards(urls, fields=("txt", "__key__"), **options)


def keys(batches: list[Any]) -> list[str]:
    return [key for batch in batches for key in batch[1]]


def resumed(make: Callable[[], Any], k: int) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """Take k batches from one pipe, save, load into a new pipe, read the rest."""
    pipe = make()
    it = iter(pipe)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(pipe.state_dict()))  # plain data: survives JSON
    again = make()
    again.load_state_dict(state)
    return head, list(again), state


@pytest.fixture
def shards(make_shards: Callable[..., Dataset]) -> Dataset:
    return make_shards(4, PER_SHARD)


OPTIONS = {
    "buffer": {},
    "no-buffer": {"buffer_size": 0},
    "threads": {"threads": 2},
    "even": {"even": True},
    "single-samples": {"batch_size": None},
}


@pytest.mark.parametrize("k", [0, 1, 2, 4, 8, 9])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_resume_gives_the_rest_of_the_epoch(shards: Dataset, name: str, k: int) -> None:
    """Before + after the restart = one uninterrupted epoch, for any stopping point."""
    options = OPTIONS[name]
    full = list(make_pipe(shards.urls, **options))
    head, rest, _ = resumed(lambda: make_pipe(shards.urls, **options), min(k, len(full)))
    batch_keys = keys if options.get("batch_size", BATCH) else lambda b: [s[1] for s in b]
    assert batch_keys(head) + batch_keys(rest) == batch_keys(full)
    assert sorted(batch_keys(full)) == sorted(shards.keys)


def test_resume_at_a_shard_boundary(shards: Dataset) -> None:
    """No buffer, batches of one shard: stopping after a shard resumes at the next one."""
    make = lambda: make_pipe(shards.urls, buffer_size=0, batch_size=PER_SHARD, shuffle=False)  # noqa: E731
    full = keys(list(make()))
    for k in (1, 2, 3):
        head, rest, state = resumed(make, k)
        assert keys(head) + keys(rest) == full
        taken, offset, _ = state_part(state, "position")["cursor"]
        assert taken == k and offset > 0  # at the end of the k-th shard, nothing buffered
        with pytest.raises(KeyError):  # buffer_size=0: no buffer stage, nothing held
            state_part(state, "buffer")


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_resume_a_part_of_one_shard(make_shards: Callable[..., Dataset], suffix: str) -> None:
    """One shard split by sample among 3 workers (streamed, gzip too): each resumes its part."""
    data = make_shards(1, 20, suffix=suffix)

    def make(worker: int) -> Callable[[], Any]:
        def build() -> Any:
            pipe = make_pipe(data.urls, buffer_size=4, batch_size=2)
            return graph_settings.apply_sharding(pipe, 3, worker)

        return build

    seen = []
    for worker in range(3):
        full = keys(list(make(worker)()))
        head, rest, _ = resumed(make(worker), 2)
        assert keys(head) + keys(rest) == full
        seen += full
    assert sorted(seen) == sorted(data.keys)


def test_state_is_small_for_a_5000_sample_buffer(make_shards: Callable[..., Dataset]) -> None:
    """A full 5,000-sample buffer is kept as references: tens of KB, not the samples."""
    data = make_shards(2, 3000)
    pipe = make_pipe(data.urls, buffer_size=5000, batch_size=100)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    assert len(state_part(state, "buffer")["buffer"]) == 5000
    size = len(json.dumps(state))
    assert size < 200_000, size  # the samples themselves are 5,000 x ~2 KB of members


def test_resume_reads_little(make_shards: Callable[..., Dataset]) -> None:
    """Stopping and resuming re-reads less than a shard plus the buffer (not what was consumed).

    Counted through ``shardpipes.fs``: bytes read by the first run up to the stop plus by
    the resumed run to the end, less the bytes of one uninterrupted epoch.
    """
    data = make_shards(6, 50)
    shard_bytes = Path(data.urls[0]).stat().st_size
    make = lambda: make_pipe(data.urls, buffer_size=20, batch_size=10)  # noqa: E731

    def counted(run: Callable[[], Any]) -> int:
        fs.READ_STATS.reset()
        run()
        return fs.READ_STATS.bytes

    full = counted(lambda: list(make()))
    pipe = make()
    it = iter(pipe)
    head = counted(lambda: [next(it) for _ in range(22)])  # 220 samples: into the 5th shard
    state = pipe.state_dict()
    again = make()
    again.load_state_dict(state)
    rest = counted(lambda: list(again))
    buffer_bytes = sum(end - start for _, start, end, _ in state_part(state, "buffer")["buffer"])
    reread = head + rest - full
    assert 0 <= reread < shard_bytes + buffer_bytes, (reread, shard_bytes, buffer_bytes)
    assert reread < 4 * shard_bytes / 2  # a fast-forward would read the 4 shards consumed


def test_state_from_another_split_is_refused(shards: Dataset) -> None:
    """A state of another shard list, seed or worker count raises, naming the difference."""
    pipe = make_pipe(shards.urls)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    cases = [
        (make_pipe(shards.urls[:3]), "another shard list"),
        (make_pipe(shards.urls, seed=4), "saved with seed 3; this pipe has seed=4"),
        (graph_settings.apply_sharding(make_pipe(shards.urls), 2, 1), "worker 0 of 1"),
        (make_pipe(shards.urls, even=True), "even=False"),
    ]
    for other, match in cases:
        other.load_state_dict(state)
        with pytest.raises(ValueError, match=match):
            list(other)


def _bad_seed(state: dict[str, Any]) -> dict[str, Any]:
    state_part(state, "position")  # the reading stage's part is there
    split = state["pipeline"]["source"]["source"]
    split["seed"] = "x"
    return state


@pytest.mark.parametrize(
    ("spoil", "match"),
    [
        (lambda s: {**s, "shardpipes": 99}, "not a shardpipes state of version 2 \\(got 99\\)"),
        (lambda s: [1, 2], "got 'list'"),
        (lambda s: {k: v for k, v in s.items() if k != "pipeline"}, "no 'pipeline'"),
        (lambda s: {**s, "pipeline": {}}, "not a shuffle_samples state"),
        (_bad_seed, "not a split_shards state"),
    ],
)
def test_foreign_state_is_refused(shards: Dataset, spoil: Callable[[Any], Any], match: str) -> None:
    """A state of another version, shape or stage is refused when loaded, naming it."""
    pipe = make_pipe(shards.urls)
    next(iter(pipe))
    state = spoil(json.loads(json.dumps(pipe.state_dict())))
    with pytest.raises(ValueError, match=match):
        make_pipe(shards.urls).load_state_dict(state)


# -- under StatefulDataLoader ------------------------------------------------------------


def loader(pipe: Any, workers: int) -> StatefulDataLoader:
    """A StatefulDataLoader whose epochs are repeatable: seeded generator and global RNG."""
    torch.manual_seed(0)  # with no workers, Resumable seeds the buffer from torch's RNG
    gen = torch.Generator().manual_seed(0)
    return StatefulDataLoader(
        sp.Resumable(pipe), batch_size=None, num_workers=workers, generator=gen
    )


def take(it: Iterator[Any], k: int) -> list[Any]:
    return [next(it) for _ in range(k)]


BOUNDARY = {"buffer_size": 0, "batch_size": PER_SHARD, "shuffle": False}  # a batch = a shard


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    ("options", "k"),
    [({}, 1), ({}, 2), ({}, 5), ({}, 8), (BOUNDARY, 1), (BOUNDARY, 2), ({"threads": 2}, 3)],
    ids=["k1", "k2", "k5", "k8", "shard-end-1", "shard-end-2", "threads-k3"],
)
def test_stateful_dataloader_resumes_mid_epoch(
    make_shards: Callable[..., Dataset],
    caplog: pytest.LogCaptureFixture,
    workers: int,
    options: dict[str, Any],
    k: int,
) -> None:
    """StatefulDataLoader: stop after k batches, restore into a new loader, finish the epoch.

    With the buffer on (k=1, 2: inside the first shard), and with batches of one shard
    each and no buffer (stopping right at a shard boundary).
    """
    data = make_shards(5, PER_SHARD)
    full = keys(list(loader(make_pipe(data.urls, **options), workers)))
    assert sorted(full) == sorted(data.keys)
    first = loader(make_pipe(data.urls, **options), workers)
    it = iter(first)
    head = take(it, k)
    state = first.state_dict()
    del it
    second = loader(make_pipe(data.urls, **options), workers)
    second.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        rest = list(second)
    assert "fast-forward" not in caplog.text
    assert keys(head) + keys(rest) == full


def chain(urls: list[str]) -> Any:
    """The chained-pipes form, without a sample buffer: resumable stage by stage."""
    return (
        sp.list_shards(urls)
        .split_shards(shuffle=True, seed=3)
        .open_tar()
        .decode()
        .to_tuple("txt", "__key__")
        .batch(BATCH)
        .collate(sp.collate_samples)
    )


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_stateful_dataloader_resumes_a_chain(
    make_shards: Callable[..., Dataset], caplog: pytest.LogCaptureFixture, workers: int, k: int
) -> None:
    """A chain of open_tar, decode, to_tuple, batch, collate resumes through Resumable."""
    data = make_shards(5, PER_SHARD)
    full = keys(list(loader(chain(data.urls), workers)))
    assert sorted(full) == sorted(data.keys)
    first = loader(chain(data.urls), workers)
    it = iter(first)
    head = take(it, k)
    state = first.state_dict()
    del it
    second = loader(chain(data.urls), workers)
    second.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        rest = list(second)
    assert "fast-forward" not in caplog.text
    assert keys(head) + keys(rest) == full


def test_a_chain_with_torch_shuffle_is_refused(shards: Dataset) -> None:
    """A torch shuffle keeps samples a state cannot hold: refused up front, with the way out."""
    pipe = sp.list_shards(shards.urls).split_shards().open_tar().shuffle(buffer_size=10)
    with pytest.raises(ValueError, match=r"ShufflerIterDataPipe cannot be resumed.*buffer_size"):
        sp.Resumable(pipe)


def test_open_tar_resumes_on_its_own(shards: Dataset) -> None:
    """open_tar's state: the part being read and the offset of the next sample."""
    make = lambda: sp.list_shards(shards.urls).split_shards().open_tar()  # noqa: E731
    full = [s["__key__"] for s in make()]
    pipe = make()
    it = iter(pipe)
    head = [next(it)["__key__"] for _ in range(12)]  # into the second shard
    state = json.loads(json.dumps(pipe.state_dict()))
    assert state_part(state, "position")["cursor"][0] == 2
    again = make()
    again.load_state_dict(state)
    assert head + [s["__key__"] for s in again] == full


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"version": 2}, "not a shardpipes state of version 2 \\(got None\\)"),
        ({"shardpipes": 2, "pipeline": {"stages": []}}, "not a shuffle_samples state"),
    ],
)
def test_foreign_resumable_state_is_refused(shards: Dataset, state: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sp.Resumable(make_pipe(shards.urls)).load_state_dict(state)


def buffered_chain(data: Dataset, *, mixed: bool = False) -> Any:
    """A chain with a seeded shard order and shuffle buffer: each epoch its own order.

    ``mixed``: a mix of two such chains (the first 3 shards, the last 3) instead.
    """

    def source(urls: list[str]) -> Any:
        pipe = sp.list_shards(urls).split_shards(shuffle=True, seed=17).open_tar()
        return pipe.shuffle_samples(buffer_size=10, seed=3)

    if mixed:
        pipe = sp.mix({"a": source(data.urls[:3]), "b": source(data.urls[3:])}, seed=5)
    else:
        pipe = source(data.urls)
    return pipe.map(key_of)


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "stop", "persistent", "mixed"),
    [
        (2, 1, False, False),
        (3, 1, False, False),
        (3, 2, False, False),
        (2, 1, True, False),
        (0, 0, False, False),
        (2, 1, False, True),
        (0, 0, False, True),
    ],
)
def test_a_checkpoint_before_every_worker_began_the_epoch(
    make_shards: Callable[..., Dataset], workers: int, stop: int, persistent: bool, mixed: bool
) -> None:
    """In epoch 1, stopped before some worker yielded: the rest is epoch 1's, not epoch 0's.

    Such a worker's state is the one taken when its iterator was made, before it counted
    the epoch (a persistent worker, or the main process, still holds epoch 0's end).
    """
    data = make_shards(6, 15)

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(
            buffered_chain(data, mixed=mixed),
            batch_size=None,
            num_workers=workers,
            persistent_workers=persistent,
        )

    reference = loader()
    list(reference)
    epoch1 = list(reference)
    first = loader()
    list(first)
    items = iter(first)
    before = [next(items) for _ in range(stop)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert before + list(second) == epoch1


def flat(batch: Any) -> list[str]:
    return list(batch) if isinstance(batch, list) else [batch]


def epochs_with_a_checkpoint(
    make: Callable[[], Any],
    *,
    workers: int,
    epochs: int,
    stop: tuple[int, int | None],
    set_epochs: bool,
    persistent: bool = False,
) -> tuple[list[list[str]], list[list[str]]]:
    """Items of each epoch, uninterrupted, and with a checkpoint at ``stop`` resumed.

    ``stop``: (epoch, items taken in it), ``None`` items for after the epoch's end. The
    resumed run is a new pipe and loader, loaded, calling ``set_epoch`` as the first did.
    """

    def loader(pipe: Any) -> StatefulDataLoader:
        return StatefulDataLoader(
            pipe, batch_size=None, num_workers=workers, persistent_workers=persistent
        )

    def run(
        pipe: Any, first: int, load: Any = None, *, stopping: bool = False
    ) -> tuple[list[list[str]], Any]:
        out: list[list[str]] = []
        dl = loader(pipe)
        if load is not None:
            dl.load_state_dict(load)
        for epoch in range(first, epochs):
            if set_epochs:
                sp.set_epoch(pipe, epoch)
            items: list[str] = []
            if stopping and epoch == stop[0] and stop[1] is not None:
                for item in dl:
                    items += flat(item)
                    if len(items) >= stop[1]:
                        return [*out, items], json.loads(json.dumps(dl.state_dict()))
            else:
                items = [x for item in dl for x in flat(item)]
            out.append(items)
            if stopping and epoch == stop[0] and stop[1] is None:
                return out, json.loads(json.dumps(dl.state_dict()))
        return out, None

    whole, _ = run(make(), 0)
    before, state = run(make(), 0, stopping=True)
    after, _ = run(make(), stop[0] + (stop[1] is None), load=state)
    if stop[1] is not None:  # the stopped epoch's rest comes first
        before[-1] += after.pop(0) if after else []
    return whole, before + after


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "persistent"), [(2, False), (2, True), (0, False)])
def test_set_epoch_after_a_checkpoint_at_an_epoch_end(
    make_shards: Callable[..., Dataset], workers: int, persistent: bool
) -> None:
    """set_epoch(e) each epoch, a checkpoint after epoch 0 ended: epoch 1 is epoch 1.

    The loader first makes a worker iteration for the ended epoch (nothing left to read)
    and drops it; that iteration must not count an epoch of its own.
    """
    data = make_shards(6, 15)
    whole, resumed = epochs_with_a_checkpoint(
        lambda: buffered_chain(data), workers=workers, epochs=3, stop=(0, None),
        set_epochs=True, persistent=persistent,
    )  # fmt: skip
    assert resumed == whole


def recipe_mix(data: Dataset) -> Any:
    """tar_shards of a dict: two sources by weight, epochs of 50 samples (passes run over)."""
    sources = {"a": data.urls[:3], "b": data.urls[3:]}
    return sp.recipes.tar_shards(
        sources, weights={"a": 3, "b": 1}, seed=17, fields=("__key__",), buffer_size=10,
        epoch_size=50,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("set_epochs", [False, True])
@pytest.mark.parametrize("stop", [(1, 7), (1, None)])
@pytest.mark.parametrize("recipe", [False, True])
def test_a_mix_and_set_epoch_resume(
    make_shards: Callable[..., Dataset],
    set_epochs: bool,
    stop: tuple[int, int | None],
    recipe: bool,
) -> None:
    """A mix (or a recipe's, with epoch_size) resumed mid-epoch or after an epoch."""
    data = make_shards(6, 15)
    whole, resumed = epochs_with_a_checkpoint(
        (lambda: recipe_mix(data)) if recipe else (lambda: buffered_chain(data, mixed=True)),
        workers=2, epochs=3, stop=stop, set_epochs=set_epochs,
    )  # fmt: skip
    assert resumed == whole


def test_set_epoch_of_another_epoch_than_the_mix_state_is_refused(
    make_shards: Callable[..., Dataset],
) -> None:
    data = make_shards(6, 15)
    pipe = buffered_chain(data, mixed=True)
    items = iter(pipe)
    next(items)
    state = sp.Resumable(pipe).state_dict()
    again = buffered_chain(data, mixed=True)
    sp.Resumable(again).load_state_dict(state)
    sp.set_epoch(again, 3)
    with pytest.raises(ValueError, match="saved in epoch 0; this pipe was set to epoch 3"):
        list(again)


@pytest.mark.slow
@pytest.mark.parametrize("stop", [(1, 59), (1, None)])
def test_cycle_resumed_at_an_epoch_end_goes_on_to_the_next_epoch(
    make_shards: Callable[..., Dataset], stop: tuple[int, int | None]
) -> None:
    """cycle_epochs(2), stopped at epoch 1's last batch or after it: epoch 2 is epoch 2.

    The checkpoint's epoch is a pass of epoch 1 (its split epoch plus the pass stride);
    the next epoch counts on from epoch 1, not from the pass's number. At the last batch
    the cycle has ended (the batch was cut short by its end): resumed, it reads nothing,
    and the stages before it still count their epoch.
    """
    data = make_shards(4, 15)  # 60 samples: 2 passes, 120 items an epoch
    whole, resumed = epochs_with_a_checkpoint(
        lambda: buffered_chain(data).cycle_epochs(2).batch(7), workers=2, epochs=3,
        stop=(1, 120) if stop[1] else stop, set_epochs=False,
    )  # fmt: skip
    assert resumed == whole
    assert len({tuple(epoch) for epoch in whole}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mixed", [False, True])
def test_set_epoch_to_a_later_epoch_after_loading_an_ended_one(
    make_shards: Callable[..., Dataset], workers: int, mixed: bool
) -> None:
    """Loaded at epoch 0's end, then set_epoch(2): the next iteration is epoch 2.

    The ended epoch's state is dropped unread; dropping it must not undo the choice.
    """
    data = make_shards(6, 15)
    reference = StatefulDataLoader(
        buffered_chain(data, mixed=mixed), batch_size=None, num_workers=workers
    )
    epochs = [list(reference) for _ in range(3)]
    assert epochs[2] != epochs[1]
    first = StatefulDataLoader(buffered_chain(data, mixed=mixed), batch_size=None,
                               num_workers=workers)  # fmt: skip
    list(first)
    state = first.state_dict()
    pipe = buffered_chain(data, mixed=mixed)
    second = StatefulDataLoader(pipe, batch_size=None, num_workers=workers)
    second.load_state_dict(state)
    sp.set_epoch(pipe, 2)
    assert list(second) == epochs[2]


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("Resumable", sp.Resumable),
        ("resume_from", lambda given: sp.resume_from(given, {})),
        ("to_node", sp.to_node),
        ("mix \\(source 'a'\\)", lambda given: sp.mix({"a": given})),
    ],
)
def test_a_loader_or_a_list_given_for_the_pipe_is_refused_with_the_way_out(
    what: str, call: Callable[[Any], Any]
) -> None:
    """The mistakes a user makes first: the loader, or a list, where the pipe goes."""
    loader = StatefulDataLoader(sp.list_shards(["a.tar"]), batch_size=None)
    with pytest.raises(TypeError, match=rf"{what} takes a shardpipes pipeline \(got "):
        call([1, 2])
    with pytest.raises(TypeError, match=r"got StatefulDataLoader\): give it the pipe itself"):
        call(loader)
