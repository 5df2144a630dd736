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
from tests.conftest import Dataset

PER_SHARD, BATCH = 9, 4


def make_pipe(urls: list[str], **options: Any) -> Any:
    """The tar_shards recipe yielding batches of (text, key), shard seed 3, buffer seed 11."""
    options = {"seed": 3, "buffer_size": 7, "batch_size": BATCH, **options}
    return sp.recipes.tar_shards(urls, fields=("txt", "__key__"), **options).set_seed(11)


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
        taken, offset, _ = state["position"]["cursor"]
        assert taken == k and offset > 0  # at the end of the k-th shard, nothing buffered
        assert state["position"]["buffer"] == []


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
    assert len(state["position"]["buffer"]) == 5000
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
    buffer_bytes = sum(end - start for _, start, end in state["position"]["buffer"])
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


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"version": 99}, "got version 99"),
        ([1, 2], "got version 'list'"),
        ({"version": 1, "splitters": []}, "has 0 split_shards stages"),
        ({"version": 1, "splitters": [{"seed": "x"}]}, "not a split_shards state"),
    ],
)
def test_foreign_state_is_refused(shards: Dataset, state: Any, match: str) -> None:
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
    assert state["position"]["cursor"][0] == 2
    again = make()
    again.load_state_dict(state)
    assert head + [s["__key__"] for s in again] == full


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"version": 2}, "not a shardpipes pipeline state"),
        ({"version": 1, "stages": []}, "has 0 reading"),
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
