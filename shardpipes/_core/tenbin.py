"""webdataset's ``.ten`` members (tenbin): a list of numpy arrays, read without trusting them.

The format (webdataset's ``tenbin``; the bytes its writer gives): a run of chunks, each
the 8 bytes ``~TenBin~``, its length (int64) and its bytes, padded to a multiple of 64.
An array is two chunks: a header of int64s — dtype code (``"f4"``…, ASCII in 8 bytes),
a name (8 ASCII bytes), the number of dimensions, then each dimension — and its data.

Every length, code and dimension is checked against the member's own bytes, so a
damaged or hostile member is a ``ValueError`` naming what is wrong, never a read past
its end or an allocation it does not hold.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy

MAGIC = b"~TenBin~"
MAX_DIMS = 9  # webdataset's writer refuses 10 or more
_CODES = {
    "f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16",
    "i4": "int32", "i8": "int64", "u1": "uint8", "u2": "uint16", "u4": "uint32",
    "u8": "uint64",
}  # fmt: skip
# written: not uint32, which webdataset 1.0.2 cannot read back (its table says "unit32")
_NAMES = {name: code for code, name in _CODES.items() if name != "uint32"}


def _chunks(data: bytes) -> list[memoryview]:
    view, out, offset = memoryview(data), [], 0
    while offset < len(view):
        if bytes(view[offset : offset + 8]) != MAGIC:
            msg = f"not a tenbin chunk at byte {offset} (no ~TenBin~ mark)"
            raise ValueError(msg)
        if offset + 16 > len(view):
            msg = f"a tenbin chunk cut short at byte {offset}"
            raise ValueError(msg)
        (size,) = struct.unpack_from("<q", view, offset + 8)
        start = offset + 16
        if size < 0 or start + size > len(view):
            msg = f"a tenbin chunk at byte {offset} says {size} bytes; {len(view) - start} follow"
            raise ValueError(msg)
        out.append(view[start : start + size])
        offset = start + -(-size // 64) * 64
    return out


def decode_tenbin(data: bytes) -> list[Any]:
    """The arrays of a ``.ten`` member, as writable numpy arrays.

    Raises:
        ValueError: The bytes are not tenbin, or say more than they hold.
    """
    chunks = _chunks(data)
    if len(chunks) % 2:
        msg = f"a tenbin member holds {len(chunks)} chunks: a header without its data"
        raise ValueError(msg)
    arrays = []
    for header, body in zip(chunks[::2], chunks[1::2], strict=True):
        if len(header) < 24 or len(header) % 8:
            msg = f"a tenbin header of {len(header)} bytes"
            raise ValueError(msg)
        fields = struct.unpack_from(f"<{len(header) // 8}q", header)
        code, ndim = bytes(header[:8]).rstrip(b"\0").decode("ascii", "replace"), fields[2]
        if code not in _CODES:
            msg = f"a tenbin array of unknown type {code!r}"
            raise ValueError(msg)
        if not 0 <= ndim <= MAX_DIMS or len(fields) < 3 + ndim:
            msg = f"a tenbin array of {ndim} dimensions in a header of {len(fields) - 3}"
            raise ValueError(msg)
        shape = tuple(fields[3 : 3 + ndim])
        dtype = numpy.dtype(_CODES[code]).newbyteorder("<")
        if any(d < 0 for d in shape) or numpy.prod(shape, dtype=object) * dtype.itemsize != len(
            body
        ):
            msg = f"a tenbin {_CODES[code]} array of shape {shape} in {len(body)} bytes"
            raise ValueError(msg)
        arrays.append(
            numpy.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        )
    return arrays


def encode_tenbin(arrays: Sequence[Any]) -> bytes:
    """The ``.ten`` bytes of numpy arrays (webdataset reads them back as this list).

    Raises:
        TypeError: An item is not a numpy array of a type tenbin holds, or has over 9
            dimensions.
    """
    out = bytearray()
    for array in arrays:
        if type(array).__module__ != "numpy" or not hasattr(array, "dtype"):
            msg = f"tenbin holds numpy arrays (got a {type(array).__name__})"
            raise TypeError(msg)
        code = _NAMES.get(array.dtype.name)
        if code is None or array.ndim > MAX_DIMS:
            msg = (
                f"tenbin holds arrays of {', '.join(_NAMES)} with at most {MAX_DIMS} "
                f"dimensions (got {array.dtype.name}, {array.ndim})"
            )
            raise TypeError(msg)
        # the dtype code and an empty name (8 ASCII bytes each), then int64s
        header = code.encode().ljust(16, b"\0")
        header += struct.pack(f"<{1 + array.ndim}q", array.ndim, *array.shape)
        body = numpy.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        for chunk in (header, body):
            out += MAGIC + struct.pack("<q", len(chunk)) + chunk
            out += b"\0" * (-len(chunk) % 64)
    return bytes(out)
