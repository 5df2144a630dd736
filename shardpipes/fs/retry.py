"""Retrying storage calls: which failures are transient, and how long to wait between tries.

One policy for every backend. s3fs, botocore, gcsfs, adlfs and aiohttp each raise their
own exception types (and s3fs and botocore each retry on their own, 5 × 5 attempts and 37 s
on a persistent 503); :mod:`shardpipes.fs` turns the backends' own retries down where it
can and retries here instead, so a flaky network costs ``retries`` tries, not a storm.

A failure is **transient** (worth retrying) when anything in its cause chain is a
connection or timeout error, a truncated or unparseable response, an HTTP 5xx, 408 or 429
status, or an S3 ``SlowDown``; it is **permanent** when it is a missing file
(``FileNotFoundError``: 404, ``NoSuchKey``, ``NoSuchBucket``) or a refusal
(``PermissionError``, 401, 403, missing credentials). Anything else is not retried either.
A missing file whose cause is a failed connection (fsspec's HTTP backend reports an
unreachable server as ``FileNotFoundError``) is a failure to reach it, hence transient.
"""

from __future__ import annotations

import errno
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from shardpipes.errors import StorageError

__all__ = ["RetryPolicy", "denied", "gave_up", "missing", "transient"]

log = logging.getLogger("shardpipes")

T = TypeVar("T")

_ERRNOS = frozenset(
    {
        errno.EBUSY,  # s3fs: SlowDown / 503
        errno.EREMOTEIO,  # s3fs: 500
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EAGAIN,
        errno.ENETRESET,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
    }
)
# exception class names (anywhere in the class's bases) of the backends' transient errors,
# matched by name so that no optional backend has to be imported
_NAMES = frozenset(
    {
        "ClientPayloadError",  # aiohttp: body cut short
        "ClientConnectionError",  # aiohttp: resets, disconnects, refused connections
        "ServerTimeoutError",
        "EndpointConnectionError",  # botocore
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteRead",  # http.client, urllib3
        "ProtocolError",
        "RemoteDisconnected",
        "FSTimeoutError",  # fsspec
        "ServiceRequestError",  # azure-core
        "ServiceResponseError",
        "TransportError",  # google-auth
    }
)
_MARKERS = ("SlowDown", "reduce your request rate", "RequestTimeout")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> int | None:
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


_REFUSALS = frozenset(
    {
        "ClientAuthenticationError",  # azure-core
        "RefreshError",  # google-auth
        "NoCredentialsError",  # botocore: none found in storage_options nor the environment
        "PartialCredentialsError",
    }
)


def denied(exc: BaseException) -> bool:
    """Whether ``exc`` is a refusal: ``PermissionError``, an HTTP 401/403, a bad credential."""
    return any(
        isinstance(e, PermissionError)
        or _status(e) in (401, 403)
        or any(c.__name__ in _REFUSALS for c in type(e).__mro__)
        for e in _chain(exc)
    )


def _trouble(e: BaseException) -> bool:
    """Whether ``e`` itself is a connection failure, a timeout, a cut response or a 5xx."""
    if (
        isinstance(e, ConnectionError | TimeoutError)
        or (isinstance(e, OSError) and e.errno in _ERRNOS)
        or any(c.__name__ in _NAMES for c in type(e).__mro__)
    ):
        return True
    status = _status(e)
    if status is not None and (status >= 500 or status in (408, 429)):
        return True
    return any(marker in str(e) for marker in _MARKERS)


def missing(exc: BaseException) -> bool:
    """Whether ``exc`` says that the file is not there (not that it could not be reached)."""
    chain = list(_chain(exc))
    not_found = any(isinstance(e, FileNotFoundError) or _status(e) == 404 for e in chain)
    return not_found and not any(_trouble(e) for e in chain)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is a failure that a new try may not meet."""
    return not denied(exc) and not missing(exc) and any(_trouble(e) for e in _chain(exc))


def gave_up(
    exc: BaseException, url: str, what: str, retries: int, offset: int | None = None
) -> StorageError:
    """The :class:`~shardpipes.errors.StorageError` for a transient failure past the retries.

    It quotes the failure itself: the first transient one in the cause chain that says
    something (fsspec's HTTP backend reports a refused connection as a ``FileNotFoundError``
    caused by it, a timeout as an empty ``FSTimeoutError``).
    """
    troubles = [e for e in _chain(exc) if _trouble(e)] or [exc]
    cause = next((e for e in troubles if str(e)), troubles[0])  # FSTimeoutError says nothing
    said = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    problem = f"{what} failed after {retries} retries: {said}"
    return StorageError(problem, url=url, offset=offset)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient failure.

    Attributes:
        retries: Tries after the first (0: none).
        backoff: Base wait in seconds; try ``i`` waits a random time up to
            ``min(backoff * 2**i, max_backoff)`` ("full jitter"), so many workers that
            failed together do not come back together.
        max_backoff: The longest wait.
    """

    retries: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            msg = f"retries must be a non-negative int (got {self.retries!r})"
            raise ValueError(msg)

    def wait(self, attempt: int) -> float:
        """Sleep before try ``attempt + 1``; return how long."""
        seconds = random.uniform(0, min(self.backoff * 2**attempt, self.max_backoff))
        time.sleep(seconds)
        return seconds

    def call(
        self, what: str, fn: Callable[[], T], recover: Callable[[], object] | None = None
    ) -> T:
        """``fn()``, retried on transient failures; the last failure is raised as is.

        Args:
            what: The operation and URL, for the log line of each retry (a warning on the
                ``shardpipes`` logger).
            fn: The call.
            recover: Called after a transient failure, before waiting (e.g. to drop a
                broken connection).
        """
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as exc:  # noqa: PERF203 (a failure is rare; the loop is the retry)
                if attempt == self.retries or not transient(exc):
                    raise
                if recover is not None:
                    recover()
                waited = self.wait(attempt)
                log.warning(
                    "%s: %s: %s; retry %d of %d after %.2f s",
                    what, type(exc).__name__, exc, attempt + 1, self.retries, waited,
                )  # fmt: skip
        raise AssertionError  # unreachable: the last attempt returns or raises
