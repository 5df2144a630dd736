"""A byte-bounded local cache of remote shards, safe for many worker processes at once.

Shards are cached as they are read, block by block — whole shards and the parts of shards
that DataLoader workers or ranks read alike. A shard being filled is a sparse file of its
full size, ``<entry>.part``, beside a record of the byte ranges written, ``<entry>.ranges``;
the blocks a worker fetches are written at their offsets and added to the record, under an
exclusive lock on ``.lock`` in the folder. When the ranges cover the whole shard the file
is renamed (atomically) to its entry name, and later opens read the local file. A block
that failed or was cut short is never written, so nothing partial is ever served; blocks
already written are served by range before the shard is complete.

The folder never holds more than ``max_bytes``: a shard's full size is reserved on disk
(``posix_fallocate``) when its first block is written, after evicting the least recently
used entries (by modification time, refreshed on every hit and every write): complete
entries first, then partial ones, which a stopped epoch may have left. A shard larger
than the bound, or one that cannot get room, is read without caching. Entries are named
by a hash of the URL plus its file name: the cache assumes shards do not change (as
training shards don't); use a new folder for a new dataset version.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

from shardpipes._core.writer import size_option

__all__ = ["ShardCache", "cache_bytes"]

_PART = ".part"
_RANGES = ".ranges"


def cache_bytes(size: int | str) -> int:
    """The bound as bytes: an int, or a text such as ``"20GB"`` or ``"512MiB"``.

    Example:
        >>> cache_bytes("20GB"), cache_bytes(4096)
        (20000000000, 4096)
    """
    return size_option("cache_size", size, 1, "20GB")


class ShardCache:
    """The cache folder: entries, reservations, eviction.

    Args:
        directory: The folder (created if missing; local disk).
        max_bytes: The most bytes its entries and downloads in progress may hold.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)

    def entry(self, url: str) -> Path:
        """The entry's path for ``url``: a hash of the URL, then its sanitized file name."""
        digest = hashlib.sha256(url.encode()).hexdigest()[:20]
        name = re.sub(r"[^\w.-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])[:80]
        return self.directory / f"{digest}-{name}"

    def lookup(self, url: str) -> Path | None:
        """The complete entry for ``url``, marked as just used; ``None`` if there is none."""
        path = self.entry(url)
        try:
            _touch(path)  # least recently used goes first
        except FileNotFoundError:
            return None
        return path

    def read(self, url: str, offset: int, length: int) -> bytes | None:
        """Bytes ``[offset, offset + length)`` of ``url`` if the cache holds them all, else None."""
        path = self.lookup(url)
        if path is None:
            partial = _partial(self.entry(url))
            with self._locked():
                if not _covers(_load_ranges(partial), offset, offset + length):
                    return None
                return _pread(partial, offset, length)
        try:
            return _pread(path, offset, length)
        except FileNotFoundError:  # evicted since
            return None

    def fill(self, url: str, size: int, offset: int, data: bytes) -> None:
        """Write a block of ``url`` (of ``size`` bytes) read from storage at ``offset``.

        Publishes the entry once every byte is written; does nothing when the shard is
        cached whole already or cannot get room.
        """
        entry = self.entry(url)
        partial = _partial(entry)
        with self._locked():
            if entry.exists():
                return
            if not partial.exists() and not self._make_room(partial, size):
                return
            with open(partial, "r+b") as f:
                os.pwrite(f.fileno(), data, offset)
                _touch(f.fileno())
            ranges = _merge([*_load_ranges(partial), (offset, offset + len(data))])
            if _covers(ranges, 0, size):
                os.replace(partial, entry)
                _ranges_file(partial).unlink(missing_ok=True)
            else:
                _ranges_file(partial).write_text(json.dumps(ranges))

    def _make_room(self, partial: Path, size: int) -> bool:
        """Evict least recently used entries until ``size`` more bytes fit; reserve them."""
        if size > self.max_bytes:
            return False
        files = self._files()
        used = sum(st.st_size for _, st in files)
        # complete entries first (least recently used first), then partial ones
        order = sorted((p.name.endswith(_PART), st.st_mtime, p, st.st_size) for p, st in files)
        for _, _, path, bytes_ in order:
            if used + size <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                used -= bytes_
            if path.name.endswith(_PART):
                _ranges_file(path).unlink(missing_ok=True)
        if used + size > self.max_bytes:
            return False
        with open(partial, "wb") as f:
            if size:
                os.posix_fallocate(f.fileno(), 0, size)
        return True

    def _files(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        for path in self.directory.iterdir():
            if path.name == ".lock" or path.name.endswith(_RANGES):
                continue
            with contextlib.suppress(FileNotFoundError):
                out.append((path, path.stat()))
        return out

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def _touch(file: Path | int) -> None:
    """Mark ``file`` used now, to the nanosecond.

    The kernel's own file times are coarse (a few ms), and blocks fetched in parallel fill
    entries within one such tick: ties would be broken by the entries' hashed names.
    """
    now = time.time_ns()
    os.utime(file, ns=(now, now))


def _partial(entry: Path) -> Path:
    """The file of an entry being filled."""
    return entry.with_name(entry.name + _PART)


def _ranges_file(partial: Path) -> Path:
    return partial.with_name(partial.name[: -len(_PART)] + _RANGES)


def _load_ranges(partial: Path) -> list[tuple[int, int]]:
    try:
        return [(int(a), int(b)) for a, b in json.loads(_ranges_file(partial).read_text())]
    except (FileNotFoundError, ValueError):
        return []


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint ranges covering what ``ranges`` cover."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covers(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(s <= start and end <= e for s, e in ranges)


def _pread(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        _touch(f.fileno())
        return os.pread(f.fileno(), length, offset)
