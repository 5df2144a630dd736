"""Tar indexes on any filesystem: build, write and read the ``URL.idx`` sidecar."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from shardpipes import fs
from shardpipes._core.index import dump_index, load_index, sample_ranges
from shardpipes._core.tar import iter_members
from shardpipes.errors import ShardIndexError
from shardpipes.fs.retry import RetryPolicy

__all__ = [
    "build_index",
    "index_url",
    "is_gzip",
    "local_ranges",
    "read_index",
    "shard_ranges",
    "write_index",
]

Ranges = list[tuple[int, int]]


def index_url(url: str) -> str:
    """Return the sidecar index URL of a shard: ``URL + ".idx"``."""
    return url + ".idx"


def build_index(url: str, *, storage_options: Mapping[str, Any] | None = None) -> Ranges:
    """Scan a shard's headers (seeking over member data) and return its sample ranges.

    Raises:
        ShardIndexError: If the shard is gzip-compressed (ranged reads need a plain tar).
        TarFormatError: If the shard is not a readable tar.
    """
    with fs.open_input(url, storage_options) as stream:
        if is_gzip(stream):
            msg = "a compressed shard cannot be indexed (ranged reads need an uncompressed tar)"
            raise ShardIndexError(msg, url=url)
        return _scan(stream, url)


def is_gzip(stream: IO[bytes]) -> bool:
    """Whether the stream starts with gzip's magic; it is left at its start."""
    magic = stream.read(2)
    stream.seek(0)
    return magic == b"\x1f\x8b"


def local_ranges(url: str, storage_options: Mapping[str, Any] | None = None) -> Ranges | None:
    """A local plain tar's sample ranges from a walk of its headers; ``None`` for others.

    The walk seeks over member data: a local shard's count costs one read per member
    header, as ``tar -t`` pays. A remote shard (a request per header) or a gzip one (read
    whole) has no cheap count.
    """
    if fs.is_remote(url):
        return None
    with fs.open_input(url, storage_options) as stream:
        return None if is_gzip(stream) else _scan(stream, url)


def _scan(stream: IO[bytes], url: str) -> Ranges:
    """Sample ranges from a header-only walk (member data seeked over)."""
    return sample_ranges(iter_members(stream, url=url, keep=lambda name: False))


def write_index(
    url: str, *, storage_options: Mapping[str, Any] | None = None, out: str | None = None
) -> tuple[str, int]:
    """Build a shard's index and write it next to it (or to ``out``).

    Returns:
        ``(index URL, number of samples)``.
    """
    ranges = build_index(url, storage_options=storage_options)
    target = out or index_url(url)
    with fs.open_output(target, storage_options) as f:
        f.write(dump_index(ranges, fs.size(url, storage_options)))
    return target, len(ranges)


def read_index(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    index: str | None = None,
    retry: RetryPolicy | None = None,
) -> Ranges | None:
    """Read a shard's index from ``index`` or its sidecar; ``None`` if there is none.

    Args:
        url: The shard's URL.
        storage_options: Passed to the filesystem.
        index: The index's URL, if not the sidecar's.
        retry: The storage calls' retry policy; default ``RetryPolicy()``.

    Raises:
        ShardIndexError: If the index is malformed or stale (the shard's size changed).
    """
    target = index or index_url(url)
    if index is None and not fs.exists(target, storage_options, retry):
        return None
    with fs.open_input(target, storage_options, retry) as f:
        data = f.read()
    return load_index(data, url=target, shard_size=fs.size(url, storage_options, retry))


def shard_ranges(
    url: str, storage_options: Mapping[str, Any], index: str | None = None
) -> tuple[Ranges, bool]:
    """A shard's sample ranges (in the uncompressed tar), and whether it is compressed.

    From its index (a plain tar), else a scan of its headers (a gzip shard decompressed).
    """
    ranges = read_index(url, storage_options=storage_options, index=index)
    if ranges is not None:
        return ranges, False
    with fs.open_input(url, storage_options) as stream:  # one scan, also for gzip
        compressed = is_gzip(stream)
        return _scan(stream, url), compressed
