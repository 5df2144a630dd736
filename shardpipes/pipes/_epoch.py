"""Reading shards epoch by epoch, resumably: what ``open_tar`` and ``ShardStream`` hold.

:class:`ShardReading` runs a worker's epoch (:class:`~shardpipes._core.run.EpochRun`) and
saves and restores its position; :class:`ShuffleBuffer` holds a stage's shuffle-buffer
settings and :func:`buffer_seed` the seed a worker's buffer takes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterDataPipe, get_worker_info
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe

from shardpipes._core.elastic import buffer_seed_of
from shardpipes._core.policy import Stats
from shardpipes._core.run import EpochRun, Shuffling
from shardpipes._core.samples import Located
from shardpipes._core.split import ShardPart
from shardpipes._core.steps import InFlight
from shardpipes.errors import ShardNotFoundError
from shardpipes.pipes._stage import graph_pipes
from shardpipes.pipes.reader import ShardReader
from shardpipes.pipes.shards import ShardLister, ShardSplitter, splitters, worker_placement

__all__ = [
    "VERSION",
    "ShardReading",
    "ShuffleBuffer",
    "buffer_seed",
    "pipe_stats",
    "reading_of",
    "readings",
]

VERSION = 1


class ShuffleBuffer:
    """The shuffle-buffer settings of a stage (``ShardStream``, ``shuffle_samples``).

    Args:
        size: Samples held; below 2, no shuffling.
        seed: A fixed seed (see :func:`buffer_seed`), or ``None``.
    """

    def __init__(self, size: int, seed: int | None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            msg = f"buffer_size must be a non-negative int (got {size!r})"
            raise ValueError(msg)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            msg = f"seed must be an int or None (got {seed!r})"
            raise TypeError(msg)
        self.size, self.seed = size, seed
        self.enabled = True  # DataLoader(shuffle=False) turns it off
        self.shared: int | None = None  # the DataLoader's seed for the next epoch

    def __repr__(self) -> str:
        return f"ShuffleBuffer(size={self.size}, seed={self.seed}, enabled={self.enabled})"

    def shuffling(self, source: IterDataPipe[Any]) -> Shuffling:
        """``(size, seed function)`` for the epoch that begins; the DataLoader's seed is used up."""
        shared, self.shared = self.shared, None  # a later epoch without set_seed: a fresh seed
        if not self.enabled or self.size < 2:
            return 0, 0
        return self.size, functools.partial(buffer_seed, source, self.seed, shared)


def buffer_seed(source: IterDataPipe[Any], fixed: int | None, shared: int | None) -> int:
    """The seed of a worker's shuffle buffer for the epoch that has just been planned.

    A function of ``(seed, epoch, this worker's global index)``: the seed is ``fixed`` (the
    stage's own), else the fixed ``seed`` of the ``split_shards`` stage upstream, else
    ``shared`` (the DataLoader's seed, the same in every worker); the worker's index
    makes the workers' buffers differ. With none of those (no DataLoader), a fresh seed
    from torch's generator, as torch's ``shuffle`` takes.
    """
    stages = splitters(source)
    used = stages[0].used() if stages else None
    if fixed is None and stages and stages[0].seed is not None:
        fixed = stages[0].seed
    base = fixed if fixed is not None else shared
    if base is None:
        return int(torch.empty((), dtype=torch.int64).random_().item())
    epoch, worker = (used["epoch"], used["worker"]) if used else (0, worker_placement()[1])
    return buffer_seed_of(base, epoch, worker)


def _check_split(stages: list[Any], workers: int) -> None:
    """Raise if no stage (of those upstream) splits the shards between the workers."""
    if not any(isinstance(s, ShardingFilterIterDataPipe) for s in stages):
        msg = (
            f"the shards are read in {workers} DataLoader workers, but nothing splits them "
            "between the workers: each worker would read every shard, and every sample "
            "would come once per worker. Split the list of shards before open_tar: "
            ".split_shards() after list_shards(), or torch's .sharding_filter() on the file "
            "list (before FileOpener); one after open_tar would come too late"
        )
        raise ValueError(msg)


def as_part(item: Any) -> ShardPart:
    """What a reading stage reads, from an item of its source.

    A :class:`ShardPart` (``split_shards``), a URL (``list_shards``, ``IterableWrapper``),
    or a ``(URL, stream)`` pair, as torch's ``FileOpener`` and torchdata's
    ``FSSpecFileOpener`` give: its stream is closed, the shard is opened by URL (so that it
    can be read by range, resumed and retried).

    Raises:
        TypeError: Anything else, naming what it got.
    """
    if isinstance(item, ShardPart):
        return item
    if isinstance(item, str):
        return ShardPart(item)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        close = getattr(item[1], "close", None)
        if close is not None:
            close()
        return ShardPart(item[0])
    msg = (
        "open_tar reads shard URLs (list_shards, split_shards) or (URL, stream) pairs "
        f"(FileOpener); got a {type(item).__name__}: {str(item)[:100]}"
    )
    raise TypeError(msg)


def reading_of(stage: object) -> ShardReading | None:
    """The :class:`ShardReading` of a reading stage (``open_tar``, ``ShardStream``), else None."""
    reading = getattr(stage, "reading", None)
    return reading if isinstance(reading, ShardReading) else None


def readings(pipe: IterDataPipe[Any]) -> list[ShardReading]:
    """The :class:`ShardReading` of each reading stage of a pipeline, in a stable order."""
    found = (reading_of(stage) for stage in graph_pipes(pipe))
    return [reading for reading in found if reading is not None]


def pipe_stats(pipe: IterDataPipe[Any]) -> Stats:
    """What the reading stages upstream of ``pipe`` read and skipped in the last epoch.

    The counts of each stage's :class:`~shardpipes.ErrorPolicy` (one policy given to several
    stages counts once), summed over the DataLoader workers; for a chain whose last stage
    has no ``stats()`` of its own.

    Example:
        >>> import shardpipes as sp
        >>> sp.pipe_stats(sp.list_shards(["a.tar"]).open_tar().batch(2)).read
        0
    """
    policies = {id(r.reader.policy): r.reader.policy for r in readings(pipe)}
    return sum((p.stats() for p in policies.values()), Stats())


class ShardReading:
    """The reading of a pipe's shards, epoch by epoch, with ``state_dict``/``load_state_dict``.

    ``open_tar`` and ``ShardStream`` each hold one: it takes the parts from the pipe's
    source, runs the epoch (:class:`~shardpipes._core.run.EpochRun`), and saves and
    restores where it is, with the upstream ``split_shards`` states so that one state
    restores the shard order too.

    Args:
        source: The pipe of shard URLs or parts (``split_shards``).
        reader: Reads the parts.
    """

    def __init__(self, source: IterDataPipe[Any], reader: ShardReader) -> None:
        self.source, self.reader = source, reader
        self.run: EpochRun | None = None
        self.flight = InFlight()  # decode threads' samples in flight, for the state
        self._loaded: dict[str, Any] | None = None
        self._at_start: dict[str, Any] | None = None
        self._listers: list[ShardLister] = []
        self._splitters: list[ShardSplitter] | None = None  # found at the first begin()

    def begin(self, shuffling: Shuffling = (0, 0)) -> Iterator[Located]:
        """Start an epoch (from a loaded state, if any): its samples, as ``Located``.

        Args:
            shuffling: ``(buffer size, seed)`` of the epoch's shuffle buffer (see
                :class:`~shardpipes._core.run.EpochRun`); by default none.
        """
        self.run, loaded, self._loaded = None, self._loaded, None
        self.flight = InFlight()
        self._at_start = loaded or self._fresh()
        info = get_worker_info()
        stages = graph_pipes(self.source)
        self._splitters = [stage for stage in stages if isinstance(stage, ShardSplitter)]
        if info is not None and info.num_workers > 1:
            _check_split(stages, info.num_workers)
        self._listers = [stage for stage in stages if isinstance(stage, ShardLister)]
        for lister in self._listers:
            lister.defer_check()  # checked while the first shard is fetched
        self.reader.policy.begin(*((info.id, info.num_workers) if info is not None else (0, 1)))
        return self._located((loaded or {}).get("position"), shuffling)

    def _located(
        self, position: Mapping[str, Any] | None, shuffling: Shuffling
    ) -> Iterator[Located]:
        parts = (as_part(item) for item in self.source)
        size, seed = shuffling
        run = EpochRun(
            self.reader, parts, buffer_size=size, seed=seed, position=position, flight=self.flight
        )
        self.run = run
        located = run.located()
        try:
            first = next(located, None)
        except ShardNotFoundError:
            self._checked()  # the check's error names and counts every missing shard
            raise
        self._checked()  # every shard exists, before the epoch's first sample
        if first is not None:
            yield first
            yield from located
        run.done = True
        self.reader.policy.end()

    def _checked(self) -> None:
        for lister in self._listers:
            lister.checked()

    def pending(self) -> bool:
        """Whether a loaded state waits for an epoch to begin."""
        return self._loaded is not None

    def await_epoch(self) -> None:
        """An epoch was begun for this reading (by a ``mix``) that reads only when drawn.

        Until it reads, its state is that epoch's start (or the state loaded for it), not
        where the last epoch ended: a checkpoint then would resume it at that end.
        """
        if self._loaded is None:
            self.run, self._at_start = None, self.upcoming_state()

    def drop_loaded(self) -> None:
        """Drop a loaded state that no epoch began from; its epoch counts as done."""
        if self._loaded is not None:
            for splitter in self.splitters():
                splitter.drop_pinned()
            self._loaded = None

    def stats(self) -> Stats:
        """What the current (or last) epoch read and skipped, over all DataLoader workers."""
        return self.reader.policy.stats()

    def _fresh(self) -> dict[str, Any]:
        return {"version": VERSION, "splitters": self._splitter_states(), "position": None}

    def splitters(self) -> list[ShardSplitter]:
        """The ``split_shards`` stages upstream.

        Found once, at the first epoch: a snapshot taken in a ``prefetch_items`` thread
        must not walk the graph.
        """
        if self._splitters is None:
            return splitters(self.source)
        return self._splitters

    def _splitter_states(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.splitters()]

    def state_dict(self) -> dict[str, Any]:
        """Where the reading is in its epoch, as plain data (see the pipes' ``state_dict``)."""
        if self.run is None:  # nothing read in this epoch yet
            return dict(self._loaded or self._at_start or self._fresh())
        return {
            "version": VERSION,
            "splitters": self._splitter_states(),
            "position": self.run.position(),
        }

    def upcoming_state(self) -> dict[str, Any]:
        """The state of the epoch about to begin here: a loaded state, else its start."""
        if self._loaded is not None:
            return dict(self._loaded)
        splitters = [s.upcoming_state() for s in self.splitters()]
        return {"version": VERSION, "splitters": splitters, "position": None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume, at the next epoch begun, from a :meth:`state_dict`.

        Raises:
            ValueError: If the state is not one of this kind and version, or its
                ``split_shards`` states do not fit; a state of another shard list, seed,
                split or worker raises when iteration starts, saying which.
        """
        if not isinstance(state, Mapping) or state.get("version") != VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            msg = f"not a shardpipes reading state of version {VERSION} (got version {found!r})"
            raise ValueError(msg)
        stages = self.splitters()
        saved = state.get("splitters", [])
        if len(saved) != len(stages):
            msg = f"the state has {len(saved)} split_shards stages, this pipe {len(stages)}"
            raise ValueError(msg)
        for splitter, sub in zip(stages, saved, strict=True):
            splitter.load_state_dict(sub)
        self._loaded, self.run = dict(state), None
