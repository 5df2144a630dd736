"""The splitter: which worker reads which shard, or which part of a shard.

A pure function of ``(number of shards, total workers, worker index)``, where total workers
is DataLoader workers × distributed world size. Over all worker indices the assignments
cover every sample exactly once:

* **by shard**, when there are at least as many shards as workers: worker ``w`` reads every
  shard ``i`` with ``i % total == w``, whole.
* **by sample**, when there are fewer shards than workers: worker ``w`` reads shard
  ``w % n``, and the ``m`` workers that share one shard each take one part of its samples
  (part ``w // n`` of ``m``). Each shard has at least one worker, so nothing is dropped.

A part ``(k, m)`` of a shard is either the samples whose index ``i`` in the shard has
``i % m == k`` (streaming, no index needed) or, with an index of ``N`` samples, the
contiguous block :func:`block` ``(N, k, m)`` (one ranged read per worker).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ShardPart", "assign", "block"]


class ShardPart(NamedTuple):
    """One unit of work: part ``part`` of ``parts`` of the shard at ``url``."""

    url: str
    part: int = 0
    parts: int = 1


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
    if total < 1 or not 0 <= worker < total:
        msg = f"worker must be in range({total}) (got {worker})"
        raise ValueError(msg)
    if n_shards >= total:
        return [(i, 0, 1) for i in range(worker, n_shards, total)]
    if n_shards == 0:
        return []
    shard = worker % n_shards
    parts = len(range(shard, total, n_shards))
    return [(shard, worker // n_shards, parts)]


def block(n_items: int, part: int, parts: int) -> range:
    """Return the contiguous block of ``range(n_items)`` that is part ``part`` of ``parts``.

    Block sizes differ by at most one; blocks are in order and cover the range exactly.

    Example:
        >>> [list(block(5, k, 3)) for k in range(3)]
        [[0], [1, 2], [3, 4]]
    """
    return range(n_items * part // parts, n_items * (part + 1) // parts)
