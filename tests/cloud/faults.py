"""Fault injection for cloud tests: a TCP reset proxy and an in-process moto S3 with HTTP faults.

`ResetProxy` sends TCP resets (RST) in front of any server: right after accept, or after a
number of response bytes. `FaultyMoto` serves moto's S3 on loopback behind a WSGI wrapper that
answers object GETs with 503 SlowDown, 500 InternalError or a truncated body, and logs every
request so tests can count GETs. Both run in background threads, are context managers, and take
new fault plans while running. See /work/shared/notes/cloud-test-servers.md, section 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

Fault = Literal["503", "500", "400", "truncate"]

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
}
# unset while a FaultyMoto runs: a profile missing from /dev/null would make botocore fail
AWS_ENV_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN")


def s3_storage_options(endpoint_url: str) -> dict[str, Any]:
    """s3fs storage options for a loopback endpoint (no region: see the region trap)."""
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint_url}}


class Schedule:
    """Which events get a fault: the next ``times`` ones, or every ``every``-th one.

    With neither given, every event does. Not thread-safe: callers hold their own lock.
    """

    def __init__(self, *, every: int | None = None, times: int | None = None) -> None:
        if every is not None and times is not None:
            msg = f"give every or times, not both (got every={every}, times={times})"
            raise ValueError(msg)
        for name, value in (("every", every), ("times", times)):
            if value is not None and (not isinstance(value, int) or value < 1):
                msg = f"{name} must be a positive integer (got {value!r})"
                raise ValueError(msg)
        self.every = 1 if every is None and times is None else every
        self.times = times
        self.seen = 0

    def take(self) -> bool:
        """Count one event; True when it gets the fault."""
        self.seen += 1
        if self.times is not None:
            hit = self.times > 0
            self.times -= hit
            return hit
        return self.every is not None and self.seen % self.every == 0


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of a `ResetProxy`'s counters."""

    accepted: int = 0
    resets_on_accept: int = 0
    cuts: int = 0
    bytes_up: int = 0  # client -> upstream
    bytes_down: int = 0  # upstream -> client

    @property
    def bytes_forwarded(self) -> int:
        """Bytes forwarded in both directions."""
        return self.bytes_up + self.bytes_down


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a connection with a TCP RST: SO_LINGER(1, 0), then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ResetProxy:
    """A TCP proxy on a free loopback port that resets chosen connections.

    Args:
        upstream_host: host of the server to forward to.
        upstream_port: its port.

    `reset_on_accept` counts accepted connections and resets the ones it picks at once,
    before anything is forwarded; `cut_after` counts the forwarded connections whose
    response bytes reach ``nbytes`` (so a connection that carries less, such as an idle
    one of a client's pool, is not counted) and resets the ones it picks right there,
    after ``nbytes`` have reached the client. Both plans may be set; a reset on accept
    wins. Counters are in `stats`.

    Example:
        >>> with ResetProxy("127.0.0.1", 9) as proxy:
        ...     proxy.cut_after(65536, times=1)
        ...     proxy.url.startswith("http://127.0.0.1:"), proxy.stats.accepted
        (True, 0)
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = "127.0.0.1"
        self.port = 0
        self._lock = threading.Lock()
        self._reset_plan: Schedule | None = None
        self._cut_plan: tuple[int, Schedule] | None = None
        self._counts = dict.fromkeys(ProxyStats.__dataclass_fields__, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.port}"

    @property
    def stats(self) -> ProxyStats:
        """The counters so far."""
        with self._lock:
            return ProxyStats(**self._counts)

    def reset_on_accept(self, *, every: int | None = None, times: int | None = None) -> None:
        """Reset the next ``times`` connections, or every ``every``-th one, or all of them."""
        with self._lock:
            self._reset_plan = Schedule(every=every, times=times)

    def cut_after(self, nbytes: int, *, every: int | None = None, times: int | None = None) -> None:
        """Reset connections once ``nbytes`` response bytes passed (see the class docstring).

        Of the connections whose responses get that far: the next ``times``, every
        ``every``-th, or all of them.
        """
        if not isinstance(nbytes, int) or nbytes < 0:
            msg = f"nbytes must be a non-negative integer (got {nbytes!r})"
            raise ValueError(msg)
        with self._lock:
            self._cut_plan = (nbytes, Schedule(every=every, times=times))

    def clear(self) -> None:
        """Forward everything from now on."""
        with self._lock:
            self._reset_plan = self._cut_plan = None

    def start(self) -> ResetProxy:
        """Listen and serve in a background thread; returns self."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="ResetProxy", daemon=True
        )
        self._thread.start()
        ready.wait()
        if not self.port:
            self._thread.join()
            msg = "ResetProxy failed to start"
            raise RuntimeError(msg)
        return self

    def close(self) -> None:
        """Close open connections, stop listening and join the thread."""
        if self._thread is None or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> ResetProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        try:
            loop.run_until_complete(self._serve(ready))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            ready.set()
            loop.close()

    async def _serve(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    def _plan(self) -> tuple[bool, int | None]:
        """Count an accepted connection; (reset it now?, cut after how many bytes)."""
        with self._lock:
            self._counts["accepted"] += 1
            if self._reset_plan is not None and self._reset_plan.take():
                self._counts["resets_on_accept"] += 1
                return True, None
            if self._cut_plan is not None:
                return False, self._cut_plan[0]  # counted if the response gets that far
            return False, None

    def _take_cut(self) -> bool:
        """A connection's response reached the cut: whether the cut plan picks it."""
        with self._lock:
            return self._cut_plan is not None and self._cut_plan[1].take()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        up_writer: asyncio.StreamWriter | None = None
        try:
            reset, cut = self._plan()
            if reset:
                _reset(writer)
                return
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await self._relay(reader, writer, up_reader, up_writer, cut)
        except OSError:
            pass
        finally:
            self._tasks.discard(task)
            for w in (writer, up_writer):
                if w is not None:
                    w.close()
                    with contextlib.suppress(OSError):
                        await w.wait_closed()

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        cut: int | None,
    ) -> None:
        up = asyncio.ensure_future(self._pump(reader, up_writer, "bytes_up"))
        down = asyncio.ensure_future(self._pump(up_reader, writer, "bytes_down", cut=cut))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if not down.done() and up.exception() is None:
                await down  # the client half-closed: let the response finish
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        counter: str,
        *,
        cut: int | None = None,
    ) -> None:
        sent = 0
        if cut is not None:
            dst.transport.set_write_buffer_limits(high=0)  # drain() then means "sent"
        while data := await src.read(65536):
            if cut is not None and sent + len(data) > cut and self._take_cut():
                head = data[: cut - sent]
                self._count(counter, len(head))
                dst.write(head)
                await dst.drain()
                self._count("cuts")
                _reset(dst)
                return
            if cut is not None and sent + len(data) > cut:
                cut = None  # counted and not picked: this connection goes on whole
            self._count(counter, len(data))
            dst.write(data)
            await dst.drain()
            sent += len(data)
        if dst.can_write_eof():
            dst.write_eof()


@dataclass(frozen=True)
class LoggedRequest:
    """One request seen by `FaultyMoto`."""

    method: str
    path: str
    query: str
    range: str | None
    fault: Fault | None = None

    @property
    def is_object_get(self) -> bool:
        """A GET on an object key (``/bucket/key``), the only requests faults apply to."""
        bucket, _, key = self.path.lstrip("/").partition("/")
        return self.method == "GET" and bucket != "moto-api" and bool(key)


_ERRORS = {
    "503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
    "500": ("500 Internal Server Error", "InternalError", "We encountered an internal error."),
    # what AWS answers a URL signed for another region than its bucket's
    "400": ("400 Bad Request", "AuthorizationQueryParametersError", "Wrong region."),
}


def _error_body(code: str, message: str, path: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{path}</Resource><RequestId>faultymoto</RequestId></Error>"
    ).encode()


class _QuietHandler(MotoRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


StartResponse = Callable[..., Any]


class FaultyMoto:
    """moto's S3, in-process on a free loopback port, with HTTP faults on object GETs.

    Faults (one plan at a time, see `inject`): ``"503"`` (SlowDown XML error), ``"500"``
    (InternalError), ``"400"`` (to presigned GETs only: signed for the wrong region), ``"truncate"`` (the real status and full ``Content-Length``, then only
    ``truncate_at`` body bytes and the connection closes). Every request is logged in
    `requests`. On start it resets moto's process-global backends and sets the `AWS_ENV`
    variables (restored on close), so nothing can reach AWS. werkzeug closes every connection
    after one response, so each request is one TCP connection (useful behind `ResetProxy`).
    """

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.faults_injected = 0
        self._lock = threading.Lock()
        self._plan: tuple[Fault, Schedule, int] | None = None
        self._log: list[LoggedRequest] = []
        self._app = DomainDispatcherApplication(create_backend_app)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._saved_env: dict[str, str | None] = {}

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{self.host}:{self.port}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """s3fs storage options for this server."""
        return s3_storage_options(self.endpoint_url)

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request so far, oldest first (a copy)."""
        with self._lock:
            return list(self._log)

    def gets(self, path: str | None = None) -> list[LoggedRequest]:
        """GETs on object keys, optionally only those on ``path`` (``bucket/key``)."""
        return [
            r
            for r in self.requests
            if r.is_object_get and (path is None or r.path.strip("/") == path.strip("/"))
        ]

    def inject(
        self,
        fault: Fault,
        *,
        every: int | None = None,
        times: int | None = None,
        truncate_at: int = 65536,
    ) -> None:
        """Fault the next ``times`` object GETs, or every ``every``-th one, or all of them."""
        if fault not in ("503", "500", "400", "truncate"):
            msg = f"fault must be '503', '500', '400' or 'truncate' (got {fault!r})"
            raise ValueError(msg)
        schedule = Schedule(every=every, times=times)
        with self._lock:
            self._plan = (fault, schedule, truncate_at)

    def clear(self, *, log: bool = False) -> None:
        """Stop injecting faults; with ``log=True`` also forget the log and `faults_injected`."""
        with self._lock:
            self._plan = None
            if log:
                self._log.clear()
                self.faults_injected = 0

    def start(self) -> FaultyMoto:
        """Set the environment, serve in a background thread and reset moto; returns self."""
        self._saved_env = {k: os.environ.get(k) for k in (*AWS_ENV, *AWS_ENV_UNSET)}
        for k in AWS_ENV_UNSET:
            os.environ.pop(k, None)
        os.environ.update(AWS_ENV)
        self._server = make_server(
            self.host, 0, self._wsgi, threaded=True, request_handler=_QuietHandler
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="FaultyMoto", daemon=True
        )
        self._thread.start()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("POST", "/moto-api/reset")
            status = conn.getresponse().status
        finally:
            conn.close()
        if status != 200:
            self.close()
            msg = f"POST /moto-api/reset answered {status}"
            raise RuntimeError(msg)
        return self

    def close(self) -> None:
        """Stop serving, join the thread and restore the environment."""
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
        self._server = self._thread = None
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def __enter__(self) -> FaultyMoto:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wsgi(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request = LoggedRequest(
            environ["REQUEST_METHOD"],
            environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            environ.get("HTTP_RANGE"),
        )
        plan = None
        with self._lock:
            if (
                request.is_object_get
                and self._plan is not None
                and (self._plan[0] != "400" or "X-Amz-Signature=" in request.query)
                and self._plan[1].take()
            ):
                plan = (self._plan[0], self._plan[2])
                self.faults_injected += 1
            self._log.append(request if plan is None else replace(request, fault=plan[0]))
        if plan is None:
            return self._app(environ, _without_server_header(start_response))  # type: ignore[no-any-return]
        fault, truncate_at = plan
        if fault == "truncate":
            return self._truncated(environ, start_response, truncate_at)
        status, code, message = _ERRORS[fault]
        body = _error_body(code, message, request.path)
        start_response(
            status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
        )
        return [body]

    def _truncated(
        self, environ: dict[str, Any], start_response: StartResponse, nbytes: int
    ) -> Iterator[bytes]:
        captured: list[Any] = []
        app_iter = self._app(
            environ, lambda status, headers, *_: captured.extend((status, headers))
        )
        try:
            body = b"".join(app_iter)
        finally:
            if hasattr(app_iter, "close"):
                app_iter.close()
        status, headers = captured
        headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "server")]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        # werkzeug sends "Connection: close" and closes after the app returns, so the client
        # sees EOF after nbytes of a longer Content-Length
        yield body[:nbytes]


def _without_server_header(start_response: StartResponse) -> StartResponse:
    """Drop moto's ``server`` header: werkzeug adds its own.

    aiohttp's strict parser (pure Python, as under ``python -X dev``) rejects two of them.
    """

    def wrapped(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
        return start_response(status, [h for h in headers if h[0].lower() != "server"], *exc_info)

    return wrapped
