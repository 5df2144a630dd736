"""What the streaming recipes share: the fields they pick, and one tar split by sample."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._retry import RetryPolicy
from shardpipes.pipes.shards import ShardLister, ShardSplitter
from shardpipes.pipes.stream import ShardStream

__all__ = ["IMAGE_FIELDS", "LABEL_FIELDS", "lister", "one_tar"]

IMAGE_FIELDS = "jpg;jpeg;png;webp;bmp;ppm;pgm;pbm;pnm;gif;tif;tiff"
LABEL_FIELDS = "cls;cls2;label;index"


def lister(
    urls: str | Sequence[str], options: Mapping[str, Any], *, check_exists: bool = True
) -> ShardLister:
    """The shard list of a recipe, with the storage options and retries of its reading options."""
    return ShardLister(
        urls,
        storage_options=options.get("storage_options"),
        check_exists=check_exists,
        retries=options.get("retries", RetryPolicy.retries),
    )


def one_tar(
    url: str,
    *,
    index: bool | Mapping[str, str],
    even: bool = False,
    **options: Any,
) -> IterDataPipe[Any]:
    """(image, label) pairs from one tar split across workers by sample (streamed or indexed).

    ``options`` go to :class:`~shardpipes.pipes.stream.ShardStream`.
    """
    if not isinstance(url, str):
        msg = f"url must be one URL string (got {type(url).__name__}); use tar_shards for several"
        raise TypeError(msg)
    storage_options = options.get("storage_options")
    shards = ShardSplitter(
        lister(url, options), even=even, storage_options=storage_options,
        index=index if isinstance(index, Mapping) else None,
    )  # fmt: skip
    return ShardStream(
        shards,
        fields=(IMAGE_FIELDS, LABEL_FIELDS),
        index=index,
        **options,
    )
