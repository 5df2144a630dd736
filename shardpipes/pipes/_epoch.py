"""One epoch of a :class:`~shardpipes.pipes.stream.ShardStream`: reading and shuffling, resumable.

:class:`EpochRun` reads this worker's shard parts, shuffles through a buffer and knows, at
every point where the stream yields, where it is — as a small, plain state:

* **cursor**: the part being read and the byte offset (uncompressed) and shard index of
  the next sample in it;
* **shuffle**: the buffer's samples as references ``(shard, start, end)``, not their
  bytes, and the buffer's ``random.Random`` state;
* **ahead**: samples taken out of the buffer but not yet yielded (decode threads read a
  few ahead), as references too.

Restoring re-reads only the referenced samples (one ranged read each; a gzip shard is
decompressed once from its start) and goes on from the cursor: nothing consumed is read
again, beyond the buffer's samples and the rest of the cursor's header block.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterDataPipe
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes._core.samples import Located
from shardpipes._core.split import ShardPart
from shardpipes.pipes.shards import ShardSplitter
from shardpipes.pipes.tar import ShardReader

if TYPE_CHECKING:
    from shardpipes.pipes.stream import ShardStream

__all__ = ["VERSION", "EpochRun", "Run", "fresh_state", "plan_digest", "splitters"]

VERSION = 1

Ref = tuple[int, int, int]  # (index in the state's shard list, start, end)


def plan_digest(plan: Sequence[ShardPart]) -> str:
    """A short digest of a worker's plan (shards, parts, ranges), to check a restored state."""
    text = "\n".join(repr(tuple(part)) for part in plan)
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


class EpochRun:
    """The reading and shuffling of one epoch, with its state.

    Args:
        reader: Reads parts (with byte spans) and re-reads samples by range.
        plan: This worker's parts for the epoch.
        buffer_size: Shuffle buffer size; below 2, no shuffling.
        seed: Seed of the buffer's generator (``None``: from the OS).
        position: A saved ``position`` (see :meth:`position`) to resume from.
    """

    def __init__(
        self,
        reader: ShardReader,
        plan: list[ShardPart],
        *,
        buffer_size: int,
        seed: int | None,
        position: dict[str, Any] | None = None,
    ) -> None:
        self.reader = reader
        self.plan = plan
        self.size = buffer_size if buffer_size >= 2 else 0
        self.rng = random.Random(seed)
        self.piece = 0  # index in plan of the part being read
        self.last: Located | None = None  # the last sample read from that part
        self.at: tuple[int, int] | None = None  # where to resume self.piece
        self.buffer: list[Located] = []
        self.draining = False  # the parts are all read; the buffer empties
        self.ahead: list[Located] = []  # restored samples to give out before anything else
        self.chunk: list[Located] = []  # decode threads: taken out of the buffer ...
        self.chunk_done = 0  # ... of which this many are yielded
        self.done = False
        if position is not None:
            self._restore(position)

    # -- running --------------------------------------------------------------------------

    def located(self) -> Iterator[Located]:
        """The epoch's samples, shuffled, as ``Located`` tuples."""
        if self.done:  # restored from the end of an epoch
            return
        ahead, self.ahead = self.ahead, []
        yield from ahead
        source = itertools.chain.from_iterable(self._parts())
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

    def _parts(self) -> Iterator[Iterator[Located]]:
        for piece in range(self.piece, len(self.plan)):
            at = self.at if piece == self.piece else None
            self.piece, self.last, self.at = piece, None, at
            yield self.reader.samples(self.plan[piece], spans=True, at=at)
        self.piece = len(self.plan)

    # -- state ----------------------------------------------------------------------------

    def position(self) -> dict[str, Any]:
        """Where the epoch is, as plain data (see the module docstring)."""
        shards: dict[str, int] = {}

        def refs(locs: Sequence[Located]) -> list[list[int]]:
            return [
                [shards.setdefault(loc.sample["__url__"], len(shards)), loc.start, loc.end]
                for loc in locs
            ]

        if self.last is not None:
            cursor = [self.piece, self.last.end, self.last.nth + 1]
        elif self.at is not None:
            cursor = [self.piece, *self.at]
        else:
            cursor = [self.piece, -1, -1]  # the start of the part
        ahead = refs([*self.ahead, *self.chunk[self.chunk_done :]])
        buffer = refs(self.buffer)
        version, internal, gauss = self.rng.getstate()
        return {
            "cursor": cursor,
            "draining": self.draining,
            "done": self.done,
            "shards": list(shards),
            "buffer": buffer,
            "ahead": ahead,
            "rng": [version, list(internal), gauss],
        }

    def _restore(self, position: dict[str, Any]) -> None:
        piece, offset, index = position["cursor"]
        self.piece = piece
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


def splitters(pipe: IterDataPipe[Any]) -> list[ShardSplitter]:
    """The ``split_shards`` stages upstream of ``pipe``, in a stable order."""
    return [s for s in get_all_graph_pipes(traverse_dps(pipe)) if isinstance(s, ShardSplitter)]


def _splitter_states(pipe: IterDataPipe[Any]) -> list[dict[str, Any]]:
    return [s.state_dict() for s in splitters(pipe)]


def fresh_state(pipe: IterDataPipe[Any]) -> dict[str, Any]:
    """The state of a pipe that has read nothing of its epoch yet."""
    return {"version": VERSION, "splitters": _splitter_states(pipe), "position": None}


class Run:
    """One iteration of a ShardStream: its plan, its :class:`EpochRun`, its state."""

    def __init__(self, stream: ShardStream, loaded: Mapping[str, Any] | None) -> None:
        self.stream = stream
        self.loaded = loaded
        self.epoch: EpochRun | None = None
        self.splitters: list[dict[str, Any]] = []
        self.digest = ""

    def start(self) -> EpochRun:
        stream = self.stream
        plan = [p if isinstance(p, ShardPart) else ShardPart(p) for p in stream.source_datapipe]
        self.splitters = _splitter_states(stream)  # after iterating them: this epoch's
        self.digest = plan_digest(plan)
        position = None
        if self.loaded is not None and self.loaded.get("position") is not None:
            if self.loaded.get("digest") != self.digest:
                msg = (
                    "the state was saved for another split of the shards (plan digest "
                    f"{self.loaded.get('digest')}, this worker's {self.digest}): it needs the "
                    "same shards, seed, epoch, even= and numbers of workers and ranks"
                )
                raise ValueError(msg)
            position = self.loaded["position"]
        seed = stream._seed
        if seed is None and stream.buffer_size >= 2:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        stream._seed = None  # a later epoch without set_seed draws a fresh seed
        self.epoch = EpochRun(
            stream.reader, plan, buffer_size=stream.buffer_size, seed=seed, position=position
        )
        return self.epoch

    def finish(self) -> None:
        if self.epoch is not None:
            self.epoch.done = True

    def state(self) -> dict[str, Any]:
        if self.epoch is None:  # iter() was called, nothing read yet
            return dict(self.loaded) if self.loaded is not None else fresh_state(self.stream)
        return {
            "version": VERSION,
            "splitters": self.splitters,
            "digest": self.digest,
            "position": self.epoch.position(),
        }
