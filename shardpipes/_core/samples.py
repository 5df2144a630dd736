"""Grouping tar members into samples, WebDataset style.

A member ``dir/abc.seg.png`` has key ``dir/abc`` (the path up to the first dot of its
basename) and extension ``seg.png`` (the rest, lower-cased). Consecutive members with the
same key form one sample; a key seen again later starts a new sample (never a silent merge).
Members whose basename has no dot have no extension and are not part of any sample, as in
WebDataset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shardpipes._core.handlers import Handler, handle
from shardpipes._core.tar import Member
from shardpipes.errors import TarFormatError

__all__ = ["PartFilter", "group_samples", "split_name"]

Sample = dict[str, Any]


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
    members of sample ``i`` when ``i % parts == part``, so that ``parts`` readers of one
    shard, each with its own ``part``, yield every sample exactly once between them.
    """

    def __init__(self, part: int, parts: int) -> None:
        self.part, self.parts = part, parts
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
            self.kept = self.index % self.parts == self.part
        return self.kept


def group_samples(
    members: Iterable[Member], *, url: str, handler: Handler = "raise"
) -> Iterator[Sample]:
    """Group consecutive members with the same key into sample dicts.

    Members with ``data=None`` (declined by a ``keep`` function) are passed over. A
    sample holding one extension twice is an error, given to ``handler``; when the
    handler skips, the whole sample is dropped.

    Yields:
        Dicts with ``__key__``, ``__url__`` and one ``bytes`` entry per extension.
    """
    sample: Sample | None = None
    bad_key: str | None = None
    try:
        for member in members:
            name = member.name  # split_name(), inlined: this loop runs per member
            dot = name.find(".", name.rfind("/") + 1)
            if dot < 0:
                continue
            key, ext = name[:dot], name[dot + 1 :].lower()
            if sample is not None and key != sample["__key__"]:
                yield sample
                sample = None
            if member.data is None or key == bad_key:
                continue
            if sample is None:
                sample, bad_key = {"__key__": key, "__url__": url}, None
            if ext in sample:
                _duplicate(handler, url, member, key, ext)
                sample, bad_key = None, key
                continue
            sample[ext] = member.data
    except TarFormatError as exc:
        # the shard broke after a sample was complete (the next key had begun): keep it
        split = split_name(exc.member) if exc.member else None
        if sample is not None and split is not None and split[0] != sample["__key__"]:
            yield sample
        raise
    if sample is not None:
        yield sample


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
