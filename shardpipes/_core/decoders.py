"""The decoder table: bytes of one member in, a Python object out, chosen by extension.

A field is decoded by the entry for its full extension (``"seg.png"``) if the table has
one, else by the entry for the last dot-part of it (``"png"``), so ``seg.png`` decodes as
a PNG image. An entry of ``None`` leaves the bytes alone; so does an unknown extension.
Fields whose name starts with ``"__"`` (``__key__``, ``__url__``) are never decoded.

Safety: pickle extensions (``pyd``, ``pickle``, ``pkl``) are refused with
:class:`~shardpipes.errors.UnsafeDataError` unless the caller opts in, ``npy``/``npz``
are loaded with ``allow_pickle=False``, ``pth``/``pt`` with ``weights_only=True``, images
only through Pillow's raster plugins, ``ten``/``tb`` (webdataset's tenbin arrays) by a
reader that checks every length against the member, ``mp``/``msg``/``msgpack`` with
msgpack's ``unpackb`` (plain data; msgpack is optional), and Pillow's decompression-bomb limit
(``PIL.Image.MAX_IMAGE_PIXELS``) is left as it is: an image over twice the limit fails
with :class:`~shardpipes.errors.DecodeError`; one over the limit makes Pillow emit its
``DecompressionBombWarning``, which becomes a ``DecodeError`` where warnings are errors.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy

from shardpipes._core.images import IMAGE_EXTENSIONS, check_image_mode, check_size, decode_image
from shardpipes._core.samples import ShardSample, placed_like
from shardpipes._core.tenbin import decode_tenbin
from shardpipes.errors import DecodeError, UnsafeDataError

Decoder = Callable[[bytes], Any]

PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl"})


def check_allow_pickle(allow_pickle: bool | Iterable[str]) -> frozenset[str]:
    """Turn the ``allow_pickle`` argument into the set of pickle extensions it allows.

    Args:
        allow_pickle: ``False`` (none), ``True`` (all of ``pyd``, ``pickle``, ``pkl``) or
            a collection of some of those extensions.

    Returns:
        The allowed pickle extensions.

    Raises:
        ValueError: For an extension that is not a pickle extension.
        TypeError: For a value that is neither a bool nor a collection of strings.
    """
    if isinstance(allow_pickle, bool):
        return PICKLE_EXTENSIONS if allow_pickle else frozenset()
    if isinstance(allow_pickle, str) or not isinstance(allow_pickle, Iterable):
        msg = f"allow_pickle must be a bool or a collection of extensions (got {allow_pickle!r})"
        raise TypeError(msg)
    allowed = frozenset(allow_pickle)
    if not allowed <= PICKLE_EXTENSIONS:
        msg = (
            f"allow_pickle must name only pickle extensions {sorted(PICKLE_EXTENSIONS)} "
            f"(got {sorted(allowed - PICKLE_EXTENSIONS)})"
        )
        raise ValueError(msg)
    return allowed


def _decode_int(data: bytes) -> int:
    return int(data.decode("utf-8").strip())


def _decode_npy(data: bytes) -> Any:
    if not data.startswith(b"\x93NUMPY"):  # numpy.load would try to unpickle it
        msg = "not an .npy array (no \\x93NUMPY header)"
        raise ValueError(msg)
    with _no_object_arrays("npy"):
        return numpy.load(io.BytesIO(data), allow_pickle=False)


def _decode_npz(data: bytes) -> dict[str, Any]:
    with _no_object_arrays("npz"), numpy.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


@contextlib.contextmanager
def _no_object_arrays(ext: str) -> Iterator[None]:
    """Numpy's refusal of an object array, as the UnsafeDataError it is."""
    try:
        yield
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise
        problem = (
            f"refused to load a {ext!r} member holding Python objects: loading it unpickles "
            "them, which executes arbitrary code; decode it yourself only if you trust the data"
        )
        raise UnsafeDataError(problem) from exc


def _decode_msgpack(data: bytes) -> Any:
    try:
        import msgpack  # type: ignore[import-untyped]
    except ImportError as exc:
        msg = (
            "decoding .mp / .msgpack members needs msgpack: pip install msgpack (or "
            "shardpipes[msgpack]); or keep them as bytes with decode(mp=None)"
        )
        raise ImportError(msg) from exc
    return msgpack.unpackb(data)  # plain data: no code runs, keys must be str or bytes


def _to_tensor(
    tensor: Callable[[Any], Any], data: bytes, *, resize: int | None, crop: int | None
) -> Any:
    return tensor(decode_image(data, "numpy", resize=resize, crop=crop))


def _refuse_pickle(data: bytes, *, ext: str) -> Any:
    problem = (
        f"refused to unpickle a {ext!r} member: unpickling a shard's member executes "
        f"arbitrary code; pass allow_pickle=True (or allow_pickle=({ext!r},)) to decode() "
        "only if you trust the data"
    )
    raise UnsafeDataError(problem)


def default_decoders(
    image: str = "pil",
    *,
    allow_pickle: bool | Iterable[str] = False,
    resize: int | None = None,
    crop: int | None = None,
    tensor: Callable[[Any], Any] | None = None,
    weights: Decoder | None = None,
) -> dict[str, Decoder | None]:
    """Build the default decoder table.

    Args:
        image: How to decode images: ``"pil"``, ``"numpy"``, ``"torch"`` or ``"bytes"``
            (leave them encoded).
        allow_pickle: Pickle extensions to decode with :mod:`pickle`, trusting the data:
            ``True`` for all, or a collection such as ``("pyd",)``. The others are refused.
        resize: Scale images so that their shorter side is this long (see
            :func:`decode_image`).
        crop: Then center-crop images to this square size.
        tensor: For ``image="torch"``: turns a uint8 HWC array into the CHW tensor (the
            torch layer gives it; this module does not import torch).
        weights: The decoder of ``pth``/``pt`` members (``torch.load`` with
            ``weights_only``, from the torch layer); without it they stay bytes.

    Returns:
        A dict mapping extension to decoder, or to ``None`` for "leave the bytes".

    Example:
        >>> table = default_decoders("numpy")
        >>> table["cls"](b" 7 ")
        7
    """
    image = check_image_mode(image)
    check_size(resize, crop)
    allowed = check_allow_pickle(allow_pickle)
    image_decoder: Decoder | None = None
    if image == "torch":
        if tensor is None:
            msg = "image='torch' needs the tensor conversion (tensor=)"
            raise ValueError(msg)
        image_decoder = partial(_to_tensor, tensor, resize=resize, crop=crop)
    elif image != "bytes":
        image_decoder = partial(decode_image, mode=image, resize=resize, crop=crop)
    table: dict[str, Decoder | None] = dict.fromkeys(IMAGE_EXTENSIONS, image_decoder)
    table.update(dict.fromkeys(("cls", "cls2", "index", "label"), _decode_int))
    table.update(txt=bytes.decode, text=bytes.decode, json=json.loads)
    table.update(npy=_decode_npy, npz=_decode_npz, pth=weights, pt=weights)
    table.update(dict.fromkeys(("ten", "tb"), decode_tenbin))
    table.update(dict.fromkeys(("mp", "msg", "msgpack"), _decode_msgpack))
    for ext in PICKLE_EXTENSIONS:
        table[ext] = pickle.loads if ext in allowed else partial(_refuse_pickle, ext=ext)
    return table


def decoder_for(table: Mapping[str, Decoder | None], field: str) -> Decoder | None:
    """Choose the decoder for a field: its full extension first, else its last dot-part.

    Args:
        table: Extension to decoder (or ``None``).
        field: The sample field, e.g. ``"jpg"`` or ``"seg.png"``.

    Returns:
        The decoder, or ``None`` to leave the field as it is.

    Example:
        >>> decoder_for({"png": len}, "seg.png")
        <built-in function len>
        >>> decoder_for({"png": len, "seg.png": None}, "seg.png") is None
        True
        >>> decoder_for({"key__": len}, "__key__") is None
        True
    """
    if field.startswith("__"):
        return None
    if field in table:
        return table[field]
    if field.lower().endswith(".gz"):  # gzipped: the inner extension's decoder after gunzip
        inner = decoder_for(table, field[:-3])
        return gunzip if inner is None else partial(_gunzipped, inner)
    return table.get(field.rsplit(".", 1)[-1])


#: the most bytes a gzipped member may decompress to (a bigger one is refused, not read)
GUNZIP_LIMIT = 1 << 30


def gunzip(data: bytes) -> bytes:
    """Decompress a gzipped member, refusing one over :data:`GUNZIP_LIMIT` bytes."""
    inflate = zlib.decompressobj(wbits=31)  # a gzip header
    out = inflate.decompress(data, GUNZIP_LIMIT)
    if inflate.unconsumed_tail or not inflate.eof:
        if inflate.unconsumed_tail:
            msg = f"decompresses to more than {GUNZIP_LIMIT} bytes (GUNZIP_LIMIT): not read"
            raise ValueError(msg)
        msg = "a truncated gzip stream"
        raise ValueError(msg)
    return out


def _gunzipped(inner: Decoder, data: bytes) -> Any:
    return inner(gunzip(data))


def decode_sample(sample: Mapping[str, Any], table: Mapping[str, Decoder | None]) -> dict[str, Any]:
    """Decode the ``bytes`` fields of one sample into a new dict.

    Args:
        sample: A sample dict with ``__key__``, ``__url__`` and one entry per extension.
        table: Extension to decoder (or ``None``), e.g. from :func:`default_decoders`.

    Returns:
        A new dict; fields without a decoder, and values that are not ``bytes``, are
        copied as they are.

    Raises:
        DecodeError: A decoder failed; names the sample's url, member and key.
        UnsafeDataError: A member needs unpickling, which ``table`` refuses.

    Example:
        >>> decode_sample({"__key__": "a", "cls": b"3", "x": b"?"}, default_decoders())
        {'__key__': 'a', 'cls': 3, 'x': b'?'}
    """
    return Decoding(table).sample(sample)


class Decoding:
    """A decoder table, with the decoder chosen for each field remembered.

    Args:
        table: Extension to decoder (or ``None``), e.g. from ``default_decoders``.
    """

    def __init__(self, table: Mapping[str, Decoder | None]) -> None:
        self.table = table
        self._chosen: dict[str, Decoder | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table, "_chosen": {}}

    def decoder(self, field: str) -> Decoder | None:
        """The decoder of ``field`` (see ``decoder_for``)."""
        try:
            return self._chosen[field]
        except KeyError:
            chosen = self._chosen[field] = decoder_for(self.table, field)
            return chosen

    def sample(self, sample: Mapping[str, Any], only: frozenset[str] | None = None) -> ShardSample:
        """A new sample with its ``bytes`` fields decoded (only those in ``only``, if given).

        Raises:
            DecodeError: A decoder failed; names the sample's url, member, key, offset.
        """
        out = ShardSample()
        for field, value in sample.items():
            if type(value) is bytes and (only is None or field in only):
                decoder = self.decoder(field)
                if decoder is not None:
                    value = decode_value(decoder, sample, field, value)
            out[field] = value
        return placed_like(out, sample)  # type: ignore[return-value]


def decode_field(sample: Mapping[str, Any], field: str, table: Mapping[str, Decoder | None]) -> Any:
    """Decode one field of a sample (see :func:`decode_sample`); other values pass as they are.

    Raises:
        DecodeError: The decoder failed; names the sample's url, member and key.
    """
    value = sample[field]
    decoder = decoder_for(table, field) if isinstance(value, bytes) else None
    if decoder is None:
        return value
    return decode_value(decoder, sample, field, value)


def decode_value(decoder: Decoder, sample: Mapping[str, Any], field: str, value: bytes) -> Any:
    """``decoder(value)``, a failure raised as the :class:`DecodeError` naming the sample.

    Raises:
        DecodeError: The decoder failed (:class:`UnsafeDataError` for refused content).
    """
    try:
        return decoder(value)
    except Exception as exc:
        raise located(exc, sample, field) from exc


def located(exc: Exception, sample: Mapping[str, Any], field: str) -> DecodeError:
    """The :class:`DecodeError` for ``exc``, raised decoding ``field`` of ``sample``."""
    key = sample.get("__key__")
    member = field if key is None else f"{key}.{field}"
    if isinstance(exc, DecodeError):
        problem, cls = exc.problem, type(exc)
    else:
        problem = f"cannot decode {field!r}: {type(exc).__name__}: {described(exc)}"
        cls = DecodeError
    offset = getattr(sample, "offset", None)  # a ShardSample knows where it starts
    return cls(problem, url=sample.get("__url__"), member=member, key=key, offset=offset)


_OBJECT = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")


def described(exc: BaseException) -> str:
    """``str(exc)`` without the reprs of objects in it (Pillow names its ``BytesIO``).

    Example:
        >>> described(OSError("cannot identify image file <_io.BytesIO object at 0x7f01>"))
        'cannot identify image file'
    """
    return _OBJECT.sub("", str(exc))
