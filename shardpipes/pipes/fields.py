"""The ``to_tuple`` stage: pick fields of each sample, in order, into a tuple."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core import steps
from shardpipes._core.fields import map_fields, parse_fields, pick_tuple, rename
from shardpipes._core.handlers import Handler, check_handler
from shardpipes._core.stage import as_stage
from shardpipes.pipes._stage import Functions, Pipe, functional_form

__all__ = ["FieldMapper", "FieldRenamer", "TupleMaker"]


def takes_samples(
    source: IterDataPipe[Any], stage: str, way: str = "", *, batches: bool = True
) -> None:
    """Refuse, when the pipe is built, a stage of sample dicts given other items.

    Shard URLs (``list_shards``/``split_shards`` without ``open_tar``), tuples
    (``to_tuple``, a recipe with ``fields=``) and batches would fail deep inside on the
    first item. Asked of the source itself (its ``yields``).

    Args:
        source: The stage's source.
        stage: What to call the stage in the message.
        way: A last word on what to do instead.
        batches: Whether collated batches of dicts (a recipe's ``fields=()``,
            ``batch_size=``) do.

    Raises:
        TypeError: ``source`` yields shard URLs, tuples or batches.
    """
    kind = as_stage(source).yields
    if kind == "shards":
        found, fix = "shard URLs", "put .open_tar() before it"
    elif kind in ("tuples", "batches") or (kind == "collated" and not batches):
        found, fix = "tuples or batches", "put it before to_tuple, batch and collate"
    else:
        return
    msg = f"{stage} takes sample dicts; {type(source).__name__} yields {found}: {fix}{way}"
    raise TypeError(msg)


class StepPipe(Pipe):
    """A stage of sample dicts that applies a step to each (and to each fetched one)."""

    handler: Any

    def __init__(self, source_datapipe: IterDataPipe[Any], stage: str) -> None:
        takes_samples(source_datapipe, stage)
        super().__init__()
        self.source_datapipe = source_datapipe

    def _step(self) -> Callable[[Any], Any]:
        raise NotImplementedError

    def _iterate(self) -> Iterator[Any]:
        return steps.guarded(iter(self.source_datapipe), self._step(), self.handler)

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        return steps.guarded(self.sources()[0].fetch(refs), self._step(), self.handler)


@functional_form("to_tuple")
class TupleMaker(StepPipe):
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
        super().__init__(source_datapipe, "to_tuple")
        self._alternatives = parse_fields(fields)
        self.fields = fields
        self.handler = check_handler(handler)
        self.sources()[0].want(steps.wanted(self._alternatives))  # only these are decoded

    yields = "tuples"

    def _step(self) -> Callable[[Any], Any]:
        return functools.partial(pick_tuple, fields=self._alternatives)


@functional_form("rename_fields")
class FieldRenamer(StepPipe):
    """Renames the fields of each sample (functional name: ``rename_fields``).

    webdataset's ``.rename(image="jpg;png", label="cls")``: each new name takes the first
    of its ``;``-separated alternatives that the sample has, which leaves under its old
    name. ``keep=False`` leaves only the new names (and ``__key__``, ``__url__``). Holds
    nothing between samples, so a pipeline with it resumes as without.

    Args:
        source_datapipe: Sample dicts.
        keep: Keep the fields not renamed.
        handler: What to do with a sample that has none of a name's alternatives (as for
            ``to_tuple``).
        renames: New name → old name(s), as a dict.
        **more: New name → old name(s).

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> samples = [{"__key__": "a", "png": "A", "cls": 0}]
        >>> list(IterableWrapper(samples).rename_fields(image="jpg;png", label="cls"))
        [{'__key__': 'a', 'image': 'A', 'label': 0}]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Mapping[str, Any]],
        renames: Mapping[str, str] | None = None,
        /,
        *,
        keep: bool = True,
        handler: Handler = "raise",
        **more: str,
    ) -> None:
        names = {**(renames or {}), **more}
        if not names:
            msg = "rename_fields needs at least one new=old name, e.g. image='jpg;png'"
            raise ValueError(msg)
        super().__init__(source_datapipe, "rename_fields")
        self.names = {new: parse_fields((old,))[0] for new, old in names.items()}
        self.keep = bool(keep)
        self.handler = check_handler(handler)

    def _step(self) -> Callable[[Any], Any]:
        return functools.partial(rename, names=self.names, keep=self.keep)

    def want(self, fields: frozenset[str] | None) -> None:
        """Renamed fields keep other names below: nothing is left out."""


@functional_form("map_fields")
class FieldMapper(StepPipe):
    """Applies a function to some fields of each sample (functional name: ``map_fields``).

    webdataset's ``.map_dict(jpg=f, cls=g)``. Holds nothing between samples.

    Args:
        source_datapipe: Sample dicts.
        handler: What to do with a sample that lacks one of the fields (as for
            ``to_tuple``).
        mapping: Field name → function of its value, as a dict: ``map_fields({"cls":
            int})``.
        **more: Field name → function, as keywords: ``map_fields(jpg=f)``.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper([{"__key__": "a", "cls": b"3"}]).map_fields(cls=int))
        [{'__key__': 'a', 'cls': 3}]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Mapping[str, Any]],
        mapping: Mapping[str, Callable[[Any], Any]] | None = None,
        /,
        *,
        handler: Handler = "raise",
        **more: Callable[[Any], Any],
    ) -> None:
        functions = {**(mapping or {}), **more}
        bad = [name for name, function in functions.items() if not callable(function)]
        if not functions or bad:
            msg = f"map_fields takes field=function pairs (not callable: {bad})"
            raise TypeError(msg)
        super().__init__(source_datapipe, "map_fields")
        self.mapping = Functions(dict(functions))  # lambdas: not in torch's graph walk
        self.handler = check_handler(handler)

    def _step(self) -> Callable[[Any], Any]:
        return functools.partial(map_fields, functions=self.mapping.items)

    def want(self, fields: frozenset[str] | None) -> None:
        """A function may read any field: nothing is left out."""
