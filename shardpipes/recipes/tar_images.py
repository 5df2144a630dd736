"""The ``tar_images`` recipe: one tar of images, streamed and split across workers by sample."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.handlers import Handler
from shardpipes._core.tar import MAX_MEMBER_BYTES
from shardpipes.recipes._stream import one_tar

__all__ = ["tar_images"]


def tar_images(
    url: str,
    *,
    transform: Callable[[Any], Any] | None = None,
    image: str = "pil",
    resize: int | None = None,
    crop: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    threads: int = 0,
    even: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    handler: Handler = "raise",
    retries: int = 5,
    cache_dir: str | None = None,
    cache_size: int | str | None = None,
    max_errors: int | float | None = None,
    max_member_bytes: int = MAX_MEMBER_BYTES,
) -> IterDataPipe[Any]:
    """Stream (image, label) pairs from ONE tar: the notebook's ``TarImageDataset``, fixed.

    The notebook extracts the tar into the working directory (a tar-slip hole: a member
    named ``../../x`` lands anywhere) and, with workers, yields every image once per
    worker. Here the tar is streamed, never extracted, and the workers split it by sample:
    each reads the stream and keeps every k-th sample, seeking over the others' bytes.

    Args:
        url: The tar's URL (any fsspec filesystem).
        transform: Applied to each decoded image.
        image: ``"pil"``, ``"numpy"``, ``"torch"`` or ``"bytes"`` (see ``decode``).
        resize: Shorter image side, as for :func:`~shardpipes.recipes.tar_shards`.
        crop: Center-crop size after ``resize``.
        batch_size: Collate batches of this many pairs in the worker (default: pairs).
        drop_last: Drop each worker's last, shorter batch.
        threads: Decode threads per worker, as for :func:`~shardpipes.recipes.tar_shards`.
        even: As for :func:`~shardpipes.recipes.tar_shards`: the same number of samples
            on every worker and rank, fewer than ``total workers`` dropped per epoch.
        storage_options: Passed to the fsspec filesystem.
        retries: As for :func:`~shardpipes.recipes.tar_shards`.
        cache_dir: As for :func:`~shardpipes.recipes.tar_shards` (a shard read by parts,
            with workers, is read from the cache but does not fill it).
        cache_size: As for :func:`~shardpipes.recipes.tar_shards`.
        handler: As for :func:`~shardpipes.recipes.tar_shards`; ``stats()`` counts.
        max_errors: As for :func:`~shardpipes.recipes.tar_shards`.
        max_member_bytes: As for :func:`~shardpipes.recipes.tar_shards`.

    Returns:
        A pipe to hand to a DataLoader with any ``num_workers``.
    """
    return one_tar(
        url,
        index=False,
        image=image,
        resize=resize,
        crop=crop,
        transform=transform,
        batch_size=batch_size,
        drop_last=drop_last,
        threads=threads,
        even=even,
        storage_options=storage_options,
        handler=handler,
        retries=retries,
        cache_dir=cache_dir,
        cache_size=cache_size,
        max_errors=max_errors,
        max_member_bytes=max_member_bytes,
    )
