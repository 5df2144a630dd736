"""shardpipes.fs without a network: failure classes, retries, backends, sizes."""

from __future__ import annotations

import errno
import logging

import pytest
from botocore.exceptions import NoCredentialsError

import shardpipes as sp
from shardpipes import fs
from shardpipes.errors import StorageError
from shardpipes.fs.cache import cache_bytes
from shardpipes.fs.retry import RetryPolicy, denied, gave_up, missing, transient


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
        # fsspec's HTTP backend: "not found" for a server it could not reach, or that failed
        (caused(FileNotFoundError("http://h/x"), ConnectionRefusedError()), True),
        (caused(FileNotFoundError("http://h/x"), StatusError(503)), True),
        (caused(FileNotFoundError("http://h/x"), StatusError(404)), False),
        (NoCredentialsError(), False),
    ],
)
def test_transient_or_not(exc: Exception, expected: bool) -> None:
    assert transient(exc) is expected


def test_refusals() -> None:
    assert denied(PermissionError()) and denied(StatusError(401)) and denied(StatusError(403))
    assert not denied(StatusError(500)) and not denied(FileNotFoundError())
    assert denied(NoCredentialsError()) and denied(caused(ValueError(), NoCredentialsError()))


def test_missing_is_a_file_not_there_not_a_server_not_reached() -> None:
    assert missing(FileNotFoundError("s3://b/k")) and missing(StatusError(404))
    assert not missing(caused(FileNotFoundError("http://h/x"), ConnectionRefusedError()))
    assert not missing(PermissionError()) and not missing(TimeoutError())


def test_gave_up_quotes_the_failure_in_the_chain() -> None:
    """The error after the retries names the URL and the failure that said something."""
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    error = gave_up(caused(FileNotFoundError("http://h/x"), refused), "http://h/x", "listing", 5)
    assert isinstance(error, StorageError) and error.url == "http://h/x"
    assert str(error) == (
        "http://h/x: listing failed after 5 retries: "
        "ConnectionRefusedError: [Errno 111] Connect call failed"
    )
    assert (
        str(gave_up(TimeoutError(), "u", "open", 0))
        == "u: open failed after 0 retries: TimeoutError"
    )


class TestBackendOptions:
    def test_defaults_where_the_user_set_none(self) -> None:
        """Every backend gets its retries off and the connect timeout, unless already set."""
        s3 = fs.backend_options("s3://b/k", {"key": "k"})
        assert s3["key"] == "k" and s3["default_block_size"] == fs.backends.S3_BLOCK_SIZE
        assert s3["config_kwargs"] == {
            "retries": {"total_max_attempts": 1},
            "connect_timeout": fs.CONNECT_TIMEOUT,
            "read_timeout": fs.READ_TIMEOUT,
            "signature_version": "s3v4",
        }
        assert fs.backend_options("gs://b/k", {})["requests_timeout"].sock_connect == 10
        az = fs.backend_options("az://c/k", {})
        assert (az["connection_timeout"], az["read_timeout"]) == (10, 60)
        timeout = fs.backend_options("https://h/k", {})["client_kwargs"]["timeout"]
        assert (timeout.total, timeout.sock_connect, timeout.sock_read) == (None, 10, 60)
        assert fs.backend_options("data/x.tar", {"a": 1}) == {"a": 1}

    def test_the_users_own_settings_win(self) -> None:
        given = {"config_kwargs": {"retries": {"max_attempts": 3}, "connect_timeout": 2}}
        config = fs.backend_options("s3://b/k", given)["config_kwargs"]
        assert config["retries"] == {"max_attempts": 3} and config["connect_timeout"] == 2
        assert fs.backend_options("gs://b/k", {"requests_timeout": 5})["requests_timeout"] == 5
        http = fs.backend_options("http://h/k", {"client_kwargs": {"timeout": 7, "x": 1}})
        assert http["client_kwargs"] == {"timeout": 7, "x": 1}

    def test_chained_urls_take_them_per_protocol(self) -> None:
        """``simplecache::s3://``: the s3 defaults go under "s3", beside the user's own."""
        options = fs.backend_options("simplecache::s3://b/k", {"s3": {"key": "k"}, "x": 1})
        assert options["x"] == 1 and options["s3"]["key"] == "k"
        assert options["s3"]["config_kwargs"]["connect_timeout"] == fs.CONNECT_TIMEOUT
        assert "config_kwargs" not in options  # not for the cache layer


def test_s3fs_retries_off_unless_the_user_set_botocores() -> None:
    """s3fs's own attempts go down to 1 with botocore's; the user's setting keeps both."""
    ours, _ = fs.url_to_fs("s3://b/k", {"anon": True, "skip_instance_cache": True})
    assert ours.retries == 1
    config = {"retries": {"max_attempts": 3}}
    theirs, _ = fs.url_to_fs("s3://b/k", {"anon": True, "config_kwargs": config})
    assert theirs.retries == 5


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


def test_webdatasets_pipe_urls_say_what_to_give() -> None:
    """pipe:curl ... was 'no such file'; now refused when listed, naming the way out."""
    for make in (sp.list_shards, sp.recipes.tar_shards):
        with pytest.raises(ValueError, match=r"^pipe:cat a\.tar: webdataset's pipe: URLs .* s3://"):
            make("pipe:cat a.tar")


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


class TestS3Session:
    """s3fs's botocore session shares one parsed set of S3 models per process tree."""

    def test_the_session_uses_the_shared_models(self) -> None:
        pytest.importorskip("s3fs")
        fs.load_backend("s3://b/k")
        options = fs.backend_options("s3://b/k", {"key": "k", "secret": "s"})
        session = options["session"]
        assert session.get_component("data_loader") is fs.backends._botocore_models()
        assert fs.backend_options("s3://b/k", {})["session"] is session  # one per process

    def test_options_for_the_session_keep_s3fs_own(self) -> None:
        pytest.importorskip("s3fs")
        assert "session" not in fs.backend_options("s3://b/k", {"profile": "p"})
        mine = object()
        assert fs.backend_options("s3://b/k", {"session": mine})["session"] is mine
