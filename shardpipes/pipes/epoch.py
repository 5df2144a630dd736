"""The one way to choose the epoch of a pipeline: :func:`set_epoch`."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.stage import as_stage

__all__ = ["set_epoch"]


def set_epoch(pipe: IterDataPipe[Any], epoch: int) -> IterDataPipe[Any]:
    """Set the epoch of a pipeline's next iteration (every stage that takes one); returns ``pipe``.

    The shard order of a seeded ``split_shards``, seeded shuffle buffers and a mix's draws
    are functions of ``(seed, epoch)``. Without it, a new iteration after one that began
    is the next epoch; call this to choose it, e.g. before each epoch as with
    ``DistributedSampler.set_epoch``, or after loading a checkpoint.

    Raises:
        ValueError: If nothing in the pipeline takes an epoch.
    """
    stage = as_stage(pipe)
    if not stage.takes_epoch:
        msg = (
            f"{type(pipe).__name__} has no split_shards stage, so nothing in it takes an "
            "epoch: add .split_shards() after list_shards()"
        )
        raise ValueError(msg)
    stage.set_epoch(epoch)
    return pipe
