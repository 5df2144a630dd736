"""The ``tar_shards`` recipe: many tar shards, split by shard across workers and ranks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Shuffler

from shardpipes._core.handlers import Handler
from shardpipes.pipes.shards import ShardLister, ShardSplitter
from shardpipes.pipes.tar import TarOpener
from shardpipes.recipes._stream import image_label_pairs

__all__ = ["tar_shards"]


def tar_shards(
    urls: str | Sequence[str],
    *,
    shuffle: bool = True,
    seed: int | None = None,
    buffer_size: int = 1000,
    transform: Callable[[Any], Any] | None = None,
    image: str = "pil",
    storage_options: Mapping[str, Any] | None = None,
    handler: Handler = "raise",
) -> IterDataPipe[tuple[Any, int]]:
    """Stream (image, label) pairs from many tar shards: the notebook's one-tar-per-worker loader.

    Works with any number of shards, DataLoader workers and distributed ranks: each
    worker reads whole shards when there are enough, and a part of a shard's samples when
    there are fewer shards than workers, so every sample comes exactly once per epoch.

    Args:
        urls: Shard URLs, brace patterns or globs (``"s3://b/train-{000..099}.tar"``).
        shuffle: Shuffle the shard order and, through a buffer, the samples.
        seed: Fixed seed for the shard order (varies with ``set_epoch``); by default the
            DataLoader's seed.
        buffer_size: Samples held in the shuffle buffer (per worker); ``shuffle=False`` or
            a size below 2 turns it off.
        transform: Applied to each decoded image.
        image: ``"pil"``, ``"numpy"``, ``"torch"`` or ``"bytes"`` (see ``decode``).
        storage_options: Passed to the fsspec filesystem.
        handler: Error policy for every stage (see ``open_tar``).

    Returns:
        A pipe to hand to ``torch.utils.data.DataLoader(pipe, batch_size=…, num_workers=…)``.
    """
    shards = ShardSplitter(
        ShardLister(urls, storage_options=storage_options), shuffle=shuffle, seed=seed
    )
    samples: IterDataPipe[dict[str, Any]] = TarOpener(
        shards, storage_options=storage_options, handler=handler
    )
    if shuffle and buffer_size > 1:
        samples = Shuffler(samples, buffer_size=buffer_size)
    return image_label_pairs(samples, image=image, transform=transform, handler=handler)
