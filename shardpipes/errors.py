"""The exception hierarchy.

Every data error names where it happened: the shard URL, and where known the member, the
sample key and the byte offset in the (uncompressed) tar stream. Each also subclasses the
built-in exception a caller would catch anyway (``FileNotFoundError``, ``ValueError``,
``KeyError``), so ``except ValueError`` keeps working around shardpipes code.
"""

from __future__ import annotations

import functools

__all__ = [
    "DecodeError",
    "MissingFieldError",
    "NoShardsError",
    "ShardIndexError",
    "ShardNotFoundError",
    "ShardpipesError",
    "StorageAccessError",
    "StorageError",
    "TarFormatError",
    "TooManyErrorsError",
    "UnsafeDataError",
]


class ShardpipesError(Exception):
    """Base class of every error raised by shardpipes about data.

    Args:
        problem: What went wrong, without the location.
        url: The shard URL (or pattern) the problem is in.
        member: The tar member name, if the problem is in one member.
        key: The sample key (``__key__``), if known.
        offset: The byte offset of the member's header in the tar stream, if known.

    The message reads ``"{url}: {problem} (member 'x.jpg' at byte 1024)"``.
    """

    def __init__(
        self,
        problem: str,
        *,
        url: str | None = None,
        member: str | None = None,
        key: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.problem = problem
        self.url = url
        self.member = member
        self.key = key
        self.offset = offset
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.member is not None:
            where.append(f"member {self.member!r}")
        elif self.key is not None:
            where.append(f"sample {self.key!r}")
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        message = f"{self.url}: {self.problem}" if self.url is not None else self.problem
        return f"{message} ({' '.join(where)})" if where else message

    __str__ = _format

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields survive pickling (DataLoader workers send errors to the parent).
        kwargs = {name: getattr(self, name) for name in ("url", "member", "key", "offset")}
        return (functools.partial(type(self), **kwargs), (self.problem,))


class ShardNotFoundError(ShardpipesError, FileNotFoundError):
    """A shard URL does not exist (or its bucket does not)."""


class StorageAccessError(ShardpipesError, PermissionError):
    """The storage refused access to a URL (bad credentials, no permission); not retried."""


class StorageError(ShardpipesError, OSError):
    """Reading a URL kept failing (connection resets, timeouts, 5xx) past the retries."""


class NoShardsError(ShardpipesError, FileNotFoundError):
    """A shard pattern matched nothing."""


class TarFormatError(ShardpipesError, ValueError):
    """A shard is not a readable tar stream: bad header, truncation, bad gzip data."""


class DecodeError(ShardpipesError, ValueError):
    """A member could not be decoded by the decoder chosen for its extension."""


class UnsafeDataError(DecodeError):
    """A member would need unpickling (code execution) to decode, and it was not allowed."""


class TooManyErrorsError(ShardpipesError, RuntimeError):
    """An epoch skipped more bad members, samples or shards than its ``max_errors`` budget."""


class ShardIndexError(ShardpipesError, ValueError):
    """A tar index (``.idx`` sidecar) is malformed or does not match its shard."""


class MissingFieldError(ShardpipesError, KeyError):
    """A sample lacks a field that ``to_tuple`` asked for."""
