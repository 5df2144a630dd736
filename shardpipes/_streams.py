"""The read streams behind :func:`shardpipes.fs.open_input`: retrying, and filling a cache.

:class:`ResilientStream` reads an fsspec file and, after a transient failure, opens it
again at the byte it had reached (:mod:`shardpipes._retry` decides what is transient);
:class:`Filling` copies a stream into a reserved cache file and publishes it when whole
(:mod:`shardpipes._cache`). Both count what they read in :data:`READ_STATS`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from shardpipes._cache import ShardCache
from shardpipes._retry import RetryPolicy, denied, transient
from shardpipes.errors import ShardNotFoundError, ShardpipesError, StorageAccessError, StorageError

__all__ = ["READ_STATS", "Filling", "ReadStats", "ResilientStream", "raise_permanent"]

T = TypeVar("T")


class ReadStats:
    """Bytes read and files opened through :func:`open_input` in this process.

    ``shardpipes.fs.READ_STATS`` counts what the pipes consume (what a resumed epoch
    reads again, what each worker reads of an indexed shard); a backend's read-ahead may
    transfer more. ``retries`` counts reads and opens tried again after a transient failure;
    ``cache_hits`` the opens served from a local shard cache (not counted in ``bytes``).
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.opens = 0
        self.retries = 0
        self.cache_hits = 0

    def reset(self) -> None:
        """Start counting from zero."""
        self.bytes = self.opens = self.retries = self.cache_hits = 0


READ_STATS = ReadStats()


class Filling:
    """A stream that copies what it reads into a reserved cache file, published when whole."""

    def __init__(
        self, stream: ResilientStream, cache: ShardCache, temp: Path, url: str, size: int
    ) -> None:
        self._stream, self._cache, self._temp, self._url, self._size = (
            stream, cache, temp, url, size,
        )  # fmt: skip
        self._out: IO[bytes] | None = open(temp, "r+b")  # noqa: SIM115 (closed in close())

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        if self._out is not None:
            self._out.write(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        before = self._stream.tell()
        after = self._stream.seek(offset, whence)
        if after != before:  # not a sequential read: no cache entry
            self._drop()
        return after

    def tell(self) -> int:
        return self._stream.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        try:
            if self._out is not None:
                self._complete()
        finally:
            self._drop()
            self._stream.close()

    def _complete(self) -> None:
        """Read the little that the tar reader leaves (end padding), then publish the entry."""
        assert self._out is not None
        rest = self._size - self._stream.tell()
        if not 0 <= rest <= _TAIL:
            return
        while data := self._stream.read(_TAIL):
            self._out.write(data)
        if self._out.tell() == self._size == self._stream.tell():
            self._out.close()
            self._out = None
            self._cache.commit(self._temp, self._url)

    def _drop(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None
            self._cache.abandon(self._temp)

    def __enter__(self) -> Filling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TAIL = 1 << 20  # read at most this much more to complete a cache entry


class ResilientStream:
    """A read stream over an fsspec file that reopens at its offset after a transient failure."""

    def __init__(self, url: str, filesystem: Any, path: str, retry: RetryPolicy) -> None:
        self.url, self.retry = url, retry
        self._fs, self._path = filesystem, path
        self.pos = 0
        self._file: Any = None
        self._attempts("open", lambda: None)  # opens, with retries

    def size(self) -> int | None:
        """The file's size, where the backend knows it from opening."""
        size = getattr(self._file, "size", None)
        return size if isinstance(size, int) else None

    def _open(self) -> Any:
        file = self._fs.open(self._path, "rb")
        if self.pos:
            file.seek(self.pos)
        READ_STATS.opens += 1
        return file

    def _attempts(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``; on a transient failure, reopen at ``pos`` and try again (``retries`` times)."""

        def attempt() -> T:
            if self._file is None:
                self._file = self._open()
            return fn()

        try:
            return self.retry.call(f"{self.url} at byte {self.pos}", attempt, self._recover)
        except Exception as exc:
            raise_permanent(exc, self.url)
            if not transient(exc):
                raise
            problem = (
                f"{what} failed after {self.retry.retries} retries: {type(exc).__name__}: {exc}"
            )
            raise StorageError(problem, url=self.url, offset=self.pos) from exc

    def _recover(self) -> None:
        READ_STATS.retries += 1
        self._discard()

    def _discard(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(Exception):
                file.close()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._attempts("read", lambda: self._file.read(n))
        self.pos += len(data)
        READ_STATS.bytes += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.pos + offset}.get(whence)
        if target is None:  # from the end: the backend knows the size
            target = self._attempts("seek", lambda: self._file.seek(offset, whence))
        else:
            self._attempts("seek", lambda: self._file.seek(target))
        self.pos = int(target)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._discard()

    def __enter__(self) -> ResilientStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def raise_permanent(exc: BaseException, url: str) -> None:
    """Raise the shardpipes error for a missing file or a refusal; return otherwise."""
    if isinstance(exc, ShardpipesError):
        raise exc
    if isinstance(exc, FileNotFoundError):
        msg = "no such file"
        raise ShardNotFoundError(msg, url=url) from exc
    if denied(exc):
        msg = f"access denied (check the credentials in storage_options): {exc}"
        raise StorageAccessError(msg, url=url) from exc
