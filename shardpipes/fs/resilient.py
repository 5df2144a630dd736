"""The read statistics, and the retrying stream of local files and chained URLs.

:class:`ResilientStream` reads an fsspec file and, after a transient failure, opens it
again at the byte it had reached (:mod:`shardpipes.fs.retry` decides what is transient).
Remote files are read by :mod:`shardpipes.fs.readahead` instead. Both count what they read
in :data:`READ_STATS`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from shardpipes.errors import ShardNotFoundError, ShardpipesError, StorageAccessError
from shardpipes.fs.retry import RetryPolicy, denied, gave_up, missing, transient

__all__ = ["READ_STATS", "ReadOnly", "ReadStats", "ResilientStream", "call_storage"]

T = TypeVar("T")


class ReadStats:
    """Bytes read and files opened through :func:`open_input` in this process.

    ``shardpipes.fs.READ_STATS`` counts what the pipes consume in ``bytes`` (what a resumed
    epoch reads again, what each worker reads of an indexed shard); ``fetched`` counts the
    bytes that ranged requests (``requests``) brought from storage, which reading ahead
    makes a little more than ``bytes`` where an epoch stops early. ``retries`` counts
    requests tried again after a transient failure; ``cache_hits`` the opens served from a
    local shard cache (not counted in ``bytes``). Each process counts its own reads: with
    DataLoader workers, read it in the workers (e.g. in a ``map`` stage).
    """

    _FIELDS = ("bytes", "opens", "retries", "cache_hits", "requests", "fetched")

    def __init__(self) -> None:
        self.bytes = self.opens = self.retries = self.cache_hits = 0
        self.requests = self.fetched = 0
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):  # a fetching thread may hold it at a fork
            os.register_at_fork(after_in_child=self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def count(self, **counts: int) -> None:
        """Add to the counts (from any thread)."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def reset(self) -> None:
        """Start counting from zero."""
        with self._lock:
            for name in self._FIELDS:
                setattr(self, name, 0)


READ_STATS = ReadStats()


class ReadOnly:
    """What the read streams share: a position, and the file protocol's answers."""

    pos = 0

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """Release what the stream holds."""

    def __enter__(self) -> ReadOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ResilientStream(ReadOnly):
    """A read stream over an fsspec file that reopens at its offset after a transient failure."""

    def __init__(self, url: str, filesystem: Any, path: str, retry: RetryPolicy) -> None:
        self.url, self.retry = url, retry
        self._fs, self._path = filesystem, path
        self.pos = 0
        self._file: Any = None
        self._attempts("open", lambda: None)  # opens, with retries

    def _open(self) -> Any:
        file = self._fs.open(self._path, "rb")
        if self.pos:
            file.seek(self.pos)
        READ_STATS.count(opens=1)
        return file

    def _attempts(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``; on a transient failure, reopen at ``pos`` and try again (``retries`` times)."""

        def attempt() -> T:
            if self._file is None:
                self._file = self._open()
            return fn()

        return call_storage(self.retry, self.url, attempt, what, self.pos, self._recover)

    def _recover(self) -> None:
        READ_STATS.count(retries=1)
        self._discard()

    def _discard(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(Exception):
                file.close()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._attempts("read", lambda: self._file.read(n))
        self.pos += len(data)
        READ_STATS.count(bytes=len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.pos + offset}.get(whence)
        if target is None:  # from the end: the backend knows the size
            target = self._attempts("seek", lambda: self._file.seek(offset, whence))
        else:
            self._attempts("seek", lambda: self._file.seek(target))
        self.pos = int(target)
        return self.pos

    def close(self) -> None:
        self._discard()


def call_storage(
    retry: RetryPolicy,
    url: str,
    fn: Callable[[], T],
    what: str,
    offset: int | None = None,
    recover: Callable[[], object] | None = None,
) -> T:
    """``retry.call(fn, recover)``, its failures as the shardpipes errors that name ``url``.

    A missing file is a :class:`ShardNotFoundError`, a refusal a :class:`StorageAccessError`
    (neither retried), a transient failure past the retries the ``StorageError`` of
    :func:`~shardpipes.fs.retry.gave_up` (``what`` failed at ``offset``); anything else, and
    a shardpipes error, is raised as it is.
    """
    try:
        return retry.call(url if offset is None else f"{url} at byte {offset}", fn, recover)
    except Exception as exc:
        if isinstance(exc, ShardpipesError):
            raise
        if missing(exc):
            msg = "no such file"
            raise ShardNotFoundError(msg, url=url) from exc
        if denied(exc):
            msg = f"access denied (check the credentials in storage_options): {exc}"
            raise StorageAccessError(msg, url=url) from exc
        if not transient(exc):
            raise
        raise gave_up(exc, url, what, retry.retries, offset) from exc
