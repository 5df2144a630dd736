"""Real storage servers on loopback for the cloud tests: SeaweedFS (S3) and an aiohttp static server.

Every listener is bound to 127.0.0.1. Nothing here talks to the outside world: `aws_env`
sets fake credentials, turns IMDS and the AWS config files off and, given the server's
endpoint, points every AWS endpoint at it, so even ``fsspec.open("s3://…")`` with no options
stays on loopback.

s3fs instances: the bucket helpers (`make_bucket`, `upload`, `remove_bucket`) each use a
private `S3FileSystem` and close its session when done. A cached instance with a live
connection pool in the test process, inherited by forked DataLoader workers, stalled the
next call of the parent for ~16 s once the workers exited (their exit closes the inherited
session). The library under test makes its own instances (its options differ anyway).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

HOST = "127.0.0.1"
GRPC_OFFSET = 10000  # weed's gRPC port = HTTP port + 10000 unless given
PORT_RANGE = (20000, 55000)  # low enough that port + GRPC_OFFSET stays below 65536
TEST_KEY = "shardpipes-test"
TEST_SECRET = "shardpipes-secret"

# Cleared while the S3 fixtures run: each can send botocore to another host or to IMDS.
AWS_VARS_CLEARED = (
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL_S3",
    "FSSPEC_S3",
    "FSSPEC_S3_ENDPOINT_URL",
)


def port_is_free(port: int) -> bool:
    """Whether a TCP port can be bound on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int, *, seed: int | None = None) -> list[int]:
    """``count`` HTTP ports in `PORT_RANGE` whose port and port + 10000 are all free."""
    rng = random.Random(seed)
    chosen: list[int] = []
    for _ in range(1000):
        port = rng.randrange(*PORT_RANGE)
        taken = {p for c in chosen for p in (c, c + GRPC_OFFSET)}
        wanted = (port, port + GRPC_OFFSET)
        if taken.isdisjoint(wanted) and all(port_is_free(p) for p in wanted):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    msg = f"no {count} free port pairs in {PORT_RANGE} (got {len(chosen)})"
    raise RuntimeError(msg)


def wait_for_port(port: int, *, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    """Poll until 127.0.0.1:port accepts a connection; fail if ``proc`` exits or time runs out."""
    while True:
        if proc.poll() is not None:
            msg = f"server exited with code {proc.returncode} before port {port} opened"
            raise RuntimeError(msg)
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return
        if time.monotonic() > deadline:
            msg = f"port {port} did not open in time"
            raise TimeoutError(msg)
        time.sleep(0.05)


@contextlib.contextmanager
def aws_env(
    key: str = TEST_KEY, secret: str = TEST_SECRET, *, endpoint_url: str | None = None
) -> Iterator[None]:
    """Set fake AWS credentials and cut every route to real AWS; restore the variables after.

    Args:
        key: the access key to set.
        secret: the secret key to set.
        endpoint_url: if given, set as ``AWS_ENDPOINT_URL`` (every AWS service goes there).
    """
    wanted = {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }
    if endpoint_url is not None:
        wanted["AWS_ENDPOINT_URL"] = endpoint_url
    cleared: dict[str, str | None] = dict.fromkeys(AWS_VARS_CLEARED)
    with patched_env({**cleared, **wanted}):
        yield


@contextlib.contextmanager
def patched_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for ``None``, remove) environment variables; restore them all on exit."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


class Service:
    """A server that starts when entered and stops when left."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: ServiceT) -> ServiceT:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


ServiceT = TypeVar("ServiceT", bound=Service)


class BucketStore(Service):
    """A storage server with buckets: make, fill and remove them through `admin()`."""

    scheme = ""

    def admin(self) -> contextlib.AbstractContextManager[Any]:
        """A private fsspec filesystem for this server, closed on exit."""
        raise NotImplementedError

    def make_bucket(self, files: Iterable[Path] = (), *, prefix: str = "sp") -> str:
        """Create a bucket with a unique name, upload ``files`` to its root, return its name."""
        bucket = unique_bucket_name(prefix)
        with self.admin() as fs:
            fs.mkdir(bucket)
        self.upload(bucket, files)
        return bucket

    def upload(self, bucket: str, files: Iterable[Path]) -> list[str]:
        """Upload local files to ``bucket``'s root; return their URLs."""
        files = list(files)
        with self.admin() as fs:
            for path in files:
                fs.put_file(str(path), f"{bucket}/{path.name}")
        return self.urls(bucket, [path.name for path in files])

    @contextlib.contextmanager
    def bucket_with(self, files: Iterable[Path | str]) -> Iterator[str]:
        """A fresh bucket holding ``files`` for the ``with`` block, removed after it."""
        bucket = self.make_bucket([Path(f) for f in files])
        try:
            yield bucket
        finally:
            self.remove_bucket(bucket)

    def remove_bucket(self, bucket: str) -> None:
        """Delete a bucket and everything in it."""
        with self.admin() as fs:
            fs.rm(bucket, recursive=True)

    def urls(self, bucket: str, names: Iterable[str]) -> list[str]:
        """``scheme://bucket/name`` for each name."""
        return [f"{self.scheme}://{bucket}/{name}" for name in names]


def unique_bucket_name(prefix: str = "sp") -> str:
    """A fresh valid bucket name (lowercase, 3–63 characters)."""
    return f"{prefix}-{uuid.uuid4().hex}"[:63]


def stop_process(proc: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """Terminate ``proc``, wait up to ``grace`` seconds, then kill it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class SeaweedS3(BucketStore):
    """A ``weed mini`` subprocess serving S3 on 127.0.0.1, credentials checked.

    Args:
        workdir: an empty folder for data, the identities file, unix sockets and the log.
        key: access key of the one admin identity.
        secret: its secret key.
        weed: path of the ``weed`` binary (default: the one next to this Python).
        ready_timeout: seconds to wait for a first successful bucket creation.

    Example::

        with SeaweedS3(tmp) as s3:
            bucket = s3.make_bucket([Path("train-000.tar")])
    """

    scheme = "s3"

    services = ("master", "volume", "filer", "s3", "admin")

    def __init__(
        self,
        workdir: Path,
        *,
        key: str = TEST_KEY,
        secret: str = TEST_SECRET,
        weed: str | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.workdir = workdir
        self.key = key
        self.secret = secret
        self.weed = weed or str(Path(sys.executable).with_name("weed"))
        self.ready_timeout = ready_timeout
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds = float("nan")

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint, ``http://127.0.0.1:PORT``."""
        return f"http://{HOST}:{self.ports['s3']}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for s3fs (no region: see the region trap in the notes)."""
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }

    def command(self) -> list[str]:
        """The full ``weed mini`` command line for the chosen ports."""
        args = [
            self.weed,
            "mini",
            f"-dir={self.workdir / 'data'}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-volume.max=1000",  # default: free disk / 1 GiB; each bucket takes a volume
            "-master.volumeSizeLimitMB=64",
            "-volume.preStopSeconds=0",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.workdir / 's3.json'}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]
        for name, port in self.ports.items():
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + GRPC_OFFSET}"]
        return args

    def write_identities(self) -> Path:
        """Write the S3 identities file that makes weed check credentials."""
        creds = {"accessKey": self.key, "secretKey": self.secret}
        actions = ["Admin", "Read", "Write", "List", "Tagging"]
        config = {"identities": [{"name": "admin", "credentials": [creds], "actions": actions}]}
        path = self.workdir / "s3.json"
        path.write_text(json.dumps(config))
        return path

    def start(self) -> None:
        """Start weed and wait until a bucket can be created."""
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        self.write_identities()
        self.ports = dict(zip(self.services, free_port_pairs(len(self.services)), strict=True))
        began = time.monotonic()
        with (self.workdir / "weed.log").open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            self._wait_ready(began + self.ready_timeout)
        except Exception as exc:
            self.stop()
            log_tail = (self.workdir / "weed.log").read_text(errors="replace")[-2000:]
            msg = f"weed mini did not become ready: {exc!r}; log tail:\n{log_tail}"
            raise RuntimeError(msg) from exc
        self.startup_seconds = time.monotonic() - began

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        for port in self.ports.values():  # every listener, so none is half-started
            for listener in (port, port + GRPC_OFFSET):
                wait_for_port(listener, deadline=deadline, proc=self.proc)
        probe = unique_bucket_name("ready")
        while (error := self._probe(probe)) is not None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise error
            time.sleep(0.1)

    def _probe(self, bucket: str) -> OSError | None:
        """Create and delete ``bucket``; return the error if that failed."""
        with self.admin() as fs:
            try:
                fs.mkdir(bucket)
            except OSError as exc:
                return exc
            fs.rm(bucket, recursive=True)
        return None

    def stop(self) -> None:
        """Stop weed (SIGTERM, then SIGKILL) and remove the gRPC sockets it leaves in /tmp."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        for name, port in self.ports.items():
            # weed hard-codes these paths; it removes them itself only on a clean exit
            Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)

    def filesystem(self, **overrides: Any) -> Any:
        """An `s3fs.S3FileSystem` for this server (the cached instance unless options differ)."""
        import s3fs  # type: ignore[import-untyped]

        return s3fs.S3FileSystem(**{**self.storage_options, **overrides})

    @contextlib.contextmanager
    def admin(self) -> Iterator[Any]:
        """A private `S3FileSystem` whose session is closed on exit (see the module docstring)."""
        fs = self.filesystem(skip_instance_cache=True)
        try:
            yield fs
        finally:
            creator = getattr(fs, "_s3creator", None)
            if creator is not None:
                fs.close_session(fs.loop, creator)


_SERVE_STATIC = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/", sys.argv[2], show_index=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


class StaticHTTP(Service):
    """An aiohttp static file server (Range support, HTML index) on 127.0.0.1.

    It runs in a process of its own, not in a thread of the test process: forked DataLoader
    workers would inherit a server event loop (and its epoll set), and a run on a fresh
    clone once hung on a request that neither side saw arrive.

    Args:
        root: the folder to serve.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://{HOST}:{self.port}"

    def url(self, relpath: str) -> str:
        """The URL of a path under `root`."""
        return f"{self.base_url}/{relpath.lstrip('/')}"

    def put(self, relpath: str, data: bytes) -> str:
        """Write ``data`` to ``root/relpath`` and return its URL."""
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.url(relpath)

    def add(self, files: Mapping[str, Path]) -> list[str]:
        """Copy local files to ``root/<relpath>``; return their URLs."""
        urls = []
        for relpath, src in files.items():
            dest = self.root / relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            urls.append(self.url(relpath))
        return urls

    def new_folder(self, prefix: str = "t") -> str:
        """Create an empty uniquely named folder under `root`; return its relative name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        (self.root / name).mkdir()
        return name

    def start(self, timeout: float = 60.0) -> None:
        """Start the server process; return once it listens."""
        self.port = free_port_pairs(1)[0]
        command = [sys.executable, "-c", _SERVE_STATIC, str(self.port), str(self.root)]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        wait_for_port(self.port, deadline=time.monotonic() + timeout, proc=self._proc)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server process."""
        if self._proc is not None:
            stop_process(self._proc, grace=timeout)
            self._proc = None
