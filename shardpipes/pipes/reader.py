"""Reading one shard or shard part: members streamed, grouped into samples, errors handled."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

from shardpipes import fs
from shardpipes._core.handlers import Handler, handle
from shardpipes._core.policy import as_policy
from shardpipes._core.samples import PartFilter, Sample, group_samples
from shardpipes._core.split import ShardPart, part_samples
from shardpipes._core.stage import checked_int
from shardpipes._core.tar import MAX_MEMBER_BYTES, Member, iter_members
from shardpipes._core.writer import size_option
from shardpipes.errors import ShardIndexError, ShardpipesError, TarFormatError, TooManyErrorsError
from shardpipes.fs.cache import ShardCache, cache_bytes
from shardpipes.fs.readahead import IO_CONCURRENCY, READAHEAD, Read, ReadAhead
from shardpipes.fs.readahead import Ranges as ReadRanges
from shardpipes.fs.retry import RetryPolicy
from shardpipes.pipes.index import Ranges, build_index, is_gzip, read_index

__all__ = ["READ_KEYS", "ReadOptions", "ShardReader", "check_options"]


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """The reading options: ``open_tar`` and the recipes take them as keywords.

    One frozen object, validated once; ``open_tar(**options)`` and
    ``tar_shards(..., **options)`` make one of their keywords.

    Attributes:
        storage_options: Passed unchanged to the fsspec filesystem (credentials, endpoint).
        handler: What to do with a bad member, sample or shard: ``"raise"`` (default),
            ``"warn"`` (skip it and warn naming it), ``"ignore"``, a callable
            ``(exc, context) -> bool`` returning ``True`` to skip, or an
            :class:`~shardpipes.ErrorPolicy` (one for every stage of a chain). A bad
            member (a bad header, an unsafe name, an oversized member) drops the sample
            holding it and reading goes on at the next valid header; a shard that cannot
            be opened or read further (truncation, bad gzip data) is skipped from there.
        max_errors: The epoch's budget of skipped errors, an int or a fraction of the items
            seen; past it, :class:`~shardpipes.errors.TooManyErrorsError` (see
            :class:`~shardpipes.ErrorPolicy`).
        retries: Tries again after a transient storage failure (a reset, a timeout, a 5xx),
            reopening the shard at the byte it had reached (5); then a ``StorageError``.
        cache_dir: Keep remote shards read whole in this local folder, so later epochs
            read them from disk; needs ``cache_size``.
        cache_size: The folder's bound in bytes (or ``"20GB"``): least recently used
            shards are evicted to stay under it.
        max_member_bytes: Refuse a member larger than this (1 GiB) before reading it.
        readahead: Bytes of remote shards each reader (one per DataLoader worker) fetches
            ahead of use, the current shard's and the next ones' (``64MiB``; an int or a
            text such as ``"256MiB"``; 0: none); see docs/buckets.md.
        io_concurrency: Ranged requests each reader keeps in flight at once (4): more
            connections than one carry more than one connection's bandwidth.
    """

    storage_options: Mapping[str, Any] | None = None
    handler: Handler = "raise"
    max_errors: int | float | None = None
    retries: int = RetryPolicy.retries
    cache_dir: str | None = None
    cache_size: int | str | None = None
    max_member_bytes: int = MAX_MEMBER_BYTES
    readahead: int | str = READAHEAD
    io_concurrency: int = IO_CONCURRENCY

    def __post_init__(self) -> None:
        checked_int(self.max_member_bytes, "max_member_bytes", 0)
        RetryPolicy(retries=self.retries)  # checks it
        _cache(self.cache_dir, self.cache_size)
        size_option("readahead", self.readahead, 0, "64MiB")
        concurrency = self.io_concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            msg = f"io_concurrency must be an int of at least 1 (got {concurrency!r})"
            raise TypeError(msg)
        if concurrency < 1:
            msg = f"io_concurrency must be at least 1 (got {concurrency!r})"
            raise ValueError(msg)


READ_KEYS = frozenset(field.name for field in dataclasses.fields(ReadOptions))


def check_options(
    where: str,
    options: Mapping[str, Any],
    taker: Callable[..., Any],
    known: frozenset[str] = READ_KEYS,
) -> None:
    """Raise the ``TypeError`` Python would, for a keyword ``taker`` does not take.

    With the closest name it takes, as in ``did you mean 'batch_size'?``.

    Args:
        where: The function that took ``options`` (named in the error).
        options: Its ``**options``.
        taker: That function (or class): its own parameters are suggested too.
        known: The keywords ``**options`` takes.
    """
    unknown = sorted(set(options) - known)
    if unknown:
        own = [
            name
            for name, p in inspect.signature(taker).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        close = difflib.get_close_matches(unknown[0], [*own, *sorted(known)], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        msg = (
            f"{where}() got an unexpected keyword argument {unknown[0]!r}{hint} (its "
            f"options: {', '.join(sorted(known))})"
        )
        raise TypeError(msg)


class ShardReader:
    """Reads the samples of one shard or shard part; the engine of ``open_tar``.

    A plain object (not a pipe): ``open_tar`` and the recipes' ``ShardStream`` read
    shards with it.

    Args:
        index: For shards read in parts: ``False`` streams; ``True`` uses the
            ``URL.idx`` sidecar or builds an index on the fly; a mapping gives index URLs
            by shard URL.
        options: The :class:`ReadOptions`.
    """

    def __init__(
        self, *, index: bool | Mapping[str, str] = False, options: ReadOptions | None = None
    ) -> None:
        options = options or ReadOptions()
        self.max_member_bytes = options.max_member_bytes
        self.storage_options = dict(options.storage_options or {})
        self.retry = RetryPolicy(retries=options.retries)
        self.cache = _cache(options.cache_dir, options.cache_size)
        self.policy = as_policy(options.handler, options.max_errors)  # checks the handler
        if not isinstance(index, bool | Mapping):
            msg = f"index must be a bool or a mapping of shard URL to index URL (got {index!r})"
            raise TypeError(msg)
        self.index = index
        self._indexes: dict[str, Ranges | None] = {}
        self.readahead = size_option("readahead", options.readahead, 0, "64MiB")
        self.io_concurrency = options.io_concurrency
        self._ahead: ReadAhead | None = None  # made in the process that reads

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ahead": None}  # threads and locks stay in their process

    @property
    def ahead(self) -> ReadAhead:
        """This reader's read-ahead of remote shards (one per process)."""
        if self._ahead is None:
            self._ahead = fs.read_ahead(
                self.storage_options, self.retry, self.cache,
                readahead=self.readahead, io_concurrency=self.io_concurrency,
            )  # fmt: skip
        return self._ahead

    def upcoming(self, parts: Sequence[tuple[ShardPart, tuple[int, int] | None]]) -> None:
        """The parts to be read next, in order: their bytes are fetched ahead."""
        reads = [self._read_of(part, at) for part, at in parts if fs.is_remote(part.url)]
        if reads or self._ahead is not None:
            self.ahead.plan(reads)

    def _read_of(self, part: ShardPart, at: tuple[int, int] | None) -> Read:
        return Read((part, at), part.url, functools.partial(self._locate, part, at))

    def _locate(self, part: ShardPart, at: tuple[int, int] | None) -> ReadRanges:
        """The byte ranges that reading ``part`` (from ``at``) will read; see ``_members``."""
        span = self._span(part, at)
        if span is None:  # streamed: from the start (the gzip magic), then from the offset
            offset = 0 if at is None else at[0]
            return ((0, None),) if not offset else ((0, 2), (offset, None))
        start, end, _ = span
        return ((start, end),) if start < end else ()

    def _span(self, part: ShardPart, at: tuple[int, int] | None) -> tuple[int, int, int] | None:
        """How a part is read by range: ``(start, end, index of its first sample)``.

        From ``at`` when resuming; ``start >= end`` when the part holds no sample. ``None``
        when the part is streamed instead: a whole shard, or a part of one not indexed.
        """
        if part.span is not None:  # the splitter found the byte range (even split)
            start, end = part.span
            first = part.start
        else:
            indexed = not _whole(part) and self.index is not False
            ranges = self._ranges(part.url) if indexed else None
            if ranges is None:
                return None
            mine = part_samples(len(ranges), part)
            if not mine:
                return 0, 0, 0
            start, end, first = ranges[mine.start][0], ranges[mine.stop - 1][1], mine.start
        return (start, end, first) if at is None else (at[0], end, at[1])

    def samples(
        self, item: str | ShardPart, *, spans: bool = False, at: tuple[int, int] | None = None
    ) -> Iterator[Any]:
        """Yield the samples of a shard URL or part, giving errors to the handler.

        Args:
            item: A shard URL or part.
            spans: Yield :class:`~shardpipes._core.samples.Located` tuples (the sample,
                its byte range and its index in the shard) instead of sample dicts.
            at: Resume the part at ``(offset, index)``: the header offset (uncompressed)
                and shard index of the next sample to read, as a ``Located`` gives them.
        """
        part = item if isinstance(item, ShardPart) else ShardPart(item)
        policy, read = self.policy, 0
        if part.part == 0 and part.start == 0 and at is None:  # one part of a shard counts it
            policy.count("shards")
        try:
            with fs.open_input(
                part.url, self.storage_options, self.retry, cache=self.cache,
                ahead=self.ahead, read=self._read_of(part, at),
            ) as stream:  # fmt: skip
                members, first = self._members(stream, part, at)
                for item in group_samples(
                    members, url=part.url, handler=policy, spans=spans, first_index=first
                ):
                    read += 1
                    yield item
        except TooManyErrorsError:
            raise
        except (ShardpipesError, OSError) as exc:
            handle(policy, exc, stage="open_tar", url=part.url)
            policy.count("shards_failed")
        finally:
            policy.count("read", read)

    def fetch(self, url: str, spans: Iterable[tuple[int, int]]) -> dict[int, Sample]:
        """Re-read samples by byte range (a shuffle buffer being restored), by start offset.

        One open of the shard: a plain tar is read range by range; a gzip one is
        decompressed once from its start up to the last range.

        Raises:
            ShardpipesError: If a range does not hold exactly one sample (the shard
                changed since the ranges were taken).
        """
        wanted = dict(sorted(set(spans)))
        found: dict[int, Sample] = {}
        read = Read(("fetch", url, tuple(wanted.items())), url, lambda: tuple(wanted.items()))
        with fs.open_input(
            url, self.storage_options, self.retry, cache=self.cache, ahead=self.ahead, read=read
        ) as stream:
            if is_gzip(stream):
                last = max(wanted.values(), default=0)
                members = self._iter(stream, url)
                for loc in group_samples(members, url=url, spans=True):
                    if wanted.get(loc.start) == loc.end:
                        found[loc.start] = loc.sample
                    if loc.end >= last:
                        break
            else:
                for start, end in wanted.items():
                    members = self._range(stream, url, start, end)
                    got = list(group_samples(members, url=url, spans=True))
                    if len(got) == 1 and got[0].end == end:
                        found[start] = got[0].sample
        missing = [(start, end) for start, end in wanted.items() if start not in found]
        if missing:
            msg = f"no sample at bytes {missing[0][0]}..{missing[0][1]} (has the shard changed?)"
            raise ShardpipesError(msg, url=url, offset=missing[0][0])
        return found

    def _members(
        self, stream: IO[bytes], part: ShardPart, at: tuple[int, int] | None
    ) -> tuple[Iterator[Member], int]:
        """The members to read, and the shard index of the first sample among them."""
        url = part.url
        span = self._span(part, at)
        if span is not None:
            start, end, first = span
            return (self._range(stream, url, start, end) if start < end else iter(())), first
        offset, index = at or (0, 0)
        if _whole(part):
            return self._iter(stream, url, skip=offset), index
        keep = PartFilter(part.part, part.parts, start=part.start, stop=part.stop)
        keep.index = index - 1
        return self._iter(stream, url, keep=keep, skip=offset), index

    def _iter(self, stream: IO[bytes], url: str, **kwargs: Any) -> Iterator[Member]:
        """``iter_members`` with this reader's limits and its handler for bad members."""
        raising = self.policy.handler == "raise"
        on_error = None if raising else functools.partial(self._bad, url)
        return iter_members(
            stream, url=url, max_member_bytes=self.max_member_bytes, on_error=on_error, **kwargs
        )

    def _range(self, stream: IO[bytes], url: str, start: int, end: int) -> Iterator[Member]:
        """The members in bytes ``[start, end)`` of a plain tar."""
        stream.seek(start)
        return self._iter(stream, url, base=start, limit=end - start)

    def _bad(self, url: str, exc: TarFormatError, fatal: bool) -> None:
        handle(self.policy, exc, stage="open_tar", url=url, member=exc.member)
        if fatal:
            self.policy.count("shards_failed")

    def _ranges(self, url: str) -> Ranges | None:
        """The shard's sample ranges, or ``None`` when it cannot be indexed (gzip)."""
        if url not in self._indexes:
            given = self.index.get(url) if isinstance(self.index, Mapping) else None
            ranges = read_index(url, storage_options=self.storage_options, index=given)
            if ranges is None:
                try:
                    ranges = build_index(url, storage_options=self.storage_options)
                except ShardIndexError:
                    ranges = None  # compressed: fall back to streaming the part
            self._indexes[url] = ranges
        return self._indexes[url]


def _whole(part: ShardPart) -> bool:
    return part.parts == 1 and part.start == 0 and part.stop is None


def _cache(directory: str | None, size: int | str | None) -> ShardCache | None:
    if directory is None:
        if size is not None:
            msg = "cache_size was given without cache_dir"
            raise ValueError(msg)
        return None
    if size is None:
        msg = "cache_dir needs cache_size, the most bytes the cache may hold (e.g. '20GB')"
        raise ValueError(msg)
    return ShardCache(directory, cache_bytes(size))
