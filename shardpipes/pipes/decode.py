"""The ``decode`` stage: turn each sample's ``bytes`` into objects, chosen by extension."""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import pickle
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy
import torch
from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.decoders import Decoder, Decoding, check_allow_pickle, default_decoders
from shardpipes._core.handlers import Handler, check_handler
from shardpipes._core.images import check_image_mode
from shardpipes._core.reading import reference
from shardpipes._core.stage import checked_int
from shardpipes._core.steps import InFlight, guard, threaded
from shardpipes.errors import UnsafeDataError
from shardpipes.pipes._stage import functional_form
from shardpipes.pipes.fields import StepPipe

__all__ = ["DecodeOptions", "SampleDecoder", "chw_tensor", "decoder_table", "load_weights"]


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """How ``decode`` (and the recipes, by keyword) decode each field.

    Attributes:
        image: ``"pil"`` (RGB ``PIL.Image``), ``"numpy"`` (uint8 HWC array), ``"torch"``
            (uint8 CHW tensor) or ``"bytes"`` (leave images encoded); webdataset's
            ``"rgb8"``, ``"torchrgb8"`` and ``"pilrgb"`` too.
        resize: Scale images so that their shorter side is this long, decoding JPEGs at
            a reduced scale where that is enough (torchvision's ``Resize(resize)``).
        crop: Then cut the central ``crop`` x ``crop`` square (``CenterCrop(crop)``),
            resampling only that region. ``resize=256, crop=224`` is the usual pair.
        allow_pickle: Unpickle members with pickle extensions, trusting the data
            (unpickling runs code the shard's author chose): ``True`` for all of them or a
            collection such as ``("pyd",)``.
        decoders: Extension to a callable ``(bytes) -> object``, over the defaults
            (``{"seg.png": my_fn}``); ``None`` leaves that extension as bytes.
        threads: Decode on a pool of this many threads, in order: Pillow releases the GIL
            while it decodes and resizes, so this uses the cores that DataLoader workers
            leave idle (``num_workers=0`` above all). Below 2: no pool.
    """

    image: str = "pil"
    resize: int | None = None
    crop: int | None = None
    allow_pickle: bool | Iterable[str] = False
    decoders: Mapping[str, Decoder | None] = dataclasses.field(default_factory=dict)
    threads: int = 0

    def __post_init__(self) -> None:
        check_image_mode(self.image)
        check_allow_pickle(self.allow_pickle)
        checked_int(self.threads, "threads", 0)
        decoder_table(self.image, resize=self.resize, crop=self.crop, overrides=self.decoders)

    def decoding(self) -> Decoding:
        """The decoders these options make."""
        table = decoder_table(
            self.image, resize=self.resize, crop=self.crop, allow_pickle=self.allow_pickle,
            overrides=self.decoders,
        )  # fmt: skip
        return Decoding(table)


@functional_form("decode")
class SampleDecoder(StepPipe):
    """Decodes the fields of each sample by extension (functional name: ``decode``).

    Each field is decoded by the decoder for its full extension (``"seg.png"``) if there
    is one, else by the one for its last dot-part (``"png"``). By default: images
    (``jpg jpeg png ppm pgm pbm pnm bmp gif tif tiff webp``) as ``image`` says; ``cls``,
    ``cls2``, ``index``, ``label`` to ``int``; ``txt``, ``text`` to ``str``; ``json``;
    ``npy`` and ``npz`` (without pickle); ``pth``, ``pt`` (``torch.load`` with
    ``weights_only=True``). Unknown extensions, and ``__key__``/``__url__``, stay as they
    are. Each sample is decoded into a new dict. Pickle members (``pyd``, ``pickle``,
    ``pkl``) are refused with :class:`~shardpipes.errors.UnsafeDataError` unless
    ``allow_pickle`` opts in. Pillow's decompression-bomb limit stays on. A ``to_tuple``
    after it has only the fields it picks decoded.

    Args:
        source_datapipe: Samples: dicts with ``__key__``, ``__url__`` and ``bytes`` fields.
        image: How to decode images (see :class:`~shardpipes.DecodeOptions`).
        resize: See :class:`~shardpipes.DecodeOptions`.
        crop: See :class:`~shardpipes.DecodeOptions`.
        handler: What to do with a sample that fails to decode: ``"raise"``, ``"warn"``
            (skip it with a warning), ``"ignore"`` (skip it) or a callable
            ``(exc, context) -> bool`` returning ``True`` to skip.
        allow_pickle: See :class:`~shardpipes.DecodeOptions`.
        overrides: Extension to a callable ``(bytes) -> object`` or ``None``, like
            ``**decoders`` but as a mapping (``{"seg.png": my_fn}``). ``**decoders`` win
            over it.
        threads: See :class:`~shardpipes.DecodeOptions`. The samples taken by the threads
            and not yet yielded are in the state, as references.
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
        image: str | DecodeOptions = "pil",
        *,
        resize: int | None = None,
        crop: int | None = None,
        handler: Handler = "raise",
        allow_pickle: bool | Iterable[str] = False,
        overrides: Mapping[str, Decoder | None] | None = None,
        threads: int = 0,
        **decoders: Decoder | None,
    ) -> None:
        super().__init__(source_datapipe, "decode")
        if isinstance(image, DecodeOptions):
            options = image
        else:
            options = DecodeOptions(
                image, resize, crop, allow_pickle, {**(overrides or {}), **decoders}, threads
            )
        self.image, self.resize, self.crop = options.image, options.resize, options.crop
        self.handler = check_handler(handler)
        self.options = options  # not a collection: torch's graph walk passes it by
        self._decoding = options.decoding()
        self._only: frozenset[str] | None = None  # want(): the fields kept downstream
        self._flight: InFlight | None = None  # threads: samples taken, not yet yielded
        self._ahead: list[Any] = []  # loaded: those samples, as references

    @property
    def threads(self) -> int:
        """Decoding threads (see :class:`~shardpipes.DecodeOptions`)."""
        return self.options.threads

    @override
    def want(self, fields: frozenset[str] | None) -> None:
        self._only = fields

    def state(self) -> Any:
        """The source's state; with ``threads``, the samples in flight as references too."""
        if self.threads < 2:
            return self.sources()[0].state()
        flight = self._flight.pending() if self._flight is not None else self._ahead
        ahead = [[s["__url__"], s.offset, s.end, s.get("__source__")] for s in flight]
        return {"source": self.sources()[0].state(), "ahead": ahead}

    @override
    def reset(self, state: Any = None) -> None:
        if self.threads < 2:
            super().reset(state)
            return
        self._fresh, self._flight = True, None
        self._ahead = [] if state is None else [reference(*ref) for ref in state["ahead"]]
        self.sources()[0].reset(None if state is None else state["source"])

    def _step(self) -> Any:
        return functools.partial(self._decoding.sample, only=self._only)

    def _iterate(self) -> Iterator[dict[str, Any]]:
        if self.threads < 2:
            return super()._iterate()
        source = iter(self.source_datapipe)
        ahead, self._ahead = self._ahead, []
        if ahead:  # restored: the samples the threads held, first
            source = itertools.chain(self.sources()[0].fetch(ahead), source)
        self._flight = InFlight()
        step = guard(self._step(), self.handler)
        return threaded(source, step, self.threads, self.threads * 2, self._flight)


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
