"""The ``tar_images`` recipe: one tar of images, streamed and split across workers by sample."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterDataPipe

from shardpipes.pipes.reader import ReadOptions, check_options
from shardpipes.recipes._stream import one_tar

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["tar_images"]


def tar_images(
    url: str | Mapping[str, str],
    *,
    weights: Mapping[str, float] | None = None,
    transform: Callable[[Any], Any] | None = None,
    image: str = "pil",
    resize: int | None = None,
    crop: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    threads: int = 0,
    even: bool = False,
    **options: Unpack[ReadOptions],
) -> IterDataPipe[Any]:
    """Stream (image, label) pairs from ONE tar: the notebook's ``TarImageDataset``, fixed.

    The notebook extracts the tar into the working directory (a tar-slip hole: a member
    named ``../../x`` lands anywhere) and, with workers, yields every image once per
    worker. Here the tar is streamed, never extracted, and the workers split it by sample:
    each reads the stream and keeps every k-th sample, seeking over the others' bytes.

    Args:
        url: The tar's URL (any fsspec filesystem); or a dict of name → URL, to mix
            several tars: each is split across the workers on its own, and the samples are
            drawn from them in proportion to ``weights`` until every tar is spent (see
            :func:`shardpipes.mix`).
        weights: With a dict of tars: name → weight (default 1 each).
        transform: Applied to each decoded image.
        image: ``"pil"``, ``"numpy"``, ``"torch"`` or ``"bytes"`` (see ``decode``).
        resize: Shorter image side, as for :func:`~shardpipes.recipes.tar_shards`.
        crop: Center-crop size after ``resize``.
        batch_size: Collate batches of this many pairs in the worker (default: pairs).
        drop_last: Drop each worker's last, shorter batch.
        threads: Decode threads per worker, as for :func:`~shardpipes.recipes.tar_shards`.
        even: As for :func:`~shardpipes.recipes.tar_shards`: the same number of samples
            on every worker and rank, fewer than ``total workers`` dropped per epoch.
        **options: The reading options (:class:`~shardpipes.ReadOptions`, one
            ``handler`` for every step; ``stats()`` counts what it skipped):
            ``storage_options``, ``handler``, ``max_errors``, ``retries``, ``cache_dir``
            (each worker's part fills it, block by block), ``cache_size``,
            ``max_member_bytes``, ``readahead``, ``io_concurrency``.

    Returns:
        A pipe to hand to a DataLoader with any ``num_workers``.
    """
    check_options("tar_images", options, tar_images)
    return one_tar(
        url,
        weights=weights,
        index=False,
        image=image,
        resize=resize,
        crop=crop,
        transform=transform,
        batch_size=batch_size,
        drop_last=drop_last,
        threads=threads,
        even=even,
        **options,
    )
