"""One worker's reading of one epoch, with its position: what a checkpoint holds.

:class:`EpochRun` reads a worker's shard parts (taken lazily, so an endless source works
too), shuffles through a buffer if asked, and knows, at every point where the pipe
yields, where it is — as a small, plain state:

* **cursor**: how many parts were taken, and the byte offset (uncompressed) and shard
  index of the next sample in the last one, with a digest of the parts so far;
* **shuffle**: the buffer's samples as references ``(shard, start, end)``, not their
  bytes, and the buffer's ``random.Random`` state;
* **ahead**: samples taken out of the buffer but not yet yielded (decode threads read a
  few ahead), as references too.

Restoring re-reads only the referenced samples (one ranged read each; a gzip shard is
decompressed once from its start) and goes on from the cursor: nothing consumed is read
again, beyond the buffer's samples and the rest of the cursor's read block.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import random
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from shardpipes._core.samples import Located, Sample
from shardpipes._core.split import ShardPart
from shardpipes._core.steps import InFlight

__all__ = ["EpochRun", "PartReader", "Shuffling"]

Shuffling = tuple[int, "int | Callable[[], int]"]  # (buffer size, seed or a function of it)
AHEAD = 2  #: parts the reader is told of ahead of reading them (to fetch their bytes early)


class PartReader(Protocol):
    """What an :class:`EpochRun` reads with (``ShardReader``)."""

    def samples(
        self, item: str | ShardPart, *, spans: bool = False, at: tuple[int, int] | None = None
    ) -> Iterator[Any]:
        """A part's samples (as ``Located`` with ``spans``), from ``at`` if given."""

    def fetch(self, url: str, spans: Iterable[tuple[int, int]]) -> dict[int, Sample]:
        """Samples by byte range, by start offset."""

    def upcoming(self, parts: Sequence[tuple[ShardPart, tuple[int, int] | None]]) -> None:
        """The parts (and where in them) to be read next, the first one first."""


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
        flight: Where decode threads keep the samples they took and have not yielded.
    """

    def __init__(
        self,
        reader: PartReader,
        parts: Iterable[ShardPart],
        *,
        buffer_size: int,
        seed: int | Callable[[], int],
        position: Mapping[str, Any] | None = None,
        flight: InFlight | None = None,
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
        self.flight = flight or InFlight()  # decode threads: taken out, not yet yielded
        self.done = False
        self.restoring: Mapping[str, Any] | None = position
        if position is not None:
            self._restore(position)

    # -- running --------------------------------------------------------------------------

    def located(self) -> Generator[Located, None, None]:
        """The epoch's samples, shuffled, as ``Located`` tuples."""
        if self.restoring is not None and (self.done or self.draining):
            self._replay(self.restoring)
        if self.done:  # restored from the end of an epoch
            return
        while self.ahead:
            yield self.ahead.pop(0)
        reads = self._read()
        try:
            yield from self._shuffled(itertools.chain.from_iterable(reads))
        finally:
            # ended, abandoned or failed: the fetching ahead stops now, not when the
            # generator is collected (a raised error's traceback would keep it alive)
            reads.close()

    def _shuffled(self, source: Iterator[Located]) -> Iterator[Located]:
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

    def _read(self) -> Generator[Iterator[Located], None, None]:
        """Each part's samples in turn (skipping, when restoring, the parts done before).

        The reader is told the next :data:`AHEAD` parts as each part begins, so that it can
        fetch them ahead; they are taken from ``parts`` that much earlier.
        """
        saved = self.restoring
        skip = saved["cursor"][0] if saved is not None else 0
        if self.draining:
            return
        source, ahead = iter(self.parts), collections.deque[ShardPart]()
        samples: Iterator[Located] | None = None
        try:
            for n in itertools.count(1):
                part = ahead.popleft() if ahead else next(source, None)
                if part is None:
                    break
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
                ahead.extend(itertools.islice(source, AHEAD - len(ahead)))
                self.reader.upcoming([(part, at), *((p, None) for p in ahead)])
                samples = self.reader.samples(part, spans=True, at=at)
                yield samples
        finally:
            if isinstance(samples, Generator):
                samples.close()  # its shard's stream too
            self.reader.upcoming([])  # an epoch ended or abandoned: nothing more to fetch
        if self.restoring is not None:  # fewer parts than when it was saved
            self._check(self.restoring)

    def _replay(self, saved: Mapping[str, Any]) -> None:
        """Restored once every part had been read: take the parts again, and check them.

        Taking them runs the split (the ``split_shards`` stage checks the state's shard
        list, seed and workers, and counts the epoch); their digest must be the saved one.
        """
        taken = saved["cursor"][0]
        for n, part in enumerate(self.parts, start=1):
            if n > taken:
                break
            self.digest.update(repr(tuple(part)).encode())
            if n == taken:
                break
        self._check(saved)

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
            "ahead": refs([*self.ahead, *self.flight.pending()]),
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
