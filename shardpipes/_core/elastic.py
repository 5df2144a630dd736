"""Resuming an epoch on another topology: what each worker left, and who reads it now.

A worker's reading state (its split, and its :class:`~shardpipes._core.run.EpochRun`
position) says what it had not yet delivered: the samples in its shuffle buffer or taken
ahead, the rest of the part it was reading, and the parts it had not begun
(:func:`left_over`). With every worker's state, that is read off. With one rank's states
and the even split (DDP's case), a worker of another rank delivered as many samples as the
worker with its id on this rank (every rank yields as many batches, each from its workers
in turn, and every worker holds as many samples); which ones is found by running its
epoch again on references alone (:func:`replay`): its parts' sample ranges are known, and
its buffer's seed is a function of ``(seed, epoch, worker)``, so the run — the same
``EpochRun`` — takes the same decisions without reading a byte.

What is left is a list of **units**: shard parts as the splitter makes them (a whole
shard, part ``k`` of ``m``, or a sample range with its byte span). :func:`share` deals
them to the new workers: with every unit's sample count known, the even split over their
samples end to end (fewer than ``total`` samples are left out, as the even split of an
epoch does); else unit by unit, in turn.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from shardpipes._core.run import EpochRun
from shardpipes._core.samples import Located, Sample
from shardpipes._core.split import ShardPart, block, cut, part_samples

__all__ = [
    "buffer_seed_of",
    "left_over",
    "part_indices",
    "replay",
    "samples_of",
    "share",
    "size_of",
    "unit_from_list",
    "unit_to_list",
    "units_of",
]

Ranges = Sequence[tuple[int, int]]  # the byte range of each sample of a shard, in order


class Shards(Protocol):
    """What is known of the shards: their sample ranges, and how the reader reads them."""

    def ranges(self, url: str) -> Ranges:
        """The shard's sample ranges (offsets in the uncompressed tar)."""

    def streamed(self, url: str) -> bool:
        """Whether the reader streams the shard (compressed, or not indexed).

        Its parts ``k`` of ``m`` are then every ``m``-th sample, read from its start.
        """


def part_indices(part: ShardPart, n_samples: int, *, streamed: bool) -> range:
    """The indices of the samples ``part`` holds in a shard of ``n_samples``.

    Part ``k`` of ``m`` is a contiguous block of an indexed shard, and every ``m``-th
    sample (from ``start + k``) of a streamed one, as the reader reads them.
    """
    if streamed and part.parts > 1:
        stop = n_samples if part.stop is None else min(part.stop, n_samples)
        return range(part.start + part.part, stop, part.parts)
    return part_samples(n_samples, part)


def buffer_seed_of(base: int, epoch: int, worker: int) -> int:
    """The seed of global worker ``worker``'s shuffle buffer in ``epoch``, from ``base``."""
    digest = hashlib.sha256(f"buffer:{base}:{epoch}:{worker}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def size_of(part: ShardPart) -> int | None:
    """The samples in ``part`` if its bounds say (a sample range), else ``None``."""
    if part.parts == 1 and part.stop is not None:
        return part.stop - part.start
    return None


def left_over(
    parts: Sequence[ShardPart], position: Mapping[str, Any] | None, shards: Shards
) -> list[ShardPart]:
    """The samples of a worker's epoch that it had not delivered, as units.

    Args:
        parts: The worker's parts for the epoch, in reading order.
        position: Its saved ``EpochRun`` position (``None``: it had not begun).
        shards: The shards' sample ranges (asked only for the part being read and the
            shards of buffered samples).

    Raises:
        ValueError: If a shard no longer holds a saved sample.
    """
    if position is None:
        return list(parts)
    if position["done"]:
        return []
    urls = position["shards"]
    held = [(urls[s], start, end) for s, start, end in (*position["buffer"], *position["ahead"])]
    out = _samples_as_units(held, shards)
    if position["draining"]:
        return out
    taken, offset, index = position["cursor"]
    if taken >= 1:
        current = parts[taken - 1]
        out += [current] if offset < 0 else _rest(current, offset, index, shards)
    return out + list(parts[taken:])


def _rest(part: ShardPart, offset: int, index: int, shards: Shards) -> list[ShardPart]:
    """The samples of ``part`` from shard index ``index`` (at byte ``offset``) on."""
    ranges, streamed = shards.ranges(part.url), shards.streamed(part.url)
    mine = part_indices(part, len(ranges), streamed=streamed)
    rest = mine[bisect.bisect_left(mine, index) :]
    if not rest:
        return []
    if index < mine.start or ranges[index][0] != offset:
        msg = f"{part.url}: no sample {index} at byte {offset} (has the shard changed?)"
        raise ValueError(msg)
    if rest.step > 1:  # every m-th sample from the next one of this part
        return [ShardPart(part.url, 0, rest.step, start=rest.start, stop=part.stop)]
    return [_run(part.url, rest.start, rest.stop, ranges, streamed=streamed)]


def _run(url: str, start: int, stop: int, ranges: Ranges, *, streamed: bool) -> ShardPart:
    """Samples ``[start, stop)`` of a shard: with their byte span, unless it is streamed."""
    span = None if streamed else (ranges[start][0], ranges[stop - 1][1])
    return ShardPart(url, start=start, stop=stop, span=span)


def _samples_as_units(samples: Iterable[tuple[str, int, int]], shards: Shards) -> list[ShardPart]:
    """Single samples ``(url, start, end)`` as sample ranges, adjacent ones merged."""
    found = []
    where: dict[str, dict[int, tuple[int, int]]] = {}
    for url, start, end in samples:
        if url not in where:
            where[url] = {s: (i, e) for i, (s, e) in enumerate(shards.ranges(url))}
        index = where[url].get(start)
        if index is None or index[1] != end:
            msg = f"{url}: no sample at bytes {start}..{end} (has the shard changed?)"
            raise ValueError(msg)
        found.append((url, index[0]))
    return units_of(found, shards)


def samples_of(units: Iterable[ShardPart], shards: Shards) -> list[tuple[str, int]]:
    """The samples ``units`` hold, in reading order: ``(url, index in the shard)``."""
    out = []
    for unit in units:
        mine = part_indices(unit, len(shards.ranges(unit.url)), streamed=shards.streamed(unit.url))
        out += [(unit.url, i) for i in mine]
    return out


def units_of(samples: Iterable[tuple[str, int]], shards: Shards) -> list[ShardPart]:
    """Samples ``(url, index)`` as sample ranges: by shard (first seen first), runs merged."""
    by_url: dict[str, list[int]] = {}
    for url, index in samples:
        by_url.setdefault(url, []).append(index)
    out = []
    for url, indices in by_url.items():
        ranges, streamed = shards.ranges(url), shards.streamed(url)
        indices.sort()
        first = prev = indices[0]
        for i in [*indices[1:], None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            out.append(_run(url, first, prev + 1, ranges, streamed=streamed))
            if i is not None:
                first = prev = i
    return out


class _References:
    """A :class:`~shardpipes._core.run.PartReader` of sample references only (a replay)."""

    def __init__(self, shards: Shards) -> None:
        self.shards = shards

    def samples(
        self, item: str | ShardPart, *, spans: bool = False, at: tuple[int, int] | None = None
    ) -> Iterator[Any]:
        assert isinstance(item, ShardPart)
        assert at is None  # a replay starts at the epoch's start: nothing to resume
        ranges = self.shards.ranges(item.url)
        sample: Sample = {"__url__": item.url}
        for i in part_indices(item, len(ranges), streamed=self.shards.streamed(item.url)):
            yield Located(sample, ranges[i][0], ranges[i][1], i)

    def fetch(self, url: str, spans: Iterable[tuple[int, int]]) -> dict[int, Sample]:
        raise AssertionError  # a replay starts from the epoch's start: nothing to re-read

    def upcoming(self, parts: Sequence[tuple[ShardPart, tuple[int, int] | None]]) -> None:
        pass


def replay(
    parts: Sequence[ShardPart],
    shards: Shards,
    *,
    buffer_size: int,
    seed: int,
    delivered: int,
    strict: bool = True,
) -> dict[str, Any]:
    """The position of a worker's epoch after it delivered ``delivered`` samples.

    Its run again, on references (no byte read): the same ``EpochRun``, the same buffer
    and seed, so the same samples come out in the same order.

    Args:
        parts: The worker's parts, in reading order.
        shards: The shards' sample ranges.
        buffer_size: Its shuffle buffer's size (below 2: none).
        seed: Its buffer's seed.
        delivered: Samples it delivered.
        strict: Whether parts holding fewer than ``delivered`` samples are an error (else
            the position is the epoch's end).

    Raises:
        ValueError: If ``strict`` and the worker's parts hold fewer than ``delivered`` samples.
    """
    run = EpochRun(_References(shards), parts, buffer_size=buffer_size, seed=seed)
    located = run.located()
    for n in range(delivered):
        if next(located, None) is None:
            if not strict:
                break
            msg = (
                f"a worker's parts hold {n} samples; its rank's state says it delivered {delivered}"
            )
            raise ValueError(msg)
    position = run.position()
    located.close()
    return position


def share(units: Sequence[ShardPart], total: int, worker: int, *, even: bool) -> list[ShardPart]:
    """The units (or parts of units) that worker ``worker`` of ``total`` reads.

    With every unit's sample count known (:func:`size_of`), their samples end to end are
    cut into ``total`` runs: with ``even``, of ``n // total`` each (the last ``n % total``
    are nobody's); else differing by one at most. A sample range cut in two loses its
    byte span (the splitter finds it again). Else unit ``i`` goes to worker ``i % total``.
    """
    sizes = [size_of(unit) for unit in units]
    if any(size is None for size in sizes):
        return [unit for i, unit in enumerate(units) if i % total == worker]
    counts = [size for size in sizes if size is not None]
    n = sum(counts)
    mine = range(worker * (n // total), (worker + 1) * (n // total))
    if not even:
        mine = block(n, worker, total)
    out = []
    for i, start, stop in cut(counts, mine.start, mine.stop):
        unit = units[i]
        whole = (start, stop) == (0, counts[i])
        out.append(
            unit if whole else ShardPart(unit.url, start=unit.start + start, stop=unit.start + stop)
        )
    return out


def unit_to_list(unit: ShardPart, index: Mapping[str, int]) -> list[int | None]:
    """A unit as plain data, its URL by its place in the shard list."""
    span = unit.span or (None, None)
    return [index[unit.url], unit.part, unit.parts, unit.start, unit.stop, *span]


def unit_from_list(data: Sequence[Any], urls: Sequence[str]) -> ShardPart:
    """The unit :func:`unit_to_list` made."""
    url, part, parts, start, stop, first, last = data
    span = None if first is None else (int(first), int(last))
    return ShardPart(urls[url], int(part), int(parts), int(start), stop, span)
