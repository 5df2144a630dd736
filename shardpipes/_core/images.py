"""Images: the ``image`` modes, the raster formats allowed, and decoding with resize and crop.

Images open only through Pillow's raster plugins (no EPS, which runs Ghostscript), and
Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``) is left as it is.
"""

from __future__ import annotations

import io
from typing import Any

import numpy
import PIL.Image
import PIL.ImageFile

IMAGE_MODES = ("pil", "numpy", "torch", "bytes")
IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "gif", "tif", "tiff", "webp"}
)
# Pillow plugins allowed to open a member: raster formats only (no EPS, which runs
# Ghostscript). Any of them for any image extension: a scraped "x.jpg" is often a PNG.
_IMAGE_FORMATS = ("JPEG", "PNG", "PPM", "BMP", "GIF", "TIFF", "WEBP")


#: webdataset's image specs that mean one of ours (RGB, uint8 for arrays and tensors)
IMAGE_SPECS = {"pilrgb": "pil", "rgb8": "numpy", "torchrgb8": "torch"}


def check_image_mode(image: str) -> str:
    """Validate the ``image`` argument of ``decode``; webdataset's specs are understood.

    Args:
        image: One of ``"pil"``, ``"numpy"``, ``"torch"``, ``"bytes"``, or the webdataset
            spec of one: ``"pilrgb"``, ``"rgb8"``, ``"torchrgb8"``.

    Returns:
        The mode: ``image``, or the one its spec means.

    Raises:
        ValueError: For any other value (webdataset's other specs name the way out).

    Example:
        >>> check_image_mode("rgb8")
        'numpy'
    """
    if image in IMAGE_MODES:
        return image
    if image in IMAGE_SPECS:
        return IMAGE_SPECS[image]
    msg = f"image must be one of {IMAGE_MODES} (got {image!r})"
    if isinstance(image, str) and image.lower() in _OTHER_SPECS:
        msg += (
            f": webdataset's {image!r} is not supported; shardpipes decodes images to RGB "
            "uint8 ('pil', 'numpy' as rgb8, 'torch' as torchrgb8): convert after, e.g. "
            "with map_fields, or give a decoder of yours for the extension (decode(jpg=f), "
            "f taking the member's bytes)"
        )
    raise ValueError(msg)


_OTHER_SPECS = frozenset(
    {"l8", "rgba8", "l", "rgb", "rgba", "torchl8", "torchrgba8", "torchl", "torchrgb",
     "torchrgba", "pill", "pilrgba"}
)  # fmt: skip


def check_size(resize: int | None, crop: int | None) -> None:
    """Validate the ``resize`` and ``crop`` arguments of ``decode``.

    Raises:
        ValueError: For a size that is not a positive int.
    """
    for name, value in (("resize", resize), ("crop", crop)):
        if value is not None and (not isinstance(value, int) or value < 1):
            msg = f"{name} must be a positive int or None (got {value!r})"
            raise ValueError(msg)


def decode_image(
    data: bytes, mode: str = "pil", *, resize: int | None = None, crop: int | None = None
) -> Any:
    """Decode an image to RGB: a ``PIL.Image``, a uint8 HWC array or a uint8 CHW tensor.

    With ``resize`` and ``crop`` the image comes out as torchvision's
    ``Resize(resize)`` then ``CenterCrop(crop)`` would make it (bilinear, antialiased),
    but cheaper: a JPEG is decoded straight at a reduced scale where the target allows
    it (``Image.draft``, DCT-domain downscaling by 2, 4 or 8), and only the cropped region
    is resampled. The pixels can differ from resize-then-crop by rounding.

    Args:
        data: The encoded image.
        mode: ``"pil"`` or ``"numpy"`` (the ``"torch"`` mode converts the array:
            :func:`default_decoders` takes the conversion as ``tensor``).
        resize: Scale the image so that its shorter side is this long.
        crop: Then cut the central ``crop`` x ``crop`` square (padded with black where the
            image is smaller, as torchvision does).

    Returns:
        The decoded image.

    Example:
        >>> import io, PIL.Image
        >>> png = io.BytesIO()
        >>> PIL.Image.new("RGB", (640, 480), "red").save(png, format="PNG")
        >>> decode_image(png.getvalue(), "numpy", resize=256, crop=224).shape
        (224, 224, 3)
        >>> decode_image(png.getvalue(), resize=240).size
        (320, 240)
    """
    opened = PIL.Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS)
    if resize is not None or crop is not None:
        image = _fit(opened, resize, crop)
    else:
        opened.load()
        image = opened
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    if mode == "pil":
        return rgb
    if mode != "numpy":
        msg = f"mode must be 'pil' or 'numpy' (got {mode!r})"
        raise ValueError(msg)
    array = numpy.asarray(rgb)
    return array.copy() if not array.flags.writeable else array


def _fit(image: PIL.ImageFile.ImageFile, resize: int | None, crop: int | None) -> PIL.Image.Image:
    """Resize (shorter side to ``resize``) then center-crop to ``crop``, in one resample."""
    width, height = image.size
    if resize is None:
        out_w, out_h = width, height
    elif width <= height:  # torchvision's rule: the longer side is truncated
        out_w, out_h = resize, int(resize * height / width)
    else:
        out_w, out_h = int(resize * width / height), resize
    if image.format == "JPEG" and image.mode in ("RGB", "L", "CMYK"):
        image.draft("RGB" if image.mode != "L" else "L", (out_w, out_h))
    image.load()
    scale_x, scale_y = out_w / image.size[0], out_h / image.size[1]
    if crop is None:
        return image.resize((out_w, out_h), PIL.Image.Resampling.BILINEAR)
    left, top = round((out_w - crop) / 2), round((out_h - crop) / 2)
    if out_w < crop or out_h < crop:  # smaller than the crop: resize, then pad as torchvision
        resized = image.resize((out_w, out_h), PIL.Image.Resampling.BILINEAR)
        return resized.crop((left, top, left + crop, top + crop))
    box = (left / scale_x, top / scale_y, (left + crop) / scale_x, (top + crop) / scale_y)
    return image.resize((crop, crop), PIL.Image.Resampling.BILINEAR, box=box)
