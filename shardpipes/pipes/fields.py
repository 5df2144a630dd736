"""The ``to_tuple`` stage: pick fields of each sample, in order, into a tuple."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe, functional_datapipe

from shardpipes._core import steps
from shardpipes._core.fields import parse_fields, pick_tuple
from shardpipes._core.handlers import Handler, check_handler
from shardpipes.pipes._length import source_length
from shardpipes.pipes._stage import SampleStage, upstream

__all__ = ["TupleMaker"]


@functional_datapipe("to_tuple")
class TupleMaker(SampleStage):
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
        super().__init__()
        self.source_datapipe = source_datapipe
        self._alternatives = parse_fields(fields)
        self.fields = fields
        self.handler = check_handler(handler)

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[tuple[Any, ...]]:
        pick = functools.partial(pick_tuple, fields=self._alternatives)
        source = upstream(self.source_datapipe, steps.wanted(self._alternatives))
        return steps.guarded(source, pick, self.handler)

    def __len__(self) -> int:
        return source_length(self)
