"""The ``indexed_tar`` recipe: one big tar, each worker reading only its own byte range."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterDataPipe

from shardpipes.pipes.reader import ReadOptions, check_options
from shardpipes.recipes._stream import one_tar

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["indexed_tar"]


def indexed_tar(
    url: str | Mapping[str, str],
    *,
    weights: Mapping[str, float] | None = None,
    index: str | None = None,
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
    """Stream (image, label) pairs from one big tar split by an index, as tfrecord does.

    The index lists each sample's byte range; worker ``k`` of ``m`` reads one contiguous
    block of samples with a single ranged read, so no byte is read twice across workers.
    ``shardpipes index URL`` writes the index as the sidecar ``URL.idx``; without one, each
    worker builds it on the fly by scanning the headers (seeking over member data, so cheap
    on local disk; on a bucket it costs a read of the headers' blocks).

    Args:
        url: The tar's URL (any fsspec filesystem; not gzip-compressed); or a dict of
            name → URL, to mix several tars by ``weights`` (see ``tar_images``).
        weights: With a dict of tars: name → weight (default 1 each).
        index: The index URL; default the sidecar ``url + ".idx"``, or built on the fly
            (with a dict of tars: their sidecars).
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
    if index is not None and isinstance(url, Mapping):
        msg = "with a dict of tars, each one's index is its .idx sidecar: leave index=None"
        raise TypeError(msg)
    if index is not None and not isinstance(index, str):
        msg = f"index must be the URL of the index sidecar, or None (got {index!r})"
        raise TypeError(msg)
    check_options("indexed_tar", options, indexed_tar)
    return one_tar(
        url,
        weights=weights,
        index={url: index} if index is not None and isinstance(url, str) else True,
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
