"""Shard lists: listing shard URLs, and splitting them across workers and ranks."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterDataPipe, functional_datapipe, get_worker_info
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes import fs
from shardpipes._core.braces import expand_braces
from shardpipes._core.split import ShardPart, global_worker, split_plan
from shardpipes.errors import NoShardsError
from shardpipes.pipes.index import Ranges, sample_count

__all__ = ["ShardLister", "ShardSplitter", "distributed", "set_epoch", "worker_placement"]


class ShardLister(IterDataPipe[str]):
    """Yield shard URLs from brace patterns and globs (source: ``shardpipes.list_shards``).

    Each pattern has its braces expanded first (``{000..127}`` keeps zero padding,
    ``{a,b}``, several groups), then each expansion holding ``*``, ``?`` or ``[…]`` is globbed
    through fsspec (``**`` recurses). The given order is kept; the files of one glob are
    sorted. URLs are resolved when iterated (in the worker), not at construction.

    Args:
        urls: One pattern or a list of patterns: local paths, ``file://``, ``memory://``,
            ``s3://``… any fsspec URL.
        storage_options: Passed unchanged to the fsspec filesystem (credentials, endpoint).

    Raises:
        NoShardsError: When iterated, if a glob matches no file; the message quotes it.

    Example:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> for i in range(3):
        ...     fs.pipe(f"/doc/train-{i:03d}.tar", b"")
        >>> list(ShardLister("memory://doc/train-{000..001}.tar"))
        ['memory://doc/train-000.tar', 'memory://doc/train-001.tar']
        >>> len(ShardLister(["memory://doc/train-*.tar"]))
        3
    """

    def __init__(
        self, urls: str | Sequence[str], *, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        patterns = [urls] if isinstance(urls, str) else urls
        if (
            not isinstance(patterns, Sequence)
            or not patterns
            or not all(isinstance(p, str) for p in patterns)
        ):
            msg = f"urls must be a string or a non-empty list of strings (got {urls!r})"
            raise TypeError(msg)
        for pattern in patterns:
            expand_braces(pattern)  # fail early on unbalanced braces
        self.urls = list(patterns)
        self.storage_options = dict(storage_options or {})

    def __iter__(self) -> Iterator[str]:
        for pattern in self.urls:
            for url in expand_braces(pattern):
                yield from self._resolve(url)

    def _resolve(self, url: str) -> list[str]:
        if not fs.has_magic(url):
            return [url]
        found = fs.glob(url, self.storage_options)
        if not found:
            msg = "no shard matches the pattern"
            raise NoShardsError(msg, url=url)
        return found

    def __len__(self) -> int:
        return sum(1 for _ in self)


@functional_datapipe("split_shards")
class ShardSplitter(ShardingFilterIterDataPipe):
    """Split shard URLs across workers × ranks, exactly once (functional name: ``split_shards``).

    Takes the place of ``sharding_filter``: torch's DataLoader calls its
    ``apply_sharding`` with the total number of workers (DataLoader workers × distributed
    ranks) and this worker's index. Iterated any other way (directly, in a training loop
    without a DataLoader, or under a loader that does not know DataPipes), it finds them
    itself from ``torch.utils.data.get_worker_info()`` and ``torch.distributed``. With at
    least as many shards as workers each worker gets whole shards; with fewer, the workers
    that share a shard each read one part of its samples, so 4 workers on 1 shard still
    see every sample exactly once. The split is :func:`~shardpipes._core.split.split_plan`
    (see :mod:`shardpipes._core.split`). Yields
    :class:`~shardpipes._core.split.ShardPart` items for ``open_tar``.

    Shard order: with ``shuffle=True`` the list is permuted before splitting, the same way
    on every worker and rank. With ``seed`` given the order is a function of
    ``(seed, epoch)`` only: call :meth:`set_epoch` each epoch, as with
    ``DistributedSampler``. Without, the DataLoader's seed (shared by its workers and,
    broadcast from rank 0, by all ranks) picks it; with no DataLoader, seed 0.

    Even split (``even=True``): every worker, hence every rank, reads the same number of
    samples, so DDP never waits on a rank that ran out. The shards' samples, end to end,
    are cut into equal blocks of ``N // total`` and the last ``N % total`` samples (fewer
    than the number of workers) are dropped for the epoch. It needs each shard's sample
    count: from its ``URL.idx`` sidecar (``shardpipes index``), else from a scan of its
    headers, done once per shard by each worker process (seeking over member data: about
    one read per member on a bucket; a ``.tar.gz`` is decompressed whole). Blocks are then
    read by byte range. A handler that skips bad samples breaks the equality.

    Args:
        source_datapipe: A pipe of shard URLs, e.g. :class:`ShardLister`.
        shuffle: Permute the shard order.
        seed: Fixed seed for the permutation.
        even: Split so that every worker reads the same number of samples.
        storage_options: Passed to the filesystem when reading indexes (``even``).
        index: Index URLs by shard URL, where not the ``URL.idx`` sidecar (``even``).

    Raises:
        ValueError: When iterated with ``even=True``, if there are fewer samples than
            workers.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> parts = IterableWrapper(["a.tar", "b.tar"]).split_shards()
        >>> parts.apply_sharding(3, 2)
        >>> list(parts)
        [ShardPart(url='a.tar', part=1, parts=2, start=0, stop=None, span=None)]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        shuffle: bool = False,
        seed: int | None = None,
        even: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        index: Mapping[str, str] | None = None,
    ) -> None:
        if seed is not None and not isinstance(seed, int):
            msg = f"seed must be an integer or None (got {seed!r})"
            raise TypeError(msg)
        super().__init__(source_datapipe)
        # not `self.shuffle`: an attribute of that name would hide torch's `.shuffle()` form
        self.shuffle_shards = shuffle
        self.seed = seed
        self.even = bool(even)
        self.storage_options = dict(storage_options or {})
        self.index = dict(index or {})
        self.epoch = 0
        self._shared_seed: int | None = None
        self._counts: dict[str, Ranges | int] = {}  # even split: ranges (or a count) by URL
        self._used: dict[str, Any] | None = None  # what the last plan was made of
        self._pinned: dict[str, Any] | None = None  # a loaded state, for the next plan

    def set_seed(self, seed: int) -> ShardSplitter:
        """Take the DataLoader's seed (shared by all workers and ranks) for the shard order."""
        self._shared_seed = seed
        return self

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which changes the shard order when ``seed`` is fixed."""
        if not isinstance(epoch, int) or epoch < 0:
            msg = f"epoch must be a non-negative int (got {epoch!r})"
            raise ValueError(msg)
        self.epoch = epoch

    def placement(self) -> tuple[int, int]:
        """Return ``(total workers, this worker's global index)`` for the next iteration."""
        if self.groups:  # apply_sharding was called: the DataLoader counted workers and ranks
            return self.num_of_instances, self.instance_id
        return worker_placement()

    def order_seed(self) -> int:
        """The seed of the shard order: ``seed``, else the DataLoader's, else 0."""
        if self.seed is not None:
            return self.seed
        return self._shared_seed if self._shared_seed is not None else 0

    def plan(self) -> list[ShardPart]:
        """This worker's parts for the epoch, in reading order."""
        return self._plan(pinned=None)

    def _plan(self, pinned: Mapping[str, Any] | None) -> list[ShardPart]:
        urls = list(self.source_datapipe)
        total, worker = self.placement()
        seed, epoch = self.order_seed(), self.epoch
        used = {
            "seed": seed, "epoch": epoch, "shards": len(urls), "digest": _digest(urls),
            "workers": total, "worker": worker, "even": self.even,
        }  # fmt: skip
        if pinned is not None:
            _check_state(pinned, used, fixed_seed=self.seed)
            seed, epoch = used["seed"], used["epoch"] = pinned["seed"], pinned["epoch"]
        counts = [self._count(url) for url in urls] if self.even else None
        parts = split_plan(
            urls, shuffle=self.shuffle_shards, seed=seed, epoch=epoch,
            num_workers=total, worker_id=worker, counts=counts,
        )  # fmt: skip
        self._used = used
        return [self._span(part) for part in parts] if self.even else parts

    def __iter__(self) -> Iterator[ShardPart]:
        pinned, self._pinned = self._pinned, None
        yield from self._plan(pinned)

    def __len__(self) -> int:
        return len(self.plan())

    def state_dict(self) -> dict[str, Any]:
        """The shard order and split of the current epoch: seed, epoch, shards, workers."""
        if self._pinned is not None:
            return dict(self._pinned)
        if self._used is not None:
            return dict(self._used)
        return {"seed": self.order_seed(), "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration use a saved epoch's shard order, after checking it.

        Raises:
            ValueError: Here if the state is malformed; when iterated, if the shard list,
                the number of workers × ranks, this worker's index, ``even`` or a fixed
                ``seed`` differ from the saved ones.
        """
        if not isinstance(state, Mapping) or not all(
            isinstance(state.get(k), int) for k in ("seed", "epoch")
        ):
            msg = f"not a split_shards state (needs int 'seed' and 'epoch'): {state!r:.200}"
            raise ValueError(msg)
        self._pinned = dict(state)

    def _count(self, url: str) -> int:
        if url not in self._counts:
            self._counts[url] = sample_count(url, self.storage_options, self.index.get(url))
        found = self._counts[url]
        return found if isinstance(found, int) else len(found)

    def _span(self, part: ShardPart) -> ShardPart:
        ranges = self._counts[part.url]
        if isinstance(ranges, int) or part.stop is None:
            return part
        return part._replace(span=(ranges[part.start][0], ranges[part.stop - 1][1]))


def _digest(urls: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(urls).encode(), usedforsecurity=False).hexdigest()[:16]


def _check_state(
    saved: Mapping[str, Any], now: Mapping[str, Any], *, fixed_seed: int | None
) -> None:
    """Raise ``ValueError`` naming the first way a saved split state differs from now."""
    if "digest" in saved and (saved["shards"], saved["digest"]) != (now["shards"], now["digest"]):
        msg = (
            f"the state was saved for another shard list ({saved['shards']} shards, digest "
            f"{saved['digest']}; now {now['shards']} shards, digest {now['digest']})"
        )
        raise ValueError(msg)
    if "workers" in saved and (saved["workers"], saved["worker"]) != (
        now["workers"],
        now["worker"],
    ):
        msg = (
            f"the state was saved by worker {saved['worker']} of {saved['workers']} (DataLoader "
            f"workers × ranks); this is worker {now['worker']} of {now['workers']}"
        )
        raise ValueError(msg)
    if fixed_seed is not None and saved["seed"] != fixed_seed:
        msg = f"the state was saved with seed {saved['seed']}; this pipe has seed={fixed_seed}"
        raise ValueError(msg)
    if saved.get("even", now["even"]) != now["even"]:
        msg = f"the state was saved with even={saved['even']}; this pipe has even={now['even']}"
        raise ValueError(msg)


def set_epoch(pipe: IterDataPipe[Any], epoch: int) -> IterDataPipe[Any]:
    """Set the epoch of every ``split_shards`` stage in a pipeline; returns ``pipe``.

    The shard order of a seeded ``split_shards`` is a function of ``(seed, epoch)``: call
    this before each epoch, as with ``DistributedSampler.set_epoch``, so that all ranks
    agree on a new order.
    """
    for stage in get_all_graph_pipes(traverse_dps(pipe)):
        if isinstance(stage, ShardSplitter):
            stage.set_epoch(epoch)
    return pipe


def distributed() -> tuple[int, int]:
    """``(world size, rank)`` of ``torch.distributed``, or ``(1, 0)`` when not initialized."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def worker_placement(ranks: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(total workers, global index)`` from the DataLoader worker and the distributed rank.

    Args:
        ranks: ``(world size, rank)`` when known (taken in the main process: a worker
            started by ``spawn`` has no process group); default :func:`distributed`.
    """
    info = get_worker_info()
    num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
    world_size, rank = ranks or distributed()
    return global_worker(world_size, rank, num_workers, worker_id)
