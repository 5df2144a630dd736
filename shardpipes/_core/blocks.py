"""The block split (``block_shuffle``): every shard cut into blocks, dealt out at random."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardpipes._core.split import ShardPart, assign_even, check_worker, order_key, permutation
from shardpipes._core.stage import checked_int


def split_blocks(
    urls: Sequence[str],
    counts: Sequence[int],
    size: int,
    *,
    seed: int,
    epoch: int,
    total: int,
    worker: int,
    even: bool = False,
    pass_: int = 0,
) -> list[ShardPart]:
    """The block split: every shard cut into blocks of ``size`` samples, dealt out at random.

    The block shuffle (as MosaicML Streaming's): the blocks of all shards are permuted by
    ``(seed, epoch)`` and worker ``w`` of ``total`` reads every ``total``-th one from
    ``w`` on (with ``even``, the even split of the permuted blocks' samples end to end), in
    that order. A sample still comes in a run of ``size`` from its shard, but every worker
    reads from every shard, so a shuffle buffer a few blocks long holds samples of many
    shards — with shards written in class order, of every class. Each block is one ranged
    read.

    Args:
        urls: The shard list.
        counts: The sample count of each shard.
        size: Samples per block, at least 1.
        seed: The shard-order seed.
        epoch: The epoch.
        total: Total workers (DataLoader workers × ranks).
        worker: This worker's global index.
        even: Every worker reads ``N // total`` samples (the rest are nobody's).
        pass_: The pass within the epoch (``cycle_epochs``): each has its own order.

    Example:
        >>> blocks = [split_blocks(["a", "b"], [4, 3], 2, seed=0, epoch=0, total=2, worker=w)
        ...           for w in range(2)]
        >>> sorted((p.url, p.start, p.stop) for p in blocks[0] + blocks[1])
        [('a', 0, 2), ('a', 2, 4), ('b', 0, 2), ('b', 2, 3)]
    """
    checked_int(size, "the block size")
    check_worker(total, worker)
    per_shard = np.asarray(counts, dtype=np.int64)
    n_blocks = -(-per_shard // size)  # ceil
    shard = np.repeat(np.arange(len(per_shard)), n_blocks)
    first = np.cumsum(n_blocks) - n_blocks  # each shard's first block
    start = (np.arange(len(shard)) - np.repeat(first, n_blocks)) * size
    stop = np.minimum(start + size, per_shard[shard])
    order = permutation(len(shard), f"blocks:{order_key(seed, epoch, pass_)}")
    if not even:
        mine = order[worker::total]
        return [ShardPart(urls[shard[i]], start=int(start[i]), stop=int(stop[i])) for i in mine]
    sizes = (stop - start)[order]
    out = []
    for i, a, b in assign_even(sizes, total, worker, ends=np.cumsum(sizes)):
        j = order[i]
        out.append(ShardPart(urls[shard[j]], start=int(start[j] + a), stop=int(start[j] + b)))
    return out
