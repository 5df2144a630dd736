"""The ``tar_images`` recipe: one tar of images, streamed and split across workers by sample."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardpipes.pipes.resumable import Resumable
from shardpipes.recipes._common import Options, one_tar

__all__ = ["tar_images"]


def tar_images(
    url: str | Mapping[str, str],
    *,
    weights: Mapping[str, float] | None = None,
    transform: Callable[[Any], Any] | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    even: bool = False,
    **options: Any,
) -> Resumable:
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
    given = Options.of("tar_images", tar_images, options)
    return one_tar(
        url, given, index=False, even=even, weights=weights, transform=transform,
        batch_size=batch_size, drop_last=drop_last,
    )  # fmt: skip
