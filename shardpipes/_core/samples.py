"""Grouping tar members into samples, WebDataset style.

A member ``dir/abc.seg.png`` has key ``dir/abc`` (the path up to the first dot of its
basename) and extension ``seg.png`` (the rest, lower-cased). Consecutive members with the
same key form one sample; a key seen again later starts a new sample (never a silent merge).
Members whose basename has no dot have no extension and are not part of any sample, as in
WebDataset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from shardpipes._core.handlers import Handler, handle
from shardpipes._core.tar import Member
from shardpipes.errors import TarFormatError

Sample = dict[str, Any]


class ShardSample(dict):  # type: ignore[type-arg]
    """A sample dict as read from a shard, knowing where it lies: ``offset`` and ``end``.

    A plain ``dict`` in every other way (equal to one, pickled with its place); the place
    is not an entry, so samples stay WebDataset's format. Errors about the sample (a
    failed decode, a missing field) give its offset; a shuffle buffer saves a sample as
    ``(shard, offset, end)``, and the shard gives it back from those bytes.
    """

    __slots__ = ("end", "offset")  # set by group_samples; read with getattr(s, "offset", None)

    offset: int
    end: int


def placed_like(out: dict[str, Any], sample: Any) -> dict[str, Any]:
    """``out`` (made from ``sample``) knowing where ``sample`` lies, if it knows.

    What lets a shuffle buffer after ``decode`` or ``rename_fields`` save its samples as
    byte ranges: the new dict is still a reference to the same bytes.
    """
    end = getattr(sample, "end", None)
    if end is None:
        return out
    placed = out if type(out) is ShardSample else ShardSample(out)
    placed.offset, placed.end = sample.offset, end
    return placed


class SampleTuple(tuple):  # type: ignore[type-arg]
    """A sample's fields picked into a tuple (``to_tuple``, the recipes): a plain ``tuple``.

    Its own type so that a DataLoader batching it (``batch_size=N``) collates it with
    :func:`~shardpipes.collate_samples`, whose errors say what to do.
    """

    __slots__ = ()


class Located(NamedTuple):
    """A sample and where it lies: its byte range in the uncompressed shard, its index there."""

    sample: Sample
    start: int
    end: int
    nth: int


def split_name(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, extension)``, or ``None`` without an extension.

    Example:
        >>> split_name("train/n0123_45.seg.PNG")
        ('train/n0123_45', 'seg.png')
        >>> split_name("README") is None
        True
    """
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return None
    return name[:dot], name[dot + 1 :].lower()


class PartFilter:
    """A ``keep`` function for :func:`~shardpipes._core.tar.iter_members`: part k of m.

    Counts samples by the same key-change rule as :func:`group_samples` and keeps the
    members of sample ``i`` when ``start <= i < stop`` and ``(i - start) % parts == part``,
    so that ``parts`` readers of one shard, each with its own ``part``, yield every sample
    of the range exactly once between them.
    """

    def __init__(self, part: int, parts: int, *, start: int = 0, stop: int | None = None) -> None:
        self.part, self.parts = part, parts
        self.start, self.stop = start, stop
        self.index = -1
        self.key: str | None = None
        self.kept = False

    def __call__(self, name: str) -> bool:
        split = split_name(name)
        if split is None:
            return False
        if split[0] != self.key:
            self.key = split[0]
            self.index += 1
            i = self.index - self.start
            inside = i >= 0 and (self.stop is None or self.index < self.stop)
            self.kept = inside and i % self.parts == self.part
        return self.kept


def group_samples(
    members: Iterable[Member],
    *,
    url: str,
    handler: Handler = "raise",
    spans: bool = False,
    first_index: int = 0,
) -> Iterator[Any]:
    """Group consecutive members with the same key into sample dicts.

    Members with ``data=None`` (declined by a ``keep`` function) are passed over. A
    sample holding one extension twice is an error, given to ``handler``; when the
    handler skips, the whole sample is dropped. So is a sample holding a bad member that
    the reader reported and marked (``end == -1``). A marker without a name (a header too
    damaged to read one) drops both the sample being gathered and the next one: either
    may have lost a member, and a sample missing a member is never yielded.

    Args:
        members: The members, in stream order.
        url: The shard's URL, put in each sample.
        handler: What to do with a sample holding one extension twice.
        spans: Yield :class:`Located` tuples instead of bare samples.
        first_index: The index in the shard of the first sample of ``members`` (when
            resuming a shard mid-way).

    Yields:
        Dicts with ``__key__``, ``__url__`` and one ``bytes`` entry per extension; with
        ``spans``, ``Located(sample, start, end, nth)``: the sample's byte range in the
        (uncompressed) shard and its index there, counting declined samples too.
    """
    sample: ShardSample | None = None
    bad_key: str | None = None
    last_key: str | None = None
    index = first_index - 1
    start = end = mine = 0
    drop_next = False  # a nameless bad member: the next key may have lost its first members
    new = tuple.__new__  # Located(...) goes through a Python-level __new__
    try:
        for member in members:
            name = member.name  # split_name(), inlined: this loop runs per member
            dot = name.find(".", name.rfind("/") + 1)
            if dot < 0:
                if member.end < 0:  # a bad member of unknown name: it may have belonged to
                    sample, bad_key, drop_next = None, last_key, True  # either neighbour
                continue
            key, ext = name[:dot], name[dot + 1 :].lower()
            if key != last_key:
                if sample is not None:
                    sample.end = end
                    yield new(Located, (sample, start, end, mine)) if spans else sample
                    sample = None
                last_key = key
                index += 1
                if drop_next:
                    bad_key, drop_next = key, False
            if member.data is None or key == bad_key:
                if member.end < 0:  # a bad member (reported): its sample is dropped whole
                    sample, bad_key = None, key
                continue
            if sample is None:
                sample, bad_key = ShardSample(__key__=key, __url__=url), None
                start = sample.offset = member.offset
                mine = index
            if ext in sample:
                _duplicate(handler, url, member, key, ext)
                sample, bad_key = None, key
                continue
            sample[ext] = member.data
            end = member.end
    except TarFormatError as exc:
        # the shard broke after a sample was complete (the next key had begun): keep it
        split = split_name(exc.member) if exc.member else None
        if sample is not None and split is not None and split[0] != sample["__key__"]:
            sample.end = end
            yield new(Located, (sample, start, end, mine)) if spans else sample
        raise
    if sample is not None:
        sample.end = end
        yield new(Located, (sample, start, end, mine)) if spans else sample


def _duplicate(handler: Handler, url: str, member: Member, key: str, ext: str) -> None:
    """Report one extension seen twice in a sample; returns when the handler skips."""
    exc = TarFormatError(
        f"duplicate extension {ext!r} in sample",
        url=url,
        member=member.name,
        key=key,
        offset=member.offset,
    )
    handle(handler, exc, stage="open_tar", url=url, member=member.name, key=key)
