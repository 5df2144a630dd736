"""Failing fast and in one line: unreachable endpoints, refused credentials, missing shards.

The endpoints are on 127.0.0.1: a port with nothing listening (refused at once), and a
listener whose accept queue is full (connection attempts get no answer, as from a host
behind a firewall that drops them). The time bounds are generous safety limits: before
shardpipes turned the backends' own retries down, a refused gs:// endpoint took 205 s and
an az:// one 502 s.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import shardpipes as sp
from shardpipes import fs
from tests.cloud.conftest import require_module
from tests.cloud.servers import HOST, TEST_KEY, TEST_SECRET, SeaweedS3, StaticHTTP, patched_env
from tests.cloud.servers_gcs_azure import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    GCS_PROJECT,
    Azurite,
    FakeGCS,
)
from tests.conftest import Dataset

BACKENDS = ["s3", "gs", "az", "http"]
MODULES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "http": "aiohttp"}
BOUND = 30.0  # seconds: a safety limit, far above the expected time to failure


def shard_and_options(backend: str, endpoint: str) -> tuple[str, dict[str, Any]]:
    """A shard URL on ``endpoint`` and the storage options that send ``backend`` there."""
    require_module(MODULES[backend])
    options: dict[str, Any]
    if backend == "s3":
        url = "s3://bucket-sp/train-000000.tar"
        options = {
            "key": TEST_KEY,
            "secret": TEST_SECRET,
            "client_kwargs": {"endpoint_url": endpoint},
        }
    elif backend == "gs":
        url = "gs://bucket-sp/train-000000.tar"
        options = {"endpoint_url": endpoint, "token": "anon", "project": GCS_PROJECT}
    elif backend == "az":
        url = "az://container-sp/train-000000.tar"
        options = {
            "connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        }
    else:
        url, options = f"{endpoint}/train-000000.tar", {}
    return url, {**options, "skip_instance_cache": True}


@pytest.fixture
def refused() -> str:
    """An endpoint where nothing listens: every connection is refused at once."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
    return f"http://{HOST}:{port}"


@pytest.fixture
def unanswered() -> Iterator[str]:
    """An endpoint whose connection attempts get no answer (a full accept queue)."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind((HOST, 0))
        listener.listen(0)  # room for one connection, never accepted
        port = listener.getsockname()[1]
        filler = stack.enter_context(socket.create_connection((HOST, port), timeout=5))
        assert filler.fileno() >= 0
        probe = stack.enter_context(socket.socket())
        probe.settimeout(0.5)
        with pytest.raises(TimeoutError):  # the queue is full: connections now hang
            probe.connect((HOST, port))
        yield f"http://{HOST}:{port}"


def fail(url: str, options: dict[str, Any], **kwargs: Any) -> tuple[BaseException, float]:
    """Iterate ``tar_shards`` over ``url``; return the error it raised and the seconds it took."""
    began = time.monotonic()
    with pytest.raises(sp.ShardpipesError) as info:
        list(sp.recipes.tar_shards(url, storage_options=options, **kwargs))
    return info.value, time.monotonic() - began


@pytest.mark.parametrize("backend", BACKENDS)
def test_refused_endpoint_fails_fast_naming_the_url(backend: str, refused: str) -> None:
    """Nothing listening: StorageError naming the URL after shardpipes' 5 retries only.

    The check that the shards exist and the first shard's read run at once: whichever
    fails first is reported.
    """
    url, options = shard_and_options(backend, refused)
    error, seconds = fail(url, options)
    assert type(error) is sp.StorageError  # not ShardNotFoundError (fsspec's HTTP says so)
    assert re.match(
        rf"{re.escape(url)}: (listing|looking it up|open) failed after 5 retries", str(error)
    )
    assert seconds < BOUND


@pytest.mark.parametrize(
    "backend",
    [
        *BACKENDS[:3],
        "http",
    ],
)
def test_refused_endpoint_when_opening(backend: str, refused: str) -> None:
    """Unchecked, the open fails the same way: StorageError naming the URL, bounded time."""
    url, options = shard_and_options(backend, refused)
    error, seconds = fail(url, options, check_exists=False, retries=2)
    assert type(error) is sp.StorageError
    assert str(error).startswith(f"{url}: open failed after 2 retries")
    assert seconds < BOUND


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_unanswered_connection_times_out(backend: str, unanswered: str) -> None:
    """No answer to connecting: one try, ended by the connect timeout (no backend retries)."""
    url, options = shard_and_options(backend, unanswered)
    error, seconds = fail(url, options, retries=0)  # one try: CONNECT_TIMEOUT (10 s)
    assert type(error) is sp.StorageError
    assert re.match(
        rf"{re.escape(url)}: (listing|looking it up|open) failed after 0 retries", str(error)
    )
    assert fs.CONNECT_TIMEOUT <= seconds < 2 * fs.CONNECT_TIMEOUT  # no retry by the backend


def test_s3_without_credentials(s3_server: SeaweedS3, s3_bucket: str) -> None:
    """No credentials anywhere: StorageAccessError naming the URL, not botocore's own error."""
    url = f"s3://{s3_bucket}/train-000000.tar"
    options = {
        "client_kwargs": {"endpoint_url": s3_server.endpoint_url},
        "skip_instance_cache": True,
    }
    no_keys = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}
    with patched_env(no_keys):
        error, _ = fail(url, options)
    assert type(error) is sp.StorageAccessError
    assert str(error).startswith(f"{url}: access denied (check the credentials")
    assert "Unable to locate credentials" in str(error)


# -- missing shards are found before anything is read -----------------------------------


@pytest.fixture(params=["local", "s3", "gs", "az", "http"])
def folder(
    request: pytest.FixtureRequest, make_shards: Callable[..., Dataset]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Shards 0, 1, 3 (not 2) of 6 samples in a folder of each storage: (base URL, options)."""
    data = make_shards(4, 6)
    Path(data.urls[2]).unlink()
    present = [Path(u) for u in data.urls if Path(u).exists()]
    if request.param == "local":
        yield str(Path(data.urls[0]).parent), {}
        return
    if request.param == "http":
        server: StaticHTTP = request.getfixturevalue("http_server")
        name = server.new_folder()
        server.add({f"{name}/{p.name}": p for p in present})
        yield server.url(name), {}
        return
    fixture = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}[request.param]
    store: SeaweedS3 | FakeGCS | Azurite = request.getfixturevalue(fixture)
    with store.bucket_with(present) as bucket:
        yield f"{store.scheme}://{bucket}", store.storage_options


def test_missing_shards_fail_before_reading(folder: tuple[str, dict[str, Any]]) -> None:
    """Three of six listed shards missing: ShardNotFoundError naming them, before a sample.

    The check runs while the first shards are fetched (so they may have been opened), and
    its error comes before the epoch's first sample, whichever finishes first.
    """
    base, options = folder
    pattern = f"{base}/train-{{000000..000005}}.tar"
    delivered: list[object] = []
    samples = iter(sp.recipes.tar_shards(pattern, storage_options=options, shuffle=False))
    with pytest.raises(sp.ShardNotFoundError) as info:
        delivered.append(next(samples))
    missing = [f"{base}/train-{i:06d}.tar" for i in (2, 4, 5)]
    assert (
        str(info.value)
        == f"{missing[0]}: no such file (3 of 6 shards missing: {', '.join(missing)})"
    )
    assert info.value.url == missing[0]
    assert delivered == []  # train-000000 and 000001 exist, but came after the check


def test_many_http_shards_are_not_all_looked_up_before_the_first_sample(
    http_server: StaticHTTP, make_shards: Callable[..., Dataset]
) -> None:
    """40 shards over HTTP, one lookup each: the first samples come before the check ends.

    The missing shard fails as it is opened, with the check's message (naming and counting).
    """
    data = make_shards(40, 6)
    name = http_server.new_folder()
    http_server.add({f"{name}/{Path(u).name}": Path(u) for i, u in enumerate(data.urls) if i != 30})
    base = http_server.url(name)
    pattern = f"{base}/train-{{000000..000039}}.tar"
    delivered: list[object] = []

    def read_all() -> None:  # (not list.extend: it asks len() first, which lists the shards)
        for sample in sp.recipes.tar_shards(pattern, fields=("txt", "cls"), shuffle=False):
            delivered.append(sample)  # noqa: PERF402 - what came before the error

    with pytest.raises(sp.ShardNotFoundError) as info:
        read_all()
    missing = f"{base}/train-000030.tar"
    assert str(info.value) == f"{missing}: no such file (1 of 40 shards missing)"
    assert len(delivered) == 30 * 6


def test_present_shards_pass_the_check(folder: tuple[str, dict[str, Any]]) -> None:
    """The check finds every listed shard that exists, and lists them all, in order."""
    base, options = folder
    urls = [f"{base}/train-{i:06d}.tar" for i in (3, 0, 1)]
    assert list(sp.list_shards(urls, storage_options=options)) == urls
    assert fs.missing_files([*urls, f"{base}/train-000002.tar"], options) == [
        f"{base}/train-000002.tar"
    ]


def test_missing_bucket_is_every_shard_missing(s3_server: SeaweedS3) -> None:
    """A bucket that does not exist: its shards are missing (not a listing error)."""
    urls = [f"s3://no-such-bucket-sp/train-{i}.tar" for i in range(2)]
    assert fs.missing_files(urls, s3_server.storage_options) == urls


# -- the command prints one line --------------------------------------------------------


def run_cli(
    *args: str, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed ``shardpipes ARGS`` in a subprocess."""
    command = [str(Path(sys.executable).with_name("shardpipes")), *args]
    with patched_env(env or {}):
        return subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=120, env=dict(os.environ)
        )


@pytest.mark.slow
class TestOneLineErrors:
    def assert_one_line(self, result: subprocess.CompletedProcess[str], start: str) -> None:
        assert (result.returncode, result.stdout) == (1, "")
        lines = result.stderr.splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"shardpipes: error: {start}"), lines

    def test_s3_without_credentials(self, s3_server: SeaweedS3, s3_bucket: str) -> None:
        """S3 with no credentials: one line naming the URL, no traceback."""
        url = f"s3://{s3_bucket}/train-000000.tar"
        no_keys = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}
        result = run_cli("inspect", url, env=no_keys)
        self.assert_one_line(result, f"{url}: access denied (check the credentials")

    def test_unreachable_endpoint(self, refused: str) -> None:
        """A refused endpoint: one line naming the URL, no retry warnings, no traceback."""
        url, _ = shard_and_options("s3", refused)
        result = run_cli(
            "inspect", url, "-o", f"key={TEST_KEY}", "-o", f"secret={TEST_SECRET}",
            "-o", f'client_kwargs={{"endpoint_url": "{refused}"}}',
        )  # fmt: skip
        self.assert_one_line(result, f"{url}: listing failed after 5 retries")

    def test_unreachable_endpoint_debug(self, refused: str) -> None:
        """With --debug: a log line per retry and the traceback, then the same error line."""
        url, _ = shard_and_options("http", refused)
        result = run_cli("--debug", "inspect", url)
        lines = result.stderr.splitlines()
        assert sum("; retry " in line for line in lines) == 5
        assert "Traceback (most recent call last):" in lines
        assert lines[-1].startswith(f"shardpipes: error: {url}: looking it up failed after 5")

    def test_missing_shard(self, make_shards: Callable[..., Dataset]) -> None:
        """A missing shard among three: one line naming it, before reading."""
        data = make_shards(2, 3)
        pattern = data.urls[0].replace("000000", "{000000..000002}")
        result = run_cli("inspect", pattern)
        missing = data.urls[0].replace("000000", "000002")
        assert result.stderr.splitlines() == [
            f"shardpipes: error: {missing}: no such file (1 of 3 shards missing)"
        ]
