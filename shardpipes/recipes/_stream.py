"""The tail shared by the streaming recipes: decode, pick (image, label), transform."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Mapper

from shardpipes._core.handlers import Handler
from shardpipes.pipes.decode import SampleDecoder
from shardpipes.pipes.fields import TupleMaker
from shardpipes.pipes.shards import ShardLister, ShardSplitter
from shardpipes.pipes.tar import TarOpener

__all__ = ["IMAGE_FIELDS", "LABEL_FIELDS", "image_label_pairs", "one_tar"]

IMAGE_FIELDS = "jpg;jpeg;png;webp;bmp;ppm;pgm;pbm;pnm;gif;tif;tiff"
LABEL_FIELDS = "cls;cls2;label;index"


def image_label_pairs(
    samples: IterDataPipe[dict[str, Any]],
    *,
    image: str,
    transform: Callable[[Any], Any] | None,
    handler: Handler,
) -> IterDataPipe[tuple[Any, int]]:
    """Decode samples and turn them into ``(image, label)`` pairs, transforming the image."""
    pairs = TupleMaker(
        SampleDecoder(samples, image, handler=handler), IMAGE_FIELDS, LABEL_FIELDS, handler=handler
    )
    if transform is None:
        return pairs
    return Mapper(pairs, transform, input_col=0)


def one_tar(
    url: str,
    *,
    index: bool | Mapping[str, str],
    image: str,
    transform: Callable[[Any], Any] | None,
    storage_options: Mapping[str, Any] | None,
    handler: Handler,
) -> IterDataPipe[tuple[Any, int]]:
    """One tar split across workers by sample (streamed, or by index): (image, label) pairs."""
    if not isinstance(url, str):
        msg = f"url must be one URL string (got {type(url).__name__}); use tar_shards for several"
        raise TypeError(msg)
    shards = ShardSplitter(ShardLister(url, storage_options=storage_options))
    samples = TarOpener(shards, storage_options=storage_options, handler=handler, index=index)
    return image_label_pairs(samples, image=image, transform=transform, handler=handler)
