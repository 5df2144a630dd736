"""The ``decode`` stage: turn each sample's ``bytes`` into objects, chosen by extension."""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy
import torch
from torch.utils.data import IterDataPipe

from shardpipes._core.decoders import (
    Decoder,
    Decoding,
    check_allow_pickle,
    check_image_mode,
    default_decoders,
)
from shardpipes._core.handlers import Handler, check_handler
from shardpipes._core.steps import guarded
from shardpipes.errors import UnsafeDataError
from shardpipes.pipes._length import source_length
from shardpipes.pipes._stage import Functions, SampleStage, functional_form, upstream
from shardpipes.pipes.fields import takes_samples

__all__ = ["SampleDecoder", "chw_tensor", "decoder_table", "load_weights"]


@functional_form("decode")
class SampleDecoder(SampleStage):
    """Decodes the fields of each sample by extension (functional name: ``decode``).

    Each field is decoded by the decoder for its full extension (``"seg.png"``) if there
    is one, else by the one for its last dot-part (``"png"``). By default: images
    (``jpg jpeg png ppm pgm pbm pnm bmp gif tif tiff webp``) as ``image`` says; ``cls``,
    ``cls2``, ``index``, ``label`` to ``int``; ``txt``, ``text`` to ``str``; ``json``;
    ``npy`` and ``npz`` (without pickle); ``pth``, ``pt`` (``torch.load`` with
    ``weights_only=True``). Unknown extensions, and ``__key__``/``__url__``, stay as they
    are. Each sample is decoded into a new dict. Pickle members (``pyd``, ``pickle``,
    ``pkl``) are refused with :class:`~shardpipes.errors.UnsafeDataError` unless
    ``allow_pickle`` opts in. Pillow's decompression-bomb limit stays on.

    Args:
        source_datapipe: Samples: dicts with ``__key__``, ``__url__`` and ``bytes`` fields.
        image: ``"pil"`` (RGB ``PIL.Image``), ``"numpy"`` (uint8 HWC array), ``"torch"``
            (uint8 CHW tensor) or ``"bytes"`` (leave images encoded).
        resize: Scale images so that their shorter side is this long, decoding JPEGs at
            a reduced scale where that is enough (torchvision's ``Resize(resize)``).
        crop: Then cut the central ``crop`` x ``crop`` square (``CenterCrop(crop)``),
            resampling only that region. ``resize=256, crop=224`` is the usual pair.
        handler: What to do with a sample that fails to decode: ``"raise"``, ``"warn"``
            (skip it with a warning), ``"ignore"`` (skip it) or a callable
            ``(exc, context) -> bool`` returning ``True`` to skip.
        allow_pickle: Unpickle members with pickle extensions, trusting the data
            (unpickling runs code the shard's author chose): ``True`` for all of them or a
            collection such as ``("pyd",)``.
        overrides: Extension to a callable ``(bytes) -> object`` or ``None``, like
            ``**decoders`` but as a mapping (``{"seg.png": my_fn}``). ``**decoders`` win
            over it.
        **decoders: Extension to a callable ``(bytes) -> object``, adding to or overriding
            the defaults (``seg=my_fn``, ``**{"seg.png": my_fn}``); ``None`` leaves that
            extension as bytes.

    Example:
        >>> import io
        >>> import PIL.Image
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> png = io.BytesIO()
        >>> PIL.Image.new("RGB", (4, 2), "red").save(png, format="PNG")
        >>> sample = {"__key__": "a", "__url__": "memory://s.tar", "png": png.getvalue(),
        ...           "cls": b"3", "txt": b"hello"}
        >>> decoded = next(iter(SampleDecoder(IterableWrapper([sample]), "torch")))
        >>> decoded["png"].shape, decoded["cls"], decoded["txt"]
        (torch.Size([3, 2, 4]), 3, 'hello')
        >>> next(iter(IterableWrapper([sample]).decode("pil", txt=None)))["txt"]
        b'hello'
        >>> next(iter(IterableWrapper([sample]).decode(overrides={"cls": float})))["cls"]
        3.0
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[dict[str, Any]],
        image: str = "pil",
        *,
        resize: int | None = None,
        crop: int | None = None,
        handler: Handler = "raise",
        allow_pickle: bool | Iterable[str] = False,
        overrides: Mapping[str, Decoder | None] | None = None,
        **decoders: Decoder | None,
    ) -> None:
        takes_samples(source_datapipe, "decode")
        super().__init__()
        self.source_datapipe = source_datapipe
        self.image = check_image_mode(image)
        self.resize, self.crop = resize, crop
        self.handler = check_handler(handler)
        check_allow_pickle(allow_pickle)
        self.allow_pickle = allow_pickle
        self.overrides = Functions(dict(overrides or {}))  # lambdas: not in torch's graph walk
        self.decoders = Functions(decoders)
        self._decoding = Decoding(
            decoder_table(
                image, resize=resize, crop=crop, allow_pickle=allow_pickle,
                overrides={**self.overrides.items, **decoders},
            )
        )  # fmt: skip

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[dict[str, Any]]:
        decode = functools.partial(self._decoding.sample, only=wanted)
        return guarded(upstream(self.source_datapipe, wanted), decode, self.handler)

    def __len__(self) -> int:
        return source_length(self)


def chw_tensor(array: numpy.ndarray[Any, Any]) -> torch.Tensor:
    """A uint8 HWC image array as the CHW tensor torchvision's transforms take."""
    return torch.from_numpy(array.transpose(2, 0, 1).copy())


def load_weights(data: bytes) -> Any:
    """A ``pth``/``pt`` member: ``torch.load`` with ``weights_only=True``.

    Raises:
        UnsafeDataError: The member holds more than tensors and plain data (loading it
            would unpickle it, which executes arbitrary code).
    """
    if not data.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip, or its old pickle
        msg = "not a torch.save file (neither its zip nor its pickle header)"
        raise ValueError(msg)
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights_only" not in str(exc).lower().replace(" ", "_"):
            raise
        problem = (
            "refused to load a torch member holding more than tensors and plain data: "
            "torch.load(weights_only=False) would unpickle it, which executes arbitrary code"
        )
        raise UnsafeDataError(problem) from exc


def decoder_table(
    image: str,
    *,
    resize: int | None = None,
    crop: int | None = None,
    allow_pickle: bool | Iterable[str] = False,
    overrides: Mapping[str, Decoder | None] | None = None,
) -> dict[str, Decoder | None]:
    """The default decoders for these options, with ``overrides`` (checked) on top."""
    table = default_decoders(
        image, allow_pickle=allow_pickle, resize=resize, crop=crop,
        tensor=chw_tensor, weights=load_weights,
    )  # fmt: skip
    for ext, decoder in (overrides or {}).items():
        if decoder is not None and not callable(decoder):
            msg = f"decoder for {ext!r} must be callable or None (got {decoder!r})"
            raise TypeError(msg)
        table[ext.lower()] = decoder
    return table
