"""The ``indexed_tar`` recipe: one big tar, each worker reading only its own byte range."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardpipes.pipes.resumable import Resumable
from shardpipes.recipes._common import Options, one_tar

__all__ = ["indexed_tar"]


def indexed_tar(
    url: str | Mapping[str, str],
    *,
    weights: Mapping[str, float] | None = None,
    index: str | None = None,
    transform: Callable[[Any], Any] | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    even: bool = False,
    **options: Any,
) -> Resumable:
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
        batch_size: Collate batches of this many pairs in the worker (default: pairs).
        drop_last: Drop each worker's last, shorter batch.
        even: As for :func:`~shardpipes.recipes.tar_shards`: the same number of samples
            on every worker and rank, fewer than ``total workers`` dropped per epoch.
        **options: The reading options (:class:`~shardpipes.ReadOptions`, one
            ``handler`` for every stage; ``stats()`` counts what it skipped; ``cache_dir``:
            each worker's part fills it, block by block) and the decoding options
            (:class:`~shardpipes.DecodeOptions`: ``image``, ``resize``, ``crop``,
            ``threads``…).

    Returns:
        A pipe to hand to a DataLoader with any ``num_workers``.
    """
    if index is not None and isinstance(url, Mapping):
        msg = "with a dict of tars, each one's index is its .idx sidecar: leave index=None"
        raise TypeError(msg)
    if index is not None and not isinstance(index, str):
        msg = f"index must be the URL of the index sidecar, or None (got {index!r})"
        raise TypeError(msg)
    given = Options.of("indexed_tar", indexed_tar, options)
    where = {url: index} if index is not None and isinstance(url, str) else True
    return one_tar(
        url, given, index=where, even=even, weights=weights, transform=transform,
        batch_size=batch_size, drop_last=drop_last,
    )  # fmt: skip
