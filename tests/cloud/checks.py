"""Checks shared by the storage tests: what each simulated worker reads of an indexed shard."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import graph_settings

import shardpipes as sp
from shardpipes import fs


def indexed_reads(
    url: str, storage_options: Mapping[str, Any] | None = None, workers: int = 3
) -> tuple[list[int], list[int]]:
    """Read an indexed shard as ``workers`` DataLoader workers would, one after the other.

    Returns:
        The labels they yielded, and the bytes each read through ``shardpipes.fs``.
    """
    labels, reads = [], []
    for worker in range(workers):
        pipe = sp.recipes.indexed_tar(url, image="bytes", storage_options=storage_options)
        graph_settings.apply_sharding(pipe, workers, worker)
        fs.READ_STATS.reset()
        labels += [label for _, label in pipe]
        reads.append(fs.READ_STATS.bytes)
    return labels, reads


def about_a_third_each(reads: list[int], size: int) -> bool:
    """Whether each of 3 workers read within 20 % of a third of ``size`` bytes."""
    return all(size / 3 * 0.8 < n < size / 3 * 1.2 for n in reads)
