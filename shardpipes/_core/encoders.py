"""Encoding sample values to member bytes by extension, as webdataset's writer does.

A field's extension (the part after its last dot, lower-cased) says how its value is
stored; ``bytes`` and ``str`` (UTF-8) are stored as they are under any extension. A
trailing ``.gz`` gzips what the rest gives (with no time stamp). The same value always
gives the same bytes.

========================================  ==========================================
extension                                 value
========================================  ==========================================
``cls cls2 class count index inx id       an ``int`` (numpy's too), as decimal text
label``
``txt text transcript html htm``          ``str``
``json jsn``                              anything ``json.dumps`` takes (UTF-8)
``npy``                                   a numpy array (``numpy.lib.format``)
``pth``                                   a tensor, or a dict/list of them (``torch.save``;
                                          read back with ``weights_only``)
``jpg jpeg png webp ppm pgm pbm bmp tif   a PIL image, or a uint8 array (``HW``/``HWC``,
tiff``                                    1, 3 or 4 channels) or tensor (``CHW``/``HW``)
``pyd pickle pkl``                        anything, pickled: only under these names
``mp msg msgpack``                        anything msgpack packs (optional dependency)
``ten tb``                                a numpy array or tensor, or a list of them
                                          (webdataset's tenbin; reads back as a list of
                                          numpy arrays)
========================================  ==========================================
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
from collections.abc import Callable
from typing import Any

from shardpipes._core.tenbin import encode_tenbin

#: Pillow's format name for each image extension the writer encodes
IMAGE_FORMATS = {
    "jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "ppm": "PPM", "pgm": "PPM",
    "pbm": "PPM", "bmp": "BMP", "tif": "TIFF", "tiff": "TIFF",
}  # fmt: skip
_NUMBERS = frozenset(["cls", "cls2", "class", "count", "index", "inx", "id", "label"])
_JSON = frozenset({"json", "jsn"})
_PICKLE = frozenset({"pyd", "pickle", "pkl"})
_MSGPACK = frozenset({"mp", "msg", "msgpack"})
_TENBIN = frozenset({"ten", "tb"})
_BINARY = frozenset({*IMAGE_FORMATS, "npy", "npz", "pth", "pt", *_TENBIN})


def encode_value(key: str, field: str, value: Any) -> bytes:
    """The bytes of one field of sample ``key``, by its extension (see the module's table).

    Raises:
        TypeError: The value cannot be stored under that extension; the message names the
            sample, the field, the value's type and what the extension takes.
    """
    name = field.lower()
    if name.endswith(".gz"):
        inner = encode_value(key, field[:-3], value)
        return gzip.compress(inner, mtime=0)
    ext = name.rsplit(".", 1)[-1]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)  # already encoded: stored as it is
    if isinstance(value, str) and ext in _BINARY:
        msg = (
            f"sample {key!r} field {field!r}: a str under {ext!r}, a binary format: "
            f"{_takes(ext)}, or its encoded bytes"
        )
        raise TypeError(msg)
    if isinstance(value, str) and ext not in _PICKLE | _MSGPACK:
        return value.encode("utf-8")
    encoder = _encoder(ext, value)
    if encoder is None:
        msg = (
            f"sample {key!r} field {field!r}: cannot store a {type(value).__name__} under "
            f"extension {ext!r} ({_takes(ext)})"
        )
        raise TypeError(msg)
    try:
        return encoder(value)
    except (TypeError, ValueError, OverflowError) as exc:
        msg = f"sample {key!r} field {field!r}: {exc}"
        raise TypeError(msg) from exc


def _encoder(ext: str, value: Any) -> Callable[[Any], bytes] | None:
    if ext in _NUMBERS and _is_int(value):
        return lambda v: str(int(v)).encode("ascii")
    if ext in _JSON:
        return _json
    if ext == "npy" and type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        return _npy
    if ext == "pth" and _torch_value(value):
        return _pth
    if ext in IMAGE_FORMATS and _image_like(value):
        return lambda v: _image(v, IMAGE_FORMATS[ext])
    if ext in _PICKLE:
        return lambda v: pickle.dumps(v, protocol=4)
    if ext in _MSGPACK:
        return _msgpack
    if ext in _TENBIN and _arrays(value):
        return lambda v: encode_tenbin(
            [_numpy(a) for a in (v if isinstance(v, list | tuple) else [v])]
        )
    return None


def _takes(ext: str) -> str:
    if ext in _NUMBERS:
        return "it takes an int"
    if ext == "npy":
        return "it takes a numpy array"
    if ext == "pth":
        return "it takes a tensor, or a dict or list of them"
    if ext in IMAGE_FORMATS:
        return "it takes a PIL image, or a uint8 (or [0, 1] float) array or tensor"
    if ext in _TENBIN:
        return "it takes a numpy array or tensor, or a list of them"
    return "give bytes or str, or name the field by what it holds: cls, json, npy, pth, png…"


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return (
        type(value).__module__ == "numpy"
        and getattr(value, "dtype", None) is not None
        and (value.dtype.kind in "iu" and getattr(value, "ndim", 1) == 0)
    )


def _arrays(value: Any) -> bool:
    items = value if isinstance(value, list | tuple) else [value]
    return bool(items) and all(
        type(v).__module__ in ("numpy", "torch") and hasattr(v, "dtype") for v in items
    )


def _numpy(array: Any) -> Any:
    """A numpy array, or a tensor's values as one."""
    if type(array).__module__ == "torch":
        return array.detach().cpu().numpy()
    return array


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _npy(value: Any) -> bytes:
    import numpy.lib.format

    out = io.BytesIO()
    numpy.lib.format.write_array(out, value, allow_pickle=False)
    return out.getvalue()


def _torch_value(value: Any) -> bool:
    if type(value).__module__.startswith("torch"):
        return True
    if isinstance(value, dict):
        return bool(value) and all(_torch_value(v) for v in value.values())
    if isinstance(value, list | tuple):
        return bool(value) and all(_torch_value(v) for v in value)
    return False


def _pth(value: Any) -> bytes:
    import torch

    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


def _image_like(value: Any) -> bool:
    module = type(value).__module__
    return module.startswith("PIL.") or module in ("numpy", "torch")


def _image(value: Any, fmt: str) -> bytes:
    import numpy
    import PIL.Image

    image = value
    if not isinstance(value, PIL.Image.Image):
        array = value.numpy() if type(value).__module__ == "torch" else value
        array = _pixels(array, fmt)
        given = array.shape
        if type(value).__module__ == "torch" and array.ndim == 3 and array.shape[0] in (1, 3, 4):
            array = numpy.transpose(array, (1, 2, 0))  # a tensor's CHW to HWC (else HWC)
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (3, 4)):
            msg = (
                "an image array must be HW or HWC (a tensor also CHW) with 1, 3 or 4 channels "
                f"(got {tuple(given)})"
            )
            raise TypeError(msg)
        image = PIL.Image.fromarray(numpy.ascontiguousarray(array))
    if fmt == "JPEG" and image.mode in ("RGBA", "LA", "PA"):
        msg = f"a {image.mode} image under a JPEG extension: JPEG has no alpha (use png or webp)"
        raise TypeError(msg)
    if fmt == "JPEG" and image.mode not in ("RGB", "L", "CMYK"):
        image = image.convert("RGB")
    out = io.BytesIO()
    options = {"quality": 95} if fmt in ("JPEG", "WEBP") else {}
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _msgpack(value: Any) -> bytes:
    try:
        import msgpack  # type: ignore[import-untyped]
    except ImportError as exc:
        msg = "the .mp / .msgpack extension needs msgpack: pip install msgpack"
        raise ImportError(msg) from exc
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _pixels(array: Any, fmt: str) -> Any:
    """An image array as uint8: floats in [0, 1] scaled (as webdataset does), else refused.

    One channel of uint16 (depth maps) stays so under PNG and TIFF, written as 16-bit.
    """
    import numpy

    if array.dtype == numpy.uint8:
        return array
    one_channel = array.ndim == 2 or (array.ndim == 3 and 1 in (array.shape[0], array.shape[2]))
    if array.dtype == numpy.uint16 and fmt in ("PNG", "TIFF") and one_channel:
        return array
    if array.dtype.kind == "f":
        if array.size and (array.min() < 0 or array.max() > 1):
            msg = (
                f"a float image array must hold values in [0, 1] (got {array.min()}.."
                f"{array.max()}): scale it, or give uint8"
            )
            raise TypeError(msg)
        return (array * 255).round().astype(numpy.uint8)
    msg = (
        f"an image array must be uint8, or float in [0, 1] (got {array.dtype}); one channel "
        "of uint16 is written under png and tiff"
    )
    raise TypeError(msg)
