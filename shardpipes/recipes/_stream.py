"""The tail shared by the streaming recipes: decode, pick (image, label), transform."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Mapper

from shardpipes._core.handlers import Handler
from shardpipes.pipes.decode import SampleDecoder
from shardpipes.pipes.fields import TupleMaker

__all__ = ["IMAGE_FIELDS", "LABEL_FIELDS", "image_label_pairs"]

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
