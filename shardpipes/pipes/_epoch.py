"""Resumable reading: what ``open_tar`` and ``ShardStream`` share to save and restore an epoch.

:class:`EpochRun` reads a worker's shard parts (taken lazily from the pipe's source, so an
endless source works too), shuffles through a buffer if asked, and knows, at every point
where the pipe yields, where it is — as a small, plain state:

* **cursor**: how many parts were taken, and the byte offset (uncompressed) and shard
  index of the next sample in the last one, with a digest of the parts so far;
* **shuffle**: the buffer's samples as references ``(shard, start, end)``, not their
  bytes, and the buffer's ``random.Random`` state;
* **ahead**: samples taken out of the buffer but not yet yielded (decode threads read a
  few ahead), as references too.

Restoring re-reads only the referenced samples (one ranged read each; a gzip shard is
decompressed once from its start) and goes on from the cursor: nothing consumed is read
again, beyond the buffer's samples and the rest of the cursor's read block.
:class:`ResumableReading` gives a pipe ``state_dict`` / ``load_state_dict`` on top.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterDataPipe, get_worker_info
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes._core.policy import Stats
from shardpipes._core.samples import Located
from shardpipes._core.split import ShardPart
from shardpipes.pipes.shards import ShardSplitter, worker_placement

if TYPE_CHECKING:
    from shardpipes.pipes.tar import ShardReader

__all__ = [
    "VERSION",
    "EpochRun",
    "ResumableReading",
    "ShuffleBuffer",
    "Shuffling",
    "buffer_seed",
    "pipe_stats",
    "splitters",
]

VERSION = 1

Shuffling = tuple[int, "int | Callable[[], int]"]  # (buffer size, seed or a function of it)


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
    digest = hashlib.sha256(f"buffer:{base}:{epoch}:{worker}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class EpochRun:
    """The reading and shuffling of one epoch, with its position.

    Args:
        reader: Reads parts (with byte spans) and re-reads samples by range.
        parts: This worker's parts for the epoch, in order (read lazily).
        buffer_size: Shuffle buffer size; below 2, no shuffling.
        seed: Seed of the buffer's generator, or a function giving it, called when the
            first part has been taken (once the split, hence the epoch and the worker, is
            known).
        position: A saved :meth:`position` to resume from.
    """

    def __init__(
        self,
        reader: ShardReader,
        parts: Iterable[ShardPart],
        *,
        buffer_size: int,
        seed: int | Callable[[], int],
        position: Mapping[str, Any] | None = None,
    ) -> None:
        self.reader = reader
        self.parts = parts
        self.size = buffer_size if buffer_size >= 2 else 0
        self.rng = random.Random(0)
        self.seed = seed  # a function: called at the first part (not when restoring)
        if not callable(seed):
            self.rng.seed(seed)
        self.taken = 0  # parts taken from `parts`; the last one is being read
        self.digest = hashlib.sha1(usedforsecurity=False)  # of the parts taken
        self.last: Located | None = None  # the last sample read from the part being read
        self.at: tuple[int, int] | None = None  # where to resume that part
        self.buffer: list[Located] = []
        self.draining = False  # the parts are all read; the buffer empties
        self.ahead: list[Located] = []  # restored samples to give out before anything else
        self.chunk: list[Located] = []  # decode threads: taken out of the buffer ...
        self.chunk_done = 0  # ... of which this many are yielded
        self.done = False
        self.restoring: Mapping[str, Any] | None = position
        if position is not None:
            self._restore(position)

    # -- running --------------------------------------------------------------------------

    def located(self) -> Iterator[Located]:
        """The epoch's samples, shuffled, as ``Located`` tuples."""
        if self.done:  # restored from the end of an epoch
            return
        while self.ahead:
            yield self.ahead.pop(0)
        source = itertools.chain.from_iterable(self._read())
        if not self.size:
            for loc in source:
                self.last = loc
                yield loc
            return
        buffer, rng, size = self.buffer, self.rng, self.size
        if not self.draining:
            # as torch's Shuffler: swap each new sample with a random buffered one
            for loc in source:
                self.last = loc
                if len(buffer) < size:
                    buffer.append(loc)
                    continue
                i = rng.randrange(size)
                buffer[i], loc = loc, buffer[i]
                yield loc
            rng.shuffle(buffer)
            self.draining = True
        while buffer:
            yield buffer.pop()

    def _read(self) -> Iterator[Iterator[Located]]:
        """Each part's samples in turn (skipping, when restoring, the parts done before)."""
        saved = self.restoring
        skip = saved["cursor"][0] if saved is not None else 0
        if self.draining:
            return
        for n, part in enumerate(self.parts, start=1):
            if n == 1 and saved is None and self.size and callable(self.seed):
                self.rng.seed(self.seed())
            self.digest.update(repr(tuple(part)).encode())
            if n < skip:
                continue
            at = None
            if n == skip and saved is not None:
                self._check(saved)
                at = self.at
            self.taken, self.last, self.at, self.restoring = n, None, at, None
            yield self.reader.samples(part, spans=True, at=at)
        if self.restoring is not None:  # fewer parts than when it was saved
            self._check(self.restoring)

    def _check(self, saved: Mapping[str, Any]) -> None:
        if saved["digest"] != self.digest.hexdigest()[:16]:
            msg = (
                f"the state was saved for another split of the shards (its first "
                f"{saved['cursor'][0]} parts differ from this worker's): it needs the same "
                "shards, seed, epoch, even= and numbers of workers and ranks"
            )
            raise ValueError(msg)

    # -- state ----------------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """Where the epoch is, as plain data (see the module docstring)."""
        shards: dict[str, int] = {}

        def refs(locs: Sequence[Located]) -> list[list[int]]:
            return [
                [shards.setdefault(loc.sample["__url__"], len(shards)), loc.start, loc.end]
                for loc in locs
            ]

        digest = self.digest.hexdigest()[:16]
        if self.restoring is not None:  # restored, no part read since
            cursor, digest = list(self.restoring["cursor"]), self.restoring["digest"]
        elif self.last is not None:
            cursor = [self.taken, self.last.end, self.last.nth + 1]
        elif self.at is not None:
            cursor = [self.taken, *self.at]
        else:
            cursor = [self.taken, -1, -1]  # the start of the part
        return {
            "cursor": cursor,
            "digest": digest,
            "draining": self.draining,
            "done": self.done,
            "buffer": refs(self.buffer),
            "ahead": refs([*self.ahead, *self.chunk[self.chunk_done :]]),
            "shards": list(shards),
            "rng": _rng_state(self.rng),
        }

    def _restore(self, position: Mapping[str, Any]) -> None:
        _, offset, index = position["cursor"]
        self.at = None if offset < 0 else (offset, index)
        self.draining, self.done = position["draining"], position["done"]
        version, internal, gauss = position["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        shards = position["shards"]
        wanted: dict[int, list[tuple[int, int]]] = {}
        for shard, start, end in (*position["buffer"], *position["ahead"]):
            wanted.setdefault(shard, []).append((start, end))
        found = {shard: self.reader.fetch(shards[shard], spans) for shard, spans in wanted.items()}

        def rebuild(refs: list[list[int]]) -> list[Located]:
            return [Located(found[s][start], start, end, -1) for s, start, end in refs]

        self.buffer = rebuild(position["buffer"])
        self.ahead = rebuild(position["ahead"])


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def splitters(pipe: IterDataPipe[Any]) -> list[ShardSplitter]:
    """The ``split_shards`` stages upstream of ``pipe``, in a stable order."""
    return [s for s in get_all_graph_pipes(traverse_dps(pipe)) if isinstance(s, ShardSplitter)]


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
    policies = {
        id(s.reader.policy): s.reader.policy
        for s in get_all_graph_pipes(traverse_dps(pipe))
        if isinstance(s, ResumableReading)
    }
    return sum((p.stats() for p in policies.values()), Stats())


class ResumableReading:
    """``state_dict`` / ``load_state_dict`` for a pipe that reads shards through an EpochRun.

    The pipe (``open_tar``, ``ShardStream``) has ``source_datapipe`` (shard URLs or parts)
    and ``reader``; it calls :meth:`_begin` in ``__iter__`` and iterates
    ``run.located()``, calling :meth:`_ended` when the epoch is over. Its state holds the
    upstream ``split_shards`` states too, so one state restores the shard order.
    """

    source_datapipe: IterDataPipe[Any]
    reader: ShardReader
    _epoch: EpochRun | None = None
    _loaded: dict[str, Any] | None = None

    def _begin(self, shuffling: Shuffling = (0, 0)) -> Iterator[Located]:
        """Start an epoch (from a loaded state, if any): its samples, as ``Located``.

        Args:
            shuffling: ``(buffer size, seed)`` of the epoch's shuffle buffer (see
                :class:`EpochRun`); by default none.
        """
        self._epoch, loaded, self._loaded = None, self._loaded, None
        self._state_at_start = loaded or self._fresh()
        info = get_worker_info()
        self.reader.policy.begin(*((info.id, info.num_workers) if info is not None else (0, 1)))
        return self._run((loaded or {}).get("position"), shuffling)

    def _run(self, position: Mapping[str, Any] | None, shuffling: Shuffling) -> Iterator[Located]:
        parts = (p if isinstance(p, ShardPart) else ShardPart(p) for p in self.source_datapipe)
        size, seed = shuffling
        epoch = EpochRun(self.reader, parts, buffer_size=size, seed=seed, position=position)
        self._epoch = epoch
        yield from epoch.located()

    def _ended(self) -> None:
        if self._epoch is not None:
            self._epoch.done = True
        self.reader.policy.end()

    def stats(self) -> Stats:
        """What the current (or last) epoch read and skipped, over all DataLoader workers.

        See :class:`~shardpipes.Stats`; counted by the pipe's
        :class:`~shardpipes.ErrorPolicy` (its ``handler``).
        """
        return self.reader.policy.stats()

    def _fresh(self) -> dict[str, Any]:
        return {"version": VERSION, "splitters": self._splitter_states(), "position": None}

    def _splitter_states(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in splitters(self.source_datapipe)]

    def state_dict(self) -> dict[str, Any]:
        """Where this pipe is in its epoch: plain data for a checkpoint.

        Taken between two items it yields, it holds the epoch's shard order and split
        (the ``split_shards`` states, checked on restore), the number of parts read and the
        byte offset and index of the next sample, and — for a shuffle buffer — the buffered
        samples as references ``(shard, start, end)`` with the buffer's random state. A
        full 5,000-sample buffer takes about 120 KB of JSON. Hand the pipe to
        ``StatefulDataLoader`` through :class:`~shardpipes.Resumable`.
        """
        if self._epoch is None:  # nothing read in this epoch yet
            return dict(self._loaded or getattr(self, "_state_at_start", None) or self._fresh())
        return {
            "version": VERSION,
            "splitters": self._splitter_states(),
            "position": self._epoch.position(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume, at the next iteration, from a :meth:`state_dict` of this pipeline.

        Raises:
            ValueError: If the state is not one of this kind and version, or its
                ``split_shards`` states do not fit this pipe; a state of another shard
                list, seed, split or worker raises when iteration starts, saying which.
        """
        if not isinstance(state, Mapping) or state.get("version") != VERSION:
            found = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            msg = f"not a shardpipes reading state of version {VERSION} (got version {found!r})"
            raise ValueError(msg)
        stages = splitters(self.source_datapipe)
        saved = state.get("splitters", [])
        if len(saved) != len(stages):
            msg = f"the state has {len(saved)} split_shards stages, this pipe {len(stages)}"
            raise ValueError(msg)
        for splitter, sub in zip(stages, saved, strict=True):
            splitter.load_state_dict(sub)
        self._loaded, self._epoch = dict(state), None
