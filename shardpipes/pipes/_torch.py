"""torch core's pipes, seen as stages: the one place that knows them.

A chain puts torch's ``map``, ``filter``, ``batch`` and ``collate`` between shardpipes'
stages, and the shard URLs often come from torch's own sources (``IterableWrapper``,
``FileLister``, ``sharding_filter``, ``FileOpener``). :func:`adapt` gives each a
:class:`~shardpipes._core.stage.Stage` view: the protocol reaches through it to the stage
below, its iteration is torch's own. A pipe that holds items a state cannot describe
(torch's ``shuffle``, ``fork``, ``zip``…) is refused by name, when its state is asked.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from torch.utils.data import DataLoader, Dataset, IterableDataset, IterDataPipe, get_worker_info
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper
from torch.utils.data.datapipes.iter import (
    Batcher,
    FileLister,
    FileOpener,
    Filter,
    IterableWrapper,
    Mapper,
    ShardingFilter,
    Shuffler,
)

from shardpipes._core.stage import Leaf, Stage, as_stage, install_adapter, no_length


def distributed() -> tuple[int, int]:
    """``(world size, rank)`` of ``torch.distributed``, or ``(1, 0)`` when not initialized."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def worker_placement() -> tuple[int, int]:
    """``(total workers, global index)`` from the DataLoader worker and the distributed rank."""
    from shardpipes._core.split import global_worker

    info = get_worker_info()
    num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
    world_size, rank = distributed()
    return global_worker(world_size, rank, num_workers, worker_id)


def check_process_group(total: int) -> None:
    """Refuse to read as one process when the environment says there are several.

    ``torchrun`` sets ``WORLD_SIZE``; without ``init_process_group`` the split cannot see
    the other ranks, and every rank would read every sample. A warning would scroll by
    once per rank and worker while the job trains on duplicates: this is an error.

    Args:
        total: The workers × ranks the split found.

    Raises:
        ValueError: ``WORLD_SIZE`` is above 1 and the split found one rank.
    """
    given = os.environ.get("WORLD_SIZE", "1")
    info = get_worker_info()
    world = total // (info.num_workers if info is not None else 1)
    if world == 1 and given.isdigit() and int(given) > 1:
        msg = (
            f"WORLD_SIZE={given} is set (as torchrun does), but torch.distributed is not "
            "initialized, so every process would read every sample: call "
            "torch.distributed.init_process_group() (backend 'gloo' on CPU, 'nccl' on GPUs) "
            "before the loader starts, or unset WORLD_SIZE for one process to read it all"
        )
        raise ValueError(msg)


class _View(Stage):
    """A torch pipe as a stage: its iteration is torch's, the protocol goes to its source."""

    def __init__(self, pipe: IterDataPipe[Any], source: Any) -> None:
        self.pipe, self.source_datapipe = pipe, source

    def __iter__(self) -> Iterator[Any]:
        return iter(self.pipe)

    def references(self) -> Iterator[Any]:
        return self.sources()[0].references()

    def want(self, fields: frozenset[str] | None) -> None:
        """A function of torch's may use any field: nothing below is told to drop any."""


class _OneForOne(_View):
    """``map``, ``collate`` (and torch's serialization wrapper): one item out per item in."""

    @property
    def yields(self) -> str | None:
        below = self.sources()[0]
        if below.yields != "batches":
            return None  # a function of the user's
        # collated batches: of tuples, tuples again; of dicts, dicts of batched fields
        return "tuples" if below.sources()[0].yields == "tuples" else "collated"

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        items = self.sources()[0].fetch(refs)
        apply = getattr(self.pipe, "_apply_fn", None)
        return items if apply is None else map(apply, items)


class _Filtering(_View):
    """``filter``: which items it keeps is known only from the items themselves."""

    exact = False

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        return filter(self.pipe._apply_filter_fn, self.sources()[0].fetch(refs))

    def length(self, total: int, worker: int | None) -> int:
        no_length(self.pipe, "shardpipes cannot count what a filter keeps before reading")


class _Batching(_View):
    """``batch``: lists of ``batch_size`` items (the last shorter unless ``drop_last``)."""

    yields = "batches"

    def _batches(self, items: Iterator[Any]) -> Iterator[Any]:
        size, drop_last = self.pipe.batch_size, self.pipe.drop_last
        while batch := list(itertools.islice(items, size)):
            if len(batch) == size or not drop_last:
                yield self.pipe.wrapper_class(batch)

    def references(self) -> Iterator[Any]:
        return self._batches(self.sources()[0].references())

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        return self._batches(self.sources()[0].fetch(refs))

    def length(self, total: int, worker: int | None) -> int:
        if worker is None:  # each worker batches its own items
            return sum(self.length(total, w) for w in range(total))
        n, size = self.sources()[0].length(total, worker), int(self.pipe.batch_size)
        return n // size if self.pipe.drop_last else math.ceil(n / size)

    def regroup(self, refs: Iterable[Any]) -> Iterator[Any]:
        return self._batches(self.sources()[0].regroup(refs))


class _Leaf(Leaf, _View):
    """A source of shard URLs (``IterableWrapper``, ``FileLister``, ``FileOpener``…)."""

    def __init__(self, pipe: IterDataPipe[Any], split: bool, yields: str | None) -> None:
        _View.__init__(self, pipe, None)
        self.split = split
        self.yields = yields  # shard URLs from a lister; from an IterableWrapper, not known

    def placement(self) -> tuple[int, int]:
        return worker_placement()

    def length(self, total: int, worker: int | None) -> int:
        if self.yields is None:  # items, not shards: every worker reads all (or its share)
            source = getattr(self.pipe, "source_datapipe", None)  # sharding_filter's
            n = len(source if source is not None else self.pipe)
            if source is not None:
                return n if worker is None else len(range(worker, n, total))
            return n * total if worker is None else n
        no_length(self.pipe, "its shards are not split by split_shards")


class _Refused(_View):
    """A pipe that holds items between two of its own a state cannot describe."""

    def sources(self) -> list[Stage]:
        if self.source_datapipe is None:  # several sources (zip, mux…): nothing to reach
            self._refuse()
        return super().sources()

    def _refuse(self) -> NoReturn:
        name = type(self.pipe).__name__
        way = (
            "for a sample shuffle buffer use .shuffle_samples(buffer_size=N) after open_tar "
            "(or a recipe's buffer_size), which saves its buffer as byte ranges"
            if isinstance(self.pipe, Shuffler)
            else "resumable stages are shardpipes' own and torch's map, filter, batch, collate"
        )
        msg = (
            f"a pipeline with {name} cannot be resumed exactly: it holds items between two "
            f"batches that a checkpoint cannot describe. {way}; if you do not resume, use "
            "torch.utils.data.DataLoader"
        )
        raise ValueError(msg)

    def state(self) -> Any:
        self._refuse()

    def reset(self, state: Any = None) -> None:
        if state is not None:
            self._refuse()
        super().reset(None)

    def references(self) -> Iterator[Any]:
        self._refuse()

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        self._refuse()


#: torch's pipes and their stage views, by class: the first of a pipe's classes (its MRO)
#: found here makes its view (``collate`` is a ``map``, our loader wrapper torch's)
_VIEWS: dict[type, Callable[[Any], Stage]] = {
    _IterDataPipeSerializationWrapper: lambda pipe: _OneForOne(pipe, pipe._datapipe),
    Mapper: lambda pipe: _OneForOne(pipe, pipe.datapipe),
    Filter: lambda pipe: _Filtering(pipe, pipe.datapipe),
    Batcher: lambda pipe: _Batching(pipe, pipe.datapipe),
    IterableWrapper: lambda pipe: _Leaf(pipe, split=False, yields=None),
    FileLister: lambda pipe: _Leaf(pipe, split=False, yields="shards"),
    ShardingFilter: lambda pipe: _Leaf(
        pipe, split=True, yields=as_stage(pipe.source_datapipe).yields
    ),
    FileOpener: lambda pipe: _Leaf(pipe, split=as_stage(pipe.datapipe).split, yields="shards"),
}


def require_pipeline(given: Any, what: str) -> IterDataPipe[Any]:
    """``given`` if it is a pipeline; else a TypeError saying what ``what`` takes instead."""
    if isinstance(given, IterDataPipe):
        return given
    name = type(given).__name__
    if isinstance(given, DataLoader):
        way = "give it the pipe itself (loader.dataset); the Loader of torchdata.nodes loads"
    elif isinstance(given, Dataset) and not isinstance(given, IterableDataset):
        way = (
            "this is a map-style dataset: use torchdata.nodes.MapStyleWrapper(dataset, "
            "sampler), which resumes by its sampler's position"
        )
    else:
        way = (
            "give it a chain (sp.list_shards(...).split_shards().open_tar()...) or a "
            "streaming recipe (sp.recipes.tar_shards); for any other iterable, "
            "torchdata.nodes.IterableWrapper"
        )
    msg = f"{what} takes a shardpipes pipeline (got {name}): {way}"
    raise TypeError(msg)


def adapt(pipe: Any) -> Stage:
    """A stage view of a pipe that is not a shardpipes stage (see the module docstring).

    Raises:
        TypeError: ``pipe`` is not a DataPipe.
    """
    view = next((_VIEWS[c] for c in type(pipe).__mro__ if c in _VIEWS), None)
    if view is not None:
        return view(pipe)
    require_pipeline(pipe, "a stage's source")
    source = getattr(pipe, "source_datapipe", getattr(pipe, "datapipe", None))
    return _Refused(pipe, source if isinstance(source, IterDataPipe) else None)


install_adapter(adapt)
