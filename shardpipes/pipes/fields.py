"""The ``to_tuple`` stage: pick fields of each sample, in order, into a tuple."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe, functional_datapipe

from shardpipes._core.handlers import Handler, check_handler, handle
from shardpipes._core.samples import SampleTuple
from shardpipes.errors import MissingFieldError
from shardpipes.pipes._length import source_length

__all__ = ["TupleMaker", "parse_fields", "pick"]


def _parse_field(field: object) -> tuple[str, ...]:
    if not isinstance(field, str):
        msg = f"fields must be strings (got {type(field).__name__})"
        raise TypeError(msg)
    alternatives = tuple(name.strip() for name in field.split(";"))
    if not all(alternatives):
        msg = f"fields must be names separated by ';' (got {field!r})"
        raise ValueError(msg)
    return alternatives


def parse_fields(fields: tuple[object, ...]) -> tuple[tuple[str, ...], ...]:
    """Split each field spec (``"jpg;png"``) into its alternatives, checking them."""
    return tuple(_parse_field(field) for field in fields)


def pick(sample: Mapping[str, Any], alternatives: tuple[str, ...]) -> str:
    """The first of ``alternatives`` that ``sample`` has.

    Raises:
        MissingFieldError: The sample has none of them.
    """
    for name in alternatives:
        if name in sample:
            return name
    wanted = " or ".join(repr(name) for name in alternatives)
    present = sorted(name for name in sample if not name.startswith("__"))
    problem = f"no field {wanted}; the sample has {present}"
    raise MissingFieldError(
        problem,
        url=sample.get("__url__"),
        key=sample.get("__key__"),
        offset=getattr(sample, "offset", None),  # a ShardSample knows where it starts
    )


@functional_datapipe("to_tuple")
class TupleMaker(IterDataPipe[tuple[Any, ...]]):
    """Turns each sample dict into a tuple of some of its fields (functional name: ``to_tuple``).

    Always yields a tuple, even for one field (as WebDataset does). In a field,
    ``;`` separates alternatives: ``"jpg;png"`` takes ``jpg`` if the sample has it,
    else ``png``.

    Args:
        source_datapipe: Samples: dicts with ``__key__``, ``__url__`` and one entry per
            extension.
        *fields: Field names, each maybe with ``;``-separated alternatives.
        handler: What to do with a sample that lacks a field
            (:class:`~shardpipes.errors.MissingFieldError`): ``"raise"``, ``"warn"``
            (skip it with a warning), ``"ignore"`` (skip it) or a callable
            ``(exc, context) -> bool`` returning ``True`` to skip.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> samples = [{"__key__": "a", "__url__": "memory://s.tar", "jpg": "A", "cls": 0},
        ...            {"__key__": "b", "__url__": "memory://s.tar", "png": "B", "cls": 1}]
        >>> list(TupleMaker(IterableWrapper(samples), "jpg;png", "cls"))
        [('A', 0), ('B', 1)]
        >>> list(IterableWrapper(samples).to_tuple("__key__"))
        [('a',), ('b',)]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Mapping[str, Any]],
        *fields: str,
        handler: Handler = "raise",
    ) -> None:
        if not fields:
            msg = "fields must name at least one field (got none)"
            raise ValueError(msg)
        self.source_datapipe = source_datapipe
        self._alternatives = parse_fields(fields)
        self.fields = fields
        self.handler = check_handler(handler)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        for sample in self.source_datapipe:
            try:
                picked = SampleTuple(sample[pick(sample, names)] for names in self._alternatives)
            except MissingFieldError as exc:
                handle(self.handler, exc, stage="to_tuple", url=exc.url, key=exc.key)
                continue
            yield picked

    def __len__(self) -> int:
        return source_length(self)
