"""One worker's reading of its shard parts in one epoch, with the position a checkpoint needs.

:class:`PartsReading` reads a worker's parts in order (taken lazily, so an endless source
works too) and knows, at every point where its samples are yielded, where it is:

* **cursor**: how many parts were taken, and the byte offset (uncompressed) and shard
  index of the next sample in the last one;
* **digest**: of the parts taken, so that a state of another split is refused;
* **done**: the parts are all read.

Restoring skips the parts done before and resumes the last one at the cursor: nothing
consumed is read again, beyond the rest of the cursor's read block.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from shardpipes._core.samples import Located, ShardSample
from shardpipes._core.split import ShardPart

AHEAD = 2  #: parts the reader is told of ahead of reading them (to fetch their bytes early)


class PartReader(Protocol):
    """What a :class:`PartsReading` reads with (``ShardReader``, or references only)."""

    def samples(
        self, item: str | ShardPart, *, spans: bool = False, at: tuple[int, int] | None = None
    ) -> Iterator[Any]:
        """A part's samples (as ``Located`` with ``spans``), from ``at`` if given."""

    def upcoming(self, parts: Sequence[tuple[ShardPart, tuple[int, int] | None]]) -> None:
        """The parts (and where in them) to be read next, the first one first."""


def reference(url: str, start: int, end: int, source: str | None = None) -> ShardSample:
    """A sample reference: a sample with no data, that knows where it lies in its shard."""
    sample = ShardSample(__url__=url)
    if source is not None:
        sample["__source__"] = source
    sample.offset, sample.end = start, end
    return sample


class PartsReading:
    """The reading of one epoch's parts, with its position.

    Args:
        reader: Reads parts (with byte spans).
        parts: This worker's parts for the epoch, in order (read lazily).
        position: A saved :meth:`position` to resume from.
    """

    def __init__(
        self,
        reader: PartReader,
        parts: Iterable[ShardPart],
        position: Mapping[str, Any] | None = None,
    ) -> None:
        self.reader = reader
        self.parts = parts
        self.taken = 0  # parts taken from `parts`; the last one is being read
        self.digest = hashlib.sha1(usedforsecurity=False)  # of the parts taken
        self.last: Located | None = None  # the last sample read from the part being read
        self.at: tuple[int, int] | None = None  # where to resume that part
        self.done = False
        self.restoring: Mapping[str, Any] | None = position
        if position is not None:
            _, offset, index = position["cursor"]
            self.at = None if offset < 0 else (offset, index)
            self.done = bool(position["done"])

    def located(self) -> Generator[Located, None, None]:
        """The epoch's samples, as ``Located`` tuples."""
        if self.restoring is not None and self.done:  # restored from the end of an epoch
            self._replay(self.restoring)
            return
        reads = self._read()
        try:
            for samples in reads:
                for loc in samples:
                    self.last = loc
                    yield loc
            self.done = True
        finally:
            # ended, abandoned or failed: the fetching ahead stops now, not when the
            # generator is collected (a raised error's traceback would keep it alive)
            reads.close()

    def _read(self) -> Generator[Iterator[Located], None, None]:
        """Each part's samples in turn (skipping, when restoring, the parts done before).

        The reader is told the next :data:`AHEAD` parts as each part begins, so that it can
        fetch them ahead; they are taken from ``parts`` that much earlier.
        """
        saved = self.restoring
        skip = saved["cursor"][0] if saved is not None else 0
        source, ahead = iter(self.parts), collections.deque[ShardPart]()
        samples: Iterator[Located] | None = None
        try:
            for n in itertools.count(1):
                part = ahead.popleft() if ahead else next(source, None)
                if part is None:
                    break
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
        list, seed and workers); their digest must be the saved one.
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

    def position(self) -> dict[str, Any]:
        """Where the epoch is, as plain data (see the module docstring)."""
        if self.restoring is not None:  # restored, no part read since
            return dict(self.restoring)
        if self.last is not None:
            cursor = [self.taken, self.last.end, self.last.nth + 1]
        elif self.at is not None:
            cursor = [self.taken, *self.at]
        else:
            cursor = [self.taken, -1, -1]  # the start of the part
        return {"cursor": cursor, "digest": self.digest.hexdigest()[:16], "done": self.done}
