"""Shard lists: listing shard URLs, and splitting them across workers and ranks."""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterDataPipe, functional_datapipe
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe

from shardpipes import fs
from shardpipes._core.braces import expand_braces
from shardpipes._core.split import ShardPart, assign
from shardpipes.errors import NoShardsError

__all__ = ["ShardLister", "ShardSplitter"]


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

    Takes the place of ``sharding_filter`` (torch's DataLoader calls its
    ``apply_sharding`` with the total number of workers and this worker's index). With at
    least as many shards as workers, each worker gets whole shards; with fewer, the workers
    that share a shard each read one part of its samples, so 4 workers on 1 shard still see
    every sample exactly once (see :mod:`shardpipes._core.split`). Yields
    :class:`~shardpipes._core.split.ShardPart` items for ``open_tar``.

    Shard order: with ``shuffle=True`` the list is permuted before splitting, the same way
    on every worker and rank. With ``seed`` given the order is a function of
    ``(seed, epoch)`` only (call :meth:`set_epoch` per epoch, as with
    ``DistributedSampler``); without, the DataLoader's shared seed picks it.

    Args:
        source_datapipe: A pipe of shard URLs, e.g. :class:`ShardLister`.
        shuffle: Permute the shard order.
        seed: Fixed seed for the permutation.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> parts = IterableWrapper(["a.tar", "b.tar"]).split_shards()
        >>> parts.apply_sharding(3, 2)
        >>> list(parts)
        [ShardPart(url='a.tar', part=1, parts=2)]
    """

    def __init__(
        self, source_datapipe: IterDataPipe[str], *, shuffle: bool = False, seed: int | None = None
    ) -> None:
        if seed is not None and not isinstance(seed, int):
            msg = f"seed must be an integer or None (got {seed!r})"
            raise TypeError(msg)
        super().__init__(source_datapipe)
        # not `self.shuffle`: an attribute of that name would hide torch's `.shuffle()` form
        self.shuffle_shards = shuffle
        self.seed = seed
        self.epoch = 0
        self._shared_seed: int | None = None

    def set_seed(self, seed: int) -> ShardSplitter:
        """Take the DataLoader's seed (shared by all workers and ranks) for the shard order."""
        self._shared_seed = seed
        return self

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which changes the shard order when ``seed`` is fixed."""
        self.epoch = epoch

    def _order(self, urls: list[str]) -> list[str]:
        if not self.shuffle_shards:
            return urls
        if self.seed is not None:
            seed = self.seed * 1_000_003 + self.epoch
        elif self._shared_seed is not None:
            seed = self._shared_seed
        else:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        random.Random(seed).shuffle(urls)
        return urls

    def __iter__(self) -> Iterator[ShardPart]:
        urls = self._order(list(self.source_datapipe))
        for index, part, parts in assign(len(urls), self.num_of_instances, self.instance_id):
            yield ShardPart(urls[index], part, parts)

    def __len__(self) -> int:
        n = len(self.source_datapipe)
        return len(assign(n, self.num_of_instances, self.instance_id))
