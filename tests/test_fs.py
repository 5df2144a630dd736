"""shardpipes.fs without a network: failure classes, retries, backends, sizes."""

from __future__ import annotations

import errno
import logging

import pytest

from shardpipes import fs
from shardpipes._cache import cache_bytes
from shardpipes._retry import RetryPolicy, denied, transient


class StatusError(Exception):
    """An error carrying an HTTP status, as aiohttp's and azure's do."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def caused(outer: Exception, cause: Exception) -> Exception:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (TimeoutError("read timed out"), True),
        (OSError(errno.EBUSY, "SlowDown"), True),  # s3fs's 503
        (OSError(errno.EREMOTEIO, "InternalError"), True),  # s3fs's 500
        (StatusError(503), True),
        (StatusError(429), True),
        (caused(ValueError("wrapped"), ConnectionResetError()), True),
        (FileNotFoundError("no such key"), False),
        (PermissionError("Forbidden"), False),
        (StatusError(403), False),
        (StatusError(404), False),
        (caused(OSError(errno.EBUSY, "busy"), PermissionError()), False),  # a refusal wins
        (ValueError("a bug"), False),
    ],
)
def test_transient_or_not(exc: Exception, expected: bool) -> None:
    assert transient(exc) is expected


def test_refusals() -> None:
    assert denied(PermissionError()) and denied(StatusError(401)) and denied(StatusError(403))
    assert not denied(StatusError(500)) and not denied(FileNotFoundError())


def test_retry_policy_retries_transient_failures_only(caplog: pytest.LogCaptureFixture) -> None:
    """Two resets then success: 3 calls, 2 warnings; a permanent failure: 1 call."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        return "ok"

    policy = RetryPolicy(retries=3, backoff=0.001)
    with caplog.at_level(logging.WARNING, logger="shardpipes"):
        assert policy.call("s3://b/k", flaky) == "ok"
    assert len(calls) == 3 and [r.levelname for r in caplog.records] == ["WARNING"] * 2
    calls.clear()

    def missing() -> str:
        calls.append(1)
        msg = "s3://b/k"
        raise FileNotFoundError(msg)

    with pytest.raises(FileNotFoundError):
        policy.call("s3://b/k", missing)
    assert len(calls) == 1


def test_retry_policy_gives_up_after_retries() -> None:
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        msg = "timed out"
        raise TimeoutError(msg)

    with pytest.raises(TimeoutError):
        RetryPolicy(retries=2, backoff=0.001).call("x", down)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="retries must be a non-negative int"):
        RetryPolicy(retries=-1)


def test_missing_backend_names_what_to_install() -> None:
    with pytest.raises(ImportError, match="dropbox:// URLs needs an extra package"):
        fs.url_to_fs("dropbox://folder/x.tar")


def test_unknown_protocol() -> None:
    with pytest.raises(ValueError, match=r"^foo://x\.tar: unknown protocol 'foo'"):
        fs.url_to_fs("foo://x.tar")


def test_cache_sizes() -> None:
    assert cache_bytes("20GB") == 20 * 10**9 and cache_bytes("1GiB") == 2**30
    assert cache_bytes(4096) == 4096
    with pytest.raises(ValueError, match="size must look like"):
        cache_bytes("lots")
    with pytest.raises(ValueError, match="at least 1 byte"):
        cache_bytes(0)
    with pytest.raises(TypeError):
        cache_bytes(True)
