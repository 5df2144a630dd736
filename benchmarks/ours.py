"""The shardpipes rows: the ``tar_shards`` recipe, the same as chained pipes, and with shuffling.

All of them batch in the worker and hand the DataLoader ``batch_size=None``, as the
README recommends; images are decoded straight to 224 x 224 (``resize=256, crop=224``).
"""

from __future__ import annotations

from typing import Any

from rows import BATCH, COPIES, CROP, RESIZE, loader
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes.recipes import tar_shards


def _loader(pipe: Any, workers: int) -> DataLoader[Any]:
    return DataLoader(pipe, batch_size=None, num_workers=workers)


def _recipe(layout: dict[str, Any], kind: str, workers: int, buffer: int, threads: int = 0) -> Any:
    paths = layout["paths"]
    shuffle = buffer > 1
    if kind == "images":
        pipe = tar_shards(
            paths["image_shards"], shuffle=shuffle, buffer_size=buffer, seed=0,
            image="torch", resize=RESIZE, crop=CROP, batch_size=BATCH, threads=threads,
        )  # fmt: skip
    else:
        pipe = tar_shards(
            paths["small_shards"], shuffle=shuffle, buffer_size=buffer, seed=0,
            fields=("bin", "cls"), batch_size=BATCH,
        )  # fmt: skip
    return _loader(pipe, workers)


@loader("shardpipes")
def recipe(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """``tar_shards`` in shard order, no shuffle buffer (as the peer rows)."""
    return _recipe(layout, kind, workers, buffer=0)


@loader("shardpipes_threads2", ("images",))
def recipe_threads(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """``tar_shards`` decoding on 2 threads per worker (``threads=2``)."""
    return _recipe(layout, kind, workers, buffer=0, threads=2)


SHUFFLE_COPIES = COPIES["shardpipes_shuffle5000"] = 6


@loader("shardpipes_shuffle5000")
def recipe_shuffled(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """``tar_shards`` with shard shuffling and a 5,000-sample buffer: the RSS row.

    Reads the shard list 6 times over (12,000 images, 6,000 per worker with 2 workers;
    all 12,000 in one process with 0), so that the buffer fills and stays full: its peak
    RSS is what a worker holding 5,000 undecoded images costs.
    """
    repeated = {**layout, "paths": {k: v * SHUFFLE_COPIES for k, v in layout["paths"].items()
                                    if isinstance(v, list)}}  # fmt: skip
    return _recipe(repeated, kind, workers, buffer=5000)


@loader("shardpipes_chain")
def chain(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """The same pipeline written as chained pipes, one stage per step, as the README shows."""
    if kind == "images":
        pipe = (
            sp.list_shards(layout["paths"]["image_shards"])
            .split_shards()
            .open_tar()
            .decode("torch", resize=RESIZE, crop=CROP)
            .to_tuple("jpg", "cls")
        )
    else:
        pipe = (
            sp.list_shards(layout["paths"]["small_shards"])
            .split_shards()
            .open_tar()
            .decode()
            .to_tuple("bin", "cls")
        )
    return _loader(pipe.batch(BATCH).collate(), workers)
