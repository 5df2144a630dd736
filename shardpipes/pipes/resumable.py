"""``Resumable``: a pipeline handed to torchdata's ``StatefulDataLoader`` with its state visible."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch.utils.data import IterableDataset, IterDataPipe, get_worker_info, graph_settings
from torch.utils.data.datapipes.iter import Batcher, Filter, IterableWrapper, Mapper, ShardingFilter

from shardpipes._core.policy import Stats
from shardpipes.pipes._epoch import VERSION, ShardReading, pipe_stats, reading_of, readings
from shardpipes.pipes._stage import graph_pipes
from shardpipes.pipes.decode import SampleDecoder
from shardpipes.pipes.fields import FieldMapper, FieldRenamer, TupleMaker
from shardpipes.pipes.flow import FORMS, ItemPrefetcher, Positioned
from shardpipes.pipes.mix import Mixer
from shardpipes.pipes.shards import (
    ShardLister,
    ShardSplitter,
    distributed,
    set_epoch,
    worker_placement,
)
from shardpipes.pipes.shuffle import SampleShuffler

__all__ = [
    "Positions",
    "Resumable",
    "load_pipeline_state",
    "pipeline_state",
    "reading_stages",
    "reads_shards",
]

T = TypeVar("T")


class Resumable(IterableDataset[T]):
    """Wrap a stateful pipe (a recipe, a ``ShardStream``) for ``StatefulDataLoader``.

    torch's ``DataLoader``, and torchdata's ``StatefulDataLoader`` after it, wrap every
    ``IterDataPipe`` in a serialization wrapper that hides its ``state_dict``: handed a
    pipe directly, ``StatefulDataLoader`` falls back to re-reading the epoch up to where it
    stopped. This wrapper is a plain ``IterableDataset`` that forwards ``state_dict`` and
    ``load_state_dict`` to the pipe, and does when iterated what the DataLoader does for a
    pipe: shards it over DataLoader workers × ``torch.distributed`` ranks and seeds its
    shuffle buffers (from the worker's seed). The shard order is a function of the
    pipe's ``seed`` (0 when not given) and epoch, never of the loader's seed, so ranks
    agree without talking: call :meth:`set_epoch` every epoch.

    Resumable pipelines: every streaming recipe and ``ShardStream``; chains of
    ``list_shards`` → ``split_shards`` → ``open_tar`` → ``decode`` / ``to_tuple`` / ``map``
    / ``filter`` → ``batch`` → ``collate``. Not torch's ``shuffle`` (its buffer of samples
    cannot be put in a small state): use a recipe's or ``ShardStream``'s ``buffer_size``.

    Args:
        pipe: The pipeline.

    Raises:
        ValueError: If the pipeline holds a stage that cannot be resumed.

    Example:
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> import shardpipes as sp
        >>> pipe = sp.recipes.tar_shards("data/train-*.tar", seed=17, batch_size=64)
        >>> loader = StatefulDataLoader(sp.Resumable(pipe), batch_size=None, num_workers=4)
    """

    def __init__(self, pipe: IterDataPipe[T]) -> None:
        if not isinstance(pipe, IterDataPipe):
            msg = f"Resumable wraps an IterDataPipe (got {type(pipe).__name__})"
            raise TypeError(msg)
        self._found: Positions | None = Positions(pipe)  # fails now if it cannot be resumed
        self.pipe = pipe
        self._ranks: tuple[int, int] | None = None
        self._upcoming = False  # iter() was called, and nothing read since

    def __getstate__(self) -> dict[str, Any]:
        # pickled in the main process for the DataLoader's workers: take the rank along,
        # since a worker started by "spawn" has no process group to ask
        state = {**self.__dict__, "_found": None}  # found again where it is used
        world_size, rank = distributed()
        if world_size > 1:
            state["_ranks"] = (world_size, rank)
        return state

    def __iter__(self) -> Iterator[T]:
        total, worker = worker_placement(self._ranks)
        graph_settings.apply_sharding(self.pipe, total, worker)
        info = get_worker_info()
        seed = info.seed if info is not None else int(torch.empty((), dtype=torch.int64).random_())
        rng = torch.Generator().manual_seed(seed)
        seen: set[int] = set()
        for stage in graph_pipes(self.pipe):
            set_seed = getattr(stage, "set_seed", None)
            if id(stage) in seen or isinstance(stage, ShardSplitter) or not callable(set_seed):
                continue  # the shard order is the splitter's own (seed, epoch)
            seen.add(id(stage))
            set_seed(int(torch.empty((), dtype=torch.int64).random_(generator=rng)))
        self._upcoming = True
        return self._items(iter(self.pipe))

    def _items(self, items: Iterator[T]) -> Iterator[T]:
        self._upcoming = False  # the iteration begins: its stages hold their own states
        yield from items

    def _positions(self) -> Positions:
        if self._found is None:
            self._found = Positions(self.pipe)
        return self._found

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of every ``split_shards`` stage of the pipe."""
        set_epoch(self.pipe, epoch)

    def stats(self) -> Stats:
        """What the pipe read and skipped in the last epoch, over all the loader's workers."""
        return pipe_stats(self.pipe)

    def state_dict(self) -> dict[str, Any]:
        """The states of the pipe's reading stages (``open_tar``, ``ShardStream``)."""
        return self._positions().pipeline_state(upcoming=self._upcoming)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the pipe from a saved state at the next iteration.

        Raises:
            ValueError: If the state is not a state of this pipeline's shape.
        """
        self._positions().load(state)


class Positions:
    """The stages of a pipeline that hold a position, found once, asked as often as needed.

    The reading stages (``open_tar``, ``ShardStream``), the mixes, and the stages with a
    count of their own (``limit_samples``, ``cycle_epochs``, ``prefetch_items``). The
    stages upstream of a ``prefetch_items`` run ahead of what was delivered: their states
    are the ones it delivered last (its snapshot), not their live ones.

    Args:
        pipe: The pipeline.

    Raises:
        ValueError: If the pipeline cannot be resumed (see :func:`reading_stages`).
    """

    def __init__(self, pipe: IterDataPipe[Any]) -> None:
        graph = graph_pipes(pipe)
        _check_resumable(graph)
        self.readings = [r for r in map(reading_of, graph) if r is not None]
        self.mixes = [s for s in graph if isinstance(s, Mixer)]
        self.held = [s for s in graph if isinstance(s, Positioned)]
        self.prefetchers = [s for s in self.held if isinstance(s, ItemPrefetcher)]

    def _all(self) -> list[ShardReading | Mixer | Positioned]:
        return [*self.readings, *self.mixes, *self.held]

    def states(self, *, upcoming: bool = False) -> dict[int, Any]:
        """Every stage's state, by ``id`` of the stage (of its reading, for a reading stage).

        Args:
            upcoming: An iteration has been asked for and has read nothing yet: the
                states of its start (``upcoming_state``), not those of the last one.
        """
        if upcoming:
            return {id(stage): stage.upcoming_state() for stage in self._all()}
        out: dict[int, Any] = {}
        snapshots = [s for s in (p.upstream_states() for p in self.prefetchers) if s]
        # an outer prefetch's snapshot holds the inner ones' stages (and them): it goes first
        for snapshot in sorted(snapshots, key=len, reverse=True):
            for key, value in snapshot.items():
                out.setdefault(key, value)
        for stage in self._all():
            if id(stage) not in out:
                if isinstance(stage, ShardReading):
                    out[id(stage)] = stage.state_dict()
                else:  # a count of its own; its state_dict() is the whole pipeline's
                    out[id(stage)] = stage.own_state()
        return out

    def pipeline_state(self, *, upcoming: bool = False) -> dict[str, Any]:
        """The pipeline's state (see :func:`pipeline_state` and :meth:`states`)."""
        states = self.states(upcoming=upcoming)
        state: dict[str, Any] = {
            "version": VERSION,
            "stages": [states[id(r)] for r in self.readings],
        }
        if self.mixes:
            state["mixes"] = [states[id(m)] for m in self.mixes]
        if self.held:
            state["held"] = [states[id(h)] for h in self.held]
        return state

    def load(self, state: Mapping[str, Any]) -> None:
        """Load a :meth:`pipeline_state` (see :func:`load_pipeline_state`)."""
        if not isinstance(state, Mapping) or state.get("version") != VERSION:
            msg = f"not a shardpipes pipeline state of version {VERSION}: {str(state)[:200]}"
            raise ValueError(msg)
        saved = state.get("stages")
        if not isinstance(saved, list):
            msg = f"not a shardpipes pipeline state (no list of stages): {str(state)[:200]}"
            raise ValueError(msg)
        if len(saved) != len(self.readings):
            msg = f"the state has {len(saved)} reading stages, this pipeline {len(self.readings)}"
            raise ValueError(msg)
        saved_mixes, saved_held = state.get("mixes", []), state.get("held", [])
        if len(saved_mixes) != len(self.mixes):
            msg = f"the state has {len(saved_mixes)} mix stages, this pipeline {len(self.mixes)}"
            raise ValueError(msg)
        names = [type(h).__name__ for h in self.held]
        if len(saved_held) != len(self.held):
            msg = (
                f"the state has {len(saved_held)} limit/cycle/prefetch stages, this pipeline "
                f"{len(self.held)} ({', '.join(names) or 'none'})"
            )
            raise ValueError(msg)
        for holder, sub in zip(self.held, saved_held, strict=True):
            holder.load_own(sub)
        for mixer, sub in zip(self.mixes, saved_mixes, strict=True):
            mixer.load_own(sub)
        for stage, sub in zip(self.readings, saved, strict=True):
            stage.load_state_dict(sub)

    def pending(self) -> bool:
        """Whether a loaded state waits for an iteration to begin."""
        return any(stage.pending() for stage in self._all())

    def drop_loaded(self) -> None:
        """Drop the loaded states no iteration began from (their epochs count as done)."""
        for stage in self._all():
            stage.drop_loaded()


def pipeline_state(pipe: IterDataPipe[Any]) -> dict[str, Any]:
    """The state of a pipeline: its reading stages' states, between two items it yields.

    With the mixes' draws and the limit, cycle and prefetch stages' counts.

    Raises:
        ValueError: If the pipeline cannot be resumed (see :func:`reading_stages`).
    """
    return Positions(pipe).pipeline_state()


def mixers(pipe: IterDataPipe[Any]) -> list[Mixer]:
    """The ``mix`` stages of a pipeline, in a stable order."""
    return [s for s in graph_pipes(pipe) if isinstance(s, Mixer)]


def load_pipeline_state(pipe: IterDataPipe[Any], state: Mapping[str, Any]) -> None:
    """Load a :func:`pipeline_state` into a pipeline of the same shape (at its next iteration).

    Raises:
        ValueError: If the pipeline cannot be resumed, or the state is not one of its shape.
    """
    Positions(pipe).load(state)


# stages that hold no item between two items the pipeline yields: a state taken there is
# the reading stages' state alone (a batch is empty again once the pipeline yields it)
_PASSING = (
    Mapper,
    Filter,
    Batcher,
    IterableWrapper,
    ShardingFilter,
    SampleDecoder,
    TupleMaker,
    FieldRenamer,
    FieldMapper,
    SampleShuffler,  # its buffer is in the open_tar stage's state
    Mixer,  # its draws' position is in the pipeline's state ("mixes")
    Positioned,  # limit_samples, cycle_epochs, prefetch_items: their counts too ("held")
)


def reading_stages(pipe: IterDataPipe[Any]) -> list[ShardReading]:
    """The readings of the pipeline's reading stages, after checking that it is resumable.

    Raises:
        ValueError: If a stage keeps items in memory between yields (torch's ``shuffle``,
            ``fork``, ``zip``…) or is unknown: its state could not be restored.
    """
    _check_resumable(graph_pipes(pipe))
    return readings(pipe)


def _check_resumable(graph: list[IterDataPipe[Any]]) -> None:
    for stage in graph:
        if reading_of(stage) is None and not isinstance(
            stage, (ShardLister, ShardSplitter, *_PASSING)
        ):
            msg = (
                f"a pipeline with {type(stage).__name__} cannot be resumed exactly: it holds "
                "items between two batches that a checkpoint cannot describe. Resumable "
                "stages: list_shards, split_shards, open_tar, shuffle_samples, decode, "
                "rename_fields, map_fields, to_tuple, map, filter, batch, collate, "
                "limit_samples, cycle_epochs, prefetch_items, and the recipes. For a sample "
                "shuffle buffer use .shuffle_samples(buffer_size=N) right after open_tar "
                "(or a recipe's buffer_size), which saves its buffer as byte ranges; if you "
                "do not resume, use torch.utils.data.DataLoader"
            )
            raise ValueError(msg)
    for stage in graph:
        reading = reading_of(stage)
        if reading is None:
            continue
        before = [s for s in graph_pipes(reading.source) if isinstance(s, Positioned)]
        if before:
            name = FORMS[type(before[0])]
            msg = (
                f"{name} stands before {type(stage).__name__}, where its items are shards, "
                f"not samples: a checkpoint there cannot be resumed. Put {name} after "
                "open_tar (or after the recipe)"
            )
            raise ValueError(msg)


def reads_shards(pipe: IterDataPipe[Any]) -> bool:
    """Whether the pipeline has a reading stage (``open_tar``, ``ShardStream``…)."""
    return bool(readings(pipe))
