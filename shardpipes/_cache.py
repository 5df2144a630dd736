"""A byte-bounded local cache of remote shards, safe for many worker processes at once.

A shard read whole from a bucket is written, as it streams, to a temporary file in the
cache folder; only when the whole object has arrived is the file renamed (atomically) to
its entry name, so a partly downloaded entry is never served. Later reads of that URL —
whole, or a byte range — open the local file instead.

The folder never holds more than ``max_bytes``: before a download starts, under an
exclusive lock on ``.lock`` in the folder, the shard's full size is reserved on disk
(``posix_fallocate`` of the temporary file) after evicting the least recently used
entries (by modification time, refreshed on every hit). A shard larger than the bound, or
one that cannot get room because other downloads hold it, is streamed without caching.
Entries are named by a hash of the URL plus its file name: the cache assumes shards do
not change (as training shards don't); use a new folder for a new dataset version.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

from shardpipes._core.writer import parse_size

__all__ = ["ShardCache", "cache_bytes"]

_PART = ".part"


def cache_bytes(size: int | str) -> int:
    """The bound as bytes: an int, or a text such as ``"20GB"`` or ``"512MiB"``.

    Example:
        >>> cache_bytes("20GB"), cache_bytes(4096)
        (20000000000, 4096)
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        msg = f"cache_size must be bytes or a text such as '20GB' (got {size!r})"
        raise TypeError(msg)
    value = parse_size(size) if isinstance(size, str) else size
    if value < 1:
        msg = f"cache_size must be at least 1 byte (got {size!r})"
        raise ValueError(msg)
    return value


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
            os.utime(path)  # least recently used goes first
        except FileNotFoundError:
            return None
        return path

    def reserve(self, url: str, size: int) -> Path | None:
        """Make room for ``size`` bytes and return a reserved temporary file, or ``None``."""
        if size > self.max_bytes:
            return None
        with self._locked():
            files = self._files()
            used = sum(st.st_size for _, st in files)
            entries = sorted((st.st_mtime, path, st.st_size) for path, st in files
                             if not path.name.endswith(_PART))  # fmt: skip
            for _, path, bytes_ in entries:
                if used + size <= self.max_bytes:
                    break
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    used -= bytes_
            if used + size > self.max_bytes:  # downloads in progress hold the room
                return None
            temp = self.entry(url).with_name(f"{self.entry(url).name}.{uuid.uuid4().hex}{_PART}")
            with open(temp, "wb") as f:
                if size:
                    os.posix_fallocate(f.fileno(), 0, size)
            return temp

    def commit(self, temp: Path, url: str) -> None:
        """Publish a complete download as the entry of ``url`` (atomic rename)."""
        os.replace(temp, self.entry(url))

    def abandon(self, temp: Path) -> None:
        """Drop a download that did not complete."""
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()

    def _files(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        for path in self.directory.iterdir():
            if path.name == ".lock":
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
