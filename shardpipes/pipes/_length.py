"""``__len__``: how many items a pipeline yields in an epoch, where that is known exactly.

A pipeline's length is known when every shard's sample count is (its ``.idx`` sidecar:
``shardpipes index URL``), or a ``mix`` has an ``epoch_size``, and the split does not
depend on a seed the pipe cannot know yet (shards of unequal counts, shuffled by the
DataLoader's seed: give ``seed=``, or ``even=True``). It is counted per worker — the
split plan is a pure function — and each worker's batches are counted on its own
samples, so ``len(DataLoader(pipe, num_workers=W))`` is the number of batches the loader
yields on this rank. Samples that a ``handler`` skips are not foreseen.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sized
from typing import Any, NoReturn

from torch.utils.data import get_worker_info
from torch.utils.data.datapipes.iter import Batcher, Mapper

__all__ = ["loader_length", "local_length", "no_length", "source_length", "worker_length"]


def no_length(pipe: Any, why: str = "") -> NoReturn:
    """Raise torch's standard error for a pipe whose length is not known (and why)."""
    msg = f"{type(pipe).__name__} instance doesn't have valid length"
    raise TypeError(f"{msg}: {why}" if why else msg)


def source_length(pipe: Any) -> int:
    """The length of a 1:1 pipe: its source's, or torch's standard ``TypeError``."""
    if isinstance(pipe.source_datapipe, Sized):
        with contextlib.suppress(TypeError):
            return len(pipe.source_datapipe)
    no_length(pipe)


def local_length(pipe: Any) -> int:
    """Items ``pipe`` yields in an epoch here: in this DataLoader worker, or iterated directly.

    Raises:
        TypeError: The length is not known (the message says why).
    """
    from shardpipes.pipes.shards import distributed

    world, rank = distributed()
    info = get_worker_info()
    if info is None:
        return worker_length(pipe, world, rank)
    return worker_length(pipe, info.num_workers * world, info.id * world + rank)


def loader_length(pipe: Any, num_workers: int) -> int:
    """Items a DataLoader with ``num_workers`` yields from ``pipe`` in an epoch, on this rank."""
    from shardpipes.pipes.shards import distributed

    world, rank = distributed()
    workers = max(1, num_workers)
    if world == 1:  # every worker of the split: a sum that the shard order cannot change
        return worker_length(pipe, workers, None)
    return sum(worker_length(pipe, workers * world, w * world + rank) for w in range(workers))


def worker_length(pipe: Any, total: int, worker: int | None) -> int:
    """Items ``pipe`` yields in an epoch for global worker ``worker`` of ``total``.

    ``worker=None``: summed over all ``total`` workers, which for samples (not batches)
    does not depend on the shard order, so it needs no seed.

    Raises:
        TypeError: The length is not known (the message says why).
    """
    from shardpipes.pipes.decode import SampleDecoder
    from shardpipes.pipes.fields import FieldMapper, FieldRenamer, TupleMaker
    from shardpipes.pipes.flow import EpochCycler, ItemPrefetcher, SampleLimiter
    from shardpipes.pipes.mix import Mixer
    from shardpipes.pipes.shuffle import SampleShuffler
    from shardpipes.pipes.stream import ShardStream
    from shardpipes.pipes.tar import TarOpener

    if worker is None and (
        isinstance(pipe, SampleLimiter | Batcher)
        or (isinstance(pipe, ShardStream) and pipe.batch_size is not None)
        or (isinstance(pipe, Mixer) and pipe.epoch_size is not None)
    ):  # each worker's own count
        return sum(worker_length(pipe, total, w) for w in range(total))
    if isinstance(pipe, SampleLimiter):
        assert worker is not None
        if pipe.resumed(upcoming=False):  # the rest of a resumed epoch: not cut
            return worker_length(pipe.source_datapipe, total, worker)
        quota = pipe.quota(total, worker)
        try:
            return min(quota, worker_length(pipe.source_datapipe, total, worker))
        except TypeError:
            if endless(pipe.source_datapipe):
                return quota
            raise
    if isinstance(pipe, EpochCycler):
        if pipe.count is None:
            no_length(pipe, "cycle_epochs() without count never ends")
        return pipe.count * worker_length(pipe.source_datapipe, total, worker)
    if isinstance(pipe, Mixer):
        if pipe.resample:
            no_length(pipe, "resample=True: its epoch never ends")
        if pipe.epoch_size is not None:
            assert worker is not None
            return pipe._quota(total, worker)  # type: ignore[return-value]
        return sum(
            worker_length(source, total, worker)
            for name, source in pipe.sources.items()
            if pipe.weights[name] > 0
        )
    if isinstance(pipe, ShardStream):
        n = split_samples(pipe, pipe.source_datapipe, total, worker)
        return n if pipe.batch_size is None else _batches(n, pipe.batch_size, pipe.drop_last)
    if isinstance(pipe, TarOpener):
        return split_samples(pipe, pipe.source_datapipe, total, worker)
    if isinstance(
        pipe,
        SampleShuffler | SampleDecoder | TupleMaker | FieldRenamer | FieldMapper | ItemPrefetcher,
    ):
        return worker_length(pipe.source_datapipe, total, worker)
    if isinstance(pipe, Batcher):
        assert worker is not None
        n = worker_length(pipe.datapipe, total, worker)
        return _batches(n, pipe.batch_size, pipe.drop_last)
    if isinstance(pipe, Mapper):  # map, collate: one item out per item in
        return worker_length(pipe.datapipe, total, worker)
    no_length(pipe, "shardpipes cannot count what this stage yields")


def endless(pipe: Any) -> bool:
    """Whether ``pipe`` never ends an epoch.

    An endless ``cycle_epochs`` or a ``mix`` with ``resample``, looked for through the
    stages before it (not past a ``limit_samples``).
    """
    from shardpipes.pipes.flow import EpochCycler, SampleLimiter
    from shardpipes.pipes.mix import Mixer

    while pipe is not None:
        if isinstance(pipe, SampleLimiter):
            return False
        if isinstance(pipe, EpochCycler):
            return pipe.count is None
        if isinstance(pipe, Mixer):
            return pipe.resample
        pipe = getattr(pipe, "source_datapipe", getattr(pipe, "datapipe", None))
    return False


def _batches(n: int, size: int, drop_last: bool) -> int:
    return n // size if drop_last else math.ceil(n / size)


def split_samples(stage: Any, source: Any, total: int, worker: int | None) -> int:
    """Samples the ``split_shards`` stage ``source`` gives ``worker`` of ``total`` to read.

    Counted as the reading stage ``stage`` reads the parts: a part of a shard it streams
    (not indexed, or compressed) is every ``m``-th sample, not a block. ``worker=None``:
    summed over every worker, which no shard order changes.
    """
    from shardpipes.pipes.shards import ShardSplitter

    if not isinstance(source, ShardSplitter):
        no_length(stage, "its shards are not split by split_shards")
    urls = list(iter(source.source_datapipe))
    counts = shard_counts(stage, source, urls)
    if worker is None:
        return sum(_worker_samples(stage, source, urls, counts, total, w) for w in range(total))
    seeded = not source.shuffle_shards or source.even or source.seed is not None
    if total > 1 and not seeded and len(set(counts)) > 1:
        no_length(
            stage,
            "with shards of different sample counts, what each worker reads depends on the "
            "shard order, from the DataLoader's seed: give split_shards (or the recipe) a "
            "seed=, or even=True, for an exact len()",
        )
    return _worker_samples(stage, source, urls, counts, total, worker)


def _worker_samples(
    stage: Any, source: Any, urls: list[str], counts: list[int], total: int, worker: int
) -> int:
    """Samples global worker ``worker`` reads (see :func:`split_samples`)."""
    from shardpipes._core.elastic import part_indices

    resumed = source.resumed_units()
    if resumed is not None:  # the rest of an epoch resumed from another topology
        parts = source.parts_for(
            urls, seed=source.order_seed(), epoch=source.epoch, total=total, worker=worker,
            units=resumed,
        )  # fmt: skip
    else:
        parts = source.split(
            urls, counts, seed=source.order_seed(), epoch=source.epoch, total=total, worker=worker
        )
    by_url = dict(zip(urls, counts, strict=True))
    unindexed = stage.reading.reader.index is False

    def streamed(url: str) -> bool:
        return unindexed or url.endswith((".gz", ".tgz"))

    return sum(
        len(part_indices(part, by_url[part.url], streamed=streamed(part.url))) for part in parts
    )


LOOKUPS = 16  #: sidecars read at once


def shard_counts(stage: Any, source: Any, urls: list[str]) -> list[int]:
    """Each shard's sample count from its ``.idx`` sidecar, read once per process.

    Read 16 at a time, each storage call tried once: ``list(pipe)`` asks for ``len()``
    first (a length hint), and must not pay retries for it. Any failure is a
    ``TypeError`` (which ``list()`` passes over), chained to the cause.
    """
    from concurrent.futures import ThreadPoolExecutor

    from shardpipes._retry import RetryPolicy
    from shardpipes.pipes.index import read_index

    known: dict[str, int | None] = source._lengths
    once = RetryPolicy(retries=0)

    def count(url: str) -> int | None:
        ranges = read_index(
            url, storage_options=source.storage_options, index=source.index.get(url), retry=once
        )
        return None if ranges is None else len(ranges)

    missing = [url for url in dict.fromkeys(urls) if url not in known]
    try:
        with ThreadPoolExecutor(min(LOOKUPS, len(missing) or 1)) as pool:
            known.update(zip(missing, pool.map(count, missing), strict=True))
    except Exception as exc:
        msg = f"{type(stage).__name__} instance doesn't have valid length: {exc}"
        raise TypeError(msg) from exc
    unknown = next((url for url in urls if known[url] is None), None)
    if unknown is not None:
        no_length(
            stage,
            f"the sample count of {unknown} is not known: `shardpipes index URL` writes "
            "its .idx sidecar, from which len() is exact",
        )
    return [int(known[url]) for url in urls]  # type: ignore[arg-type]
