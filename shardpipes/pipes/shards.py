"""The source of a pipeline: ``list_shards``, shard URLs from brace patterns and globs."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from typing_extensions import override

from shardpipes import fs
from shardpipes._core.braces import expand_braces
from shardpipes._core.stage import Leaf
from shardpipes.errors import NoShardsError, ShardNotFoundError
from shardpipes.fs.retry import RetryPolicy
from shardpipes.pipes._stage import Pipe
from shardpipes.pipes._torch import worker_placement

__all__ = ["SIDECARS", "ShardLister"]


class ShardLister(Leaf, Pipe):
    """Yield shard URLs from brace patterns and globs (source: ``shardpipes.list_shards``).

    Each pattern has its braces expanded first (``{000..127}`` keeps zero padding,
    ``{a,b}``, several groups), then each expansion holding ``*``, ``?`` or ``[…]`` is globbed
    through fsspec (``**`` recurses). The given order is kept; the files of one glob are
    sorted. URLs are resolved when iterated (in the worker), not at construction.

    Every URL is checked to exist, so a missing shard fails the epoch at its start, not
    when a worker reaches it: a glob's files exist; the others are found with one listing
    per folder on ``s3://``, ``gs://`` and ``az://``, one lookup each elsewhere (see
    :func:`shardpipes.fs.missing_files`). Iterated alone, the lister checks before it
    yields the first URL; under a reading stage (``open_tar``, the recipes) the check runs
    while the first shards are fetched, and its error comes before the first sample — or,
    where more than 16 shards are each looked up by a request (HTTP, which has no
    listing), as the first missing one is opened or the epoch ends: the first batch does
    not wait for them all.

    Args:
        urls: One pattern or a list of patterns: local paths, ``file://``, ``memory://``,
            ``s3://``… any fsspec URL.
        storage_options: Passed unchanged to the fsspec filesystem (credentials, endpoint).
        check_exists: Check that the shards exist before yielding any (one listing per
            folder); ``False`` leaves a missing one to fail when it is opened.
        retries: Tries again after a transient failure of a listing or lookup.

    Raises:
        NoShardsError: When iterated, if a glob matches no file; the message quotes it.
        ShardNotFoundError: When iterated, if a shard does not exist; the message names
            the first missing one and counts them.
        StorageError: When iterated, if the storage cannot be reached (after the retries).
        StorageAccessError: When iterated, if the storage refuses the credentials.

    Example:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> for i in range(3):
        ...     fs.pipe(f"/doc/train-{i:03d}.tar", b"")
        >>> list(ShardLister("memory://doc/train-{000..001}.tar"))
        ['memory://doc/train-000.tar', 'memory://doc/train-001.tar']
        >>> len(ShardLister(["memory://doc/train-*.tar"]))
        3
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        storage_options: Mapping[str, Any] | None = None,
        check_exists: bool = True,
        retries: int = RetryPolicy.retries,
    ) -> None:
        super().__init__()
        given = [urls] if isinstance(urls, str | os.PathLike) else urls
        if isinstance(given, Sequence):  # paths are taken as their strings
            given = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in given]
        if not isinstance(given, list) or not given or not all(isinstance(p, str) for p in given):
            msg = f"urls must be a string or a non-empty list of strings (got {urls!r})"
            raise TypeError(msg)
        patterns: list[str] = given
        for pattern in patterns:
            expand_braces(pattern)  # fail early on unbalanced braces
        for pattern in patterns:
            # imported here, once: forked DataLoader workers inherit it, ready to read
            fs.load_backend(pattern)
        self.urls = list(patterns)
        self.storage_options = dict(storage_options or {})
        for pattern in patterns:
            if "::" in pattern:
                fs.check_chained(pattern, self.storage_options)
        self.check_exists = bool(check_exists)
        self.retries = RetryPolicy(retries).retries  # validated
        self._defer = False  # check in the background; the reading stage waits (checked())
        self._checking: Future[None] | None = None
        self._long = False  # the check asks about more shards than one round of lookups

    def defer_check(self) -> None:
        """Let the next iteration check in the background, while the first shard is read.

        The reading stage downstream (``open_tar``, ``ShardStream``) calls this as an epoch
        begins, and :meth:`checked` before it yields the epoch's first sample.
        """
        self._defer = True

    def checked(self, *, first: bool = False) -> None:
        """Wait for a check begun in the background; raise what it found.

        ``first``: before the epoch's first sample, where a check that asks about each
        shard by a request of its own (HTTP) past one round of lookups is not waited for
        (1,000 shards over a 50 ms round trip: 3.5 s): a missing shard then fails as it is
        opened, with the check's message, or the epoch at its end.
        """
        if first and self._long:
            return
        checking, self._checking = self._checking, None
        if checking is not None:
            checking.result()

    def __iter__(self) -> Iterator[str]:
        urls, named = [], []  # named: not from a glob, so not known to exist
        for pattern in self.urls:
            for url in expand_braces(pattern):
                found = self._glob(url) if fs.has_magic(url) else [_not_a_folder(url)]
                urls += found
                named += [] if fs.has_magic(url) else found
        defer, self._defer = self._defer, False
        if self.check_exists and named and defer:
            self._checking = _in_thread(functools.partial(self._check, named, len(urls)))
            self._long = fs.slow_to_check(named)
        elif self.check_exists and named:
            self._check(named, len(urls))
        yield from urls

    def _glob(self, url: str) -> list[str]:
        found = [name for name in fs.glob(url, self.storage_options) if not name.endswith(SIDECARS)]
        if not found:
            msg = "no shard matches the pattern"
            raise NoShardsError(msg, url=url)
        return found

    def _check(self, urls: list[str], total: int) -> None:
        absent = fs.missing_files(urls, self.storage_options, RetryPolicy(self.retries))
        if not absent:
            return
        msg = "no such file"
        if total > 1:
            shown = ", ".join(absent[:3]) + (", …" if len(absent) > 3 else "")
            msg += f" ({len(absent)} of {total} shards missing"
            msg += f": {shown})" if len(absent) > 1 else ")"
        raise ShardNotFoundError(msg, url=absent[0])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @override
    def placement(self) -> tuple[int, int]:
        return worker_placement()

    @override
    def listed_options(self) -> dict[str, Any]:
        return self.storage_options


#: what shardpipes writes beside shards: a glob over the shards' names leaves them out
SIDECARS = (".idx", "classes.json")


def _not_a_folder(url: str) -> str:
    """``url``, unless it names a folder (its shards were meant): then an error saying so."""
    if fs.is_folder(url):
        msg = f"a folder, not a shard: give the shards in it, e.g. {url.rstrip('/') + '/*.tar'!r}"
        raise NoShardsError(msg, url=url)
    return url


def _in_thread(fn: Callable[[], None]) -> Future[None]:
    """Run ``fn`` in a daemon thread; its future."""
    future: Future[None] = Future()

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to whoever waits
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=run, daemon=True, name="shardpipes-check").start()
    return future
