"""The splitter: which worker reads which shard, or which part of a shard.

:func:`split_plan` is a pure function of ``(shard list, seed, epoch, world size, rank,
DataLoader workers, worker id)`` and, for the even split, the shards' sample counts. Every
worker of every rank computes the whole plan's shard order alone and agrees with the
others without talking to them:

1. **Order.** With ``shuffle``, the shard list is permuted by :func:`shard_order`, a
   function of ``(seed, epoch)`` only (the same on every rank, world size and run).
2. **Global worker.** Worker ``worker_id`` of ``num_workers`` on rank ``rank`` of
   ``world_size`` is global worker ``worker_id * world_size + rank`` of
   ``world_size * num_workers`` (the numbering torch's DataLoader uses for DataPipes).
3. **Assignment** (:func:`assign`), over the ordered list:

   * **by shard**, when there are at least as many shards as workers: worker ``w`` reads
     every shard ``i`` with ``i % total == w``, whole.
   * **by sample**, when there are fewer shards than workers: worker ``w`` reads shard
     ``w % n``, and the ``m`` workers that share one shard each take one part of its
     samples (part ``w // n`` of ``m``). Each shard has at least one worker.
   * **even** (:func:`assign_even`, needs each shard's sample count): the ordered shards'
     samples, end to end, are cut into ``total`` blocks of ``N // total`` samples; worker
     ``w`` reads block ``w`` (a run of whole shards with a part of one at either end). The
     last ``N % total`` samples (fewer than ``total``) are dropped for the epoch: every
     worker, hence every rank, yields the same number of samples.

   * **by block** (:func:`~shardpipes._core.blocks.split_blocks`, ``block_shuffle=N``,
     needs the sample counts): every shard is cut into blocks of ``N`` samples, the
     blocks of all shards are permuted by ``(seed, epoch)``, and worker ``w`` reads every
     ``total``-th from ``w`` on (with ``even``, the even split of the permuted blocks'
     samples). Every worker reads from every shard, which a small shuffle buffer mixes.

A part ``(k, m)`` of a shard is either the samples whose index ``i`` in the shard has
``i % m == k`` (streaming, no index needed) or, with an index of ``N`` samples, the
contiguous block :func:`block` ``(N, k, m)`` (one ranged read per worker). A sample range
``[start, stop)`` (the even split) is read by byte range when the shard is indexed.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class ShardPart(NamedTuple):
    """One unit of work: the samples of the shard at ``url`` that a worker reads.

    ``start``/``stop`` bound the samples by index in the shard (``stop=None``: to the
    end); of those, the worker reads part ``part`` of ``parts``. ``span`` is the byte range
    of samples ``[start, stop)`` when an index gave it, so they can be read with one
    ranged read.
    """

    url: str
    part: int = 0
    parts: int = 1
    start: int = 0
    stop: int | None = None
    span: tuple[int, int] | None = None


def shard_order(n: int, *, seed: int, epoch: int = 0) -> list[int]:
    """Return the epoch's shard order: a permutation of ``range(n)``.

    A function of ``(n, seed, epoch)`` only: numpy's legacy ``RandomState`` (Mersenne
    Twister, a stream numpy keeps frozen across versions) seeded with the SHA-256 of the
    text ``"seed:epoch"``, then ``permutation(n)``. About 2 ms for 100,000 shards.

    Example:
        >>> shard_order(5, seed=0) == shard_order(5, seed=0)
        True
        >>> sorted(shard_order(5, seed=0, epoch=1))
        [0, 1, 2, 3, 4]
    """
    return permutation(n, order_key(seed, epoch, 0)).tolist()  # type: ignore[no-any-return]


def permutation(n: int, key: str) -> np.ndarray:
    """A permutation of ``range(n)`` seeded by the text ``key`` alone (see :func:`shard_order`)."""
    digest = hashlib.sha256(key.encode()).digest()
    return np.random.RandomState(np.frombuffer(digest, dtype="<u4")).permutation(n)


def order_key(seed: int, epoch: int, pass_: int) -> str:
    """The text an order is seeded from: ``seed:epoch``, and the pass after the first."""
    return f"{seed}:{epoch}" if not pass_ else f"{seed}:{epoch}:{pass_}"


def global_worker(world_size: int, rank: int, num_workers: int, worker_id: int) -> tuple[int, int]:
    """Return ``(total workers, this worker's global index)`` as torch's DataLoader numbers them.

    Example:
        >>> global_worker(world_size=2, rank=1, num_workers=4, worker_id=3)
        (8, 7)
    """
    if world_size < 1 or not 0 <= rank < world_size:
        msg = f"rank must be in range(world_size={world_size}) (got {rank})"
        raise ValueError(msg)
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        msg = f"worker_id must be in range(num_workers={num_workers}) (got {worker_id})"
        raise ValueError(msg)
    return world_size * num_workers, worker_id * world_size + rank


def share(n: int, total: int, worker: int, *, even: bool = False) -> int:
    """Worker ``worker``'s share of ``n`` items over ``total`` workers.

    ``n // total``, the first ``n % total`` workers one more: the shares add up to ``n``.
    ``even``: ``n // total`` for every worker.
    """
    return n // total + (not even and worker < n % total)


def check_worker(total: int, worker: int) -> None:
    if total < 1 or not 0 <= worker < total:
        msg = f"worker must be in range({total}) (got {worker})"
        raise ValueError(msg)


def assign(n_shards: int, total: int, worker: int) -> list[tuple[int, int, int]]:
    """Return the ``(shard index, part, parts)`` triples that ``worker`` reads.

    Args:
        n_shards: Number of shards in the epoch's (shuffled) list.
        total: Total workers (DataLoader workers × world size), at least 1.
        worker: This worker's global index, in ``range(total)``.

    Returns:
        The assignments, in shard-list order.

    Raises:
        ValueError: If ``worker`` is not in ``range(total)``.

    Example:
        >>> assign(5, 2, 1)
        [(1, 0, 1), (3, 0, 1)]
        >>> assign(2, 5, 4)  # shard 0 is shared by workers 0, 2, 4
        [(0, 2, 3)]
    """
    check_worker(total, worker)
    if n_shards >= total:
        return [(i, 0, 1) for i in range(worker, n_shards, total)]
    if n_shards == 0:
        return []
    shard = worker % n_shards
    parts = len(range(shard, total, n_shards))
    return [(shard, worker // n_shards, parts)]


def assign_even(
    counts: Sequence[int] | np.ndarray,
    total: int,
    worker: int,
    *,
    ends: Sequence[int] | np.ndarray | None = None,
) -> list[tuple[int, int, int]]:
    """Return the ``(shard index, start, stop)`` sample ranges of ``worker`` in the even split.

    The shards' samples, end to end in list order, are cut into ``total`` blocks of
    ``sum(counts) // total``; ``worker`` reads block ``worker``. The last
    ``sum(counts) % total`` samples are nobody's. ``ends``, the running sums of
    ``counts``, may be given when planning for many workers.

    Raises:
        ValueError: If there are fewer samples than workers (some would get none), or
            ``worker`` is not in ``range(total)``.

    Example:
        >>> assign_even([3, 3, 1], 2, 0)  # 7 samples, 3 each, the 7th dropped
        [(0, 0, 3)]
        >>> assign_even([3, 3, 1], 2, 1)
        [(1, 0, 3)]
        >>> assign_even([5], 2, 1)
        [(0, 2, 4)]
    """
    check_worker(total, worker)
    if ends is None:
        ends = list(itertools.accumulate(counts))  # ends[i]: samples in shards 0..i
    n = int(ends[-1]) if len(ends) else 0
    each = n // total
    if each == 0:
        msg = (
            f"an even split needs at least one sample per worker: {n} samples in "
            f"{len(ends)} shards for {total} workers (ranks × DataLoader workers)"
        )
        raise ValueError(msg)
    first, last = worker * each, (worker + 1) * each
    out = []
    i = bisect.bisect_right(ends, first)  # the shard holding sample `first`
    while i < len(ends) and (begin := int(ends[i] - counts[i])) < last:
        start, stop = max(first - begin, 0), min(last - begin, int(counts[i]))
        if stop > start:
            out.append((i, start, stop))
        i += 1
    return out


def block(n_items: int, part: int, parts: int) -> range:
    """Return the contiguous block of ``range(n_items)`` that is part ``part`` of ``parts``.

    Block sizes differ by at most one; blocks are in order and cover the range exactly.

    Example:
        >>> [list(block(5, k, 3)) for k in range(3)]
        [[0], [1, 2], [3, 4]]
    """
    return range(n_items * part // parts, n_items * (part + 1) // parts)


def part_samples(n_samples: int, part: ShardPart) -> range:
    """The indices of the samples ``part`` reads of a shard of ``n_samples``, by blocks.

    Example:
        >>> part_samples(10, ShardPart("s.tar", 1, 2, start=2, stop=8))
        range(5, 8)
    """
    samples = range(n_samples)[part.start : part.stop]
    mine = block(len(samples), part.part, part.parts)
    return samples[mine.start : mine.stop]


def part_indices(part: ShardPart, n_samples: int, *, streamed: bool) -> range:
    """The indices of the samples ``part`` holds in a shard of ``n_samples``, as it is read.

    Part ``k`` of ``m`` is a contiguous block of an indexed shard, and every ``m``-th
    sample (from ``start + k``) of a streamed one.

    Example:
        >>> part_indices(ShardPart("s.tar", 1, 2), 6, streamed=True)
        range(1, 6, 2)
        >>> part_indices(ShardPart("s.tar", 1, 2), 6, streamed=False)
        range(3, 6)
    """
    if streamed and part.parts > 1:
        stop = n_samples if part.stop is None else min(part.stop, n_samples)
        return range(part.start + part.part, stop, part.parts)
    return part_samples(n_samples, part)


class SplitPlanner:
    """The epoch-wide half of :func:`split_plan`, computed once: order and cumulative counts.

    ``SplitPlanner(urls, ...).plan(world_size, rank, num_workers, worker_id)`` equals
    ``split_plan(urls, ..., world_size=..., ...)``; asking it for many workers (a
    simulation, or a loader that plans for all its workers) costs one shuffle in all.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        shuffle: bool = False,
        seed: int = 0,
        epoch: int = 0,
        counts: Sequence[int] | None = None,
        pass_: int = 0,
    ) -> None:
        if counts is not None and len(counts) != len(urls):
            msg = f"counts has {len(counts)} entries for {len(urls)} shards"
            raise ValueError(msg)
        self._urls = urls
        self._order = permutation(len(urls), order_key(seed, epoch, pass_)) if shuffle else None
        self._counts: np.ndarray | None = None
        self._ends: np.ndarray | None = None
        if counts is not None:
            ordered = np.asarray(counts, dtype=np.int64)
            self._counts = ordered if self._order is None else ordered[self._order]
            self._ends = np.cumsum(self._counts)

    def url(self, i: int) -> str:
        """The URL at position ``i`` of the epoch's order."""
        return self._urls[i if self._order is None else int(self._order[i])]

    def plan(
        self, world_size: int = 1, rank: int = 0, num_workers: int = 1, worker_id: int = 0
    ) -> list[ShardPart]:
        """One worker's parts, in reading order."""
        total, worker = global_worker(world_size, rank, num_workers, worker_id)
        if self._counts is None:
            n = len(self._urls)
            return [ShardPart(self.url(i), k, m) for i, k, m in assign(n, total, worker)]
        return [
            ShardPart(self.url(i), start=start, stop=stop)
            for i, start, stop in assign_even(self._counts, total, worker, ends=self._ends)
        ]


def split_plan(
    urls: Sequence[str],
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    rank: int = 0,
    num_workers: int = 1,
    worker_id: int = 0,
    counts: Sequence[int] | None = None,
) -> list[ShardPart]:
    """Return what one worker reads in one epoch: the splitter as a pure function.

    Args:
        urls: The shard list (before shuffling).
        shuffle: Permute the list by :func:`shard_order` ``(seed, epoch)`` first.
        seed: The shard-order seed, shared by every rank.
        epoch: The epoch; changes the order when ``shuffle``.
        world_size: Distributed ranks.
        rank: This rank.
        num_workers: DataLoader workers per rank (1 when there are none).
        worker_id: This DataLoader worker.
        counts: Samples per shard, by position in ``urls``: given, the split is even
            (:func:`assign_even`); the parts then carry ``start``/``stop``, no ``span``.

    Returns:
        The worker's parts, in reading order.

    Raises:
        ValueError: For a rank or worker out of range, counts of another length, or (even)
            fewer samples than workers.

    Example:
        >>> urls = [f"s{i}.tar" for i in range(3)]
        >>> [p.url for p in split_plan(urls, num_workers=2, worker_id=1)]
        ['s1.tar']
        >>> split_plan(urls, num_workers=2, worker_id=1, counts=[2, 2, 3])
        [ShardPart(url='s1.tar', part=0, parts=1, start=1, stop=2, span=None), \
ShardPart(url='s2.tar', part=0, parts=1, start=0, stop=2, span=None)]
    """
    planner = SplitPlanner(urls, shuffle=shuffle, seed=seed, epoch=epoch, counts=counts)
    return planner.plan(world_size, rank, num_workers, worker_id)
