"""Ranged reads over HTTP(S) with the standard library: kept-alive connections, per process.

fsspec's HTTP backend runs aiohttp on an event loop thread: importing aiohttp costs 0.2 s
before a worker's first request, and each block read crosses to the loop thread and back
(measured on loopback: 618 MB per CPU-second against 924 for ``http.client``). shardpipes
reads plain ``http(s)://`` shards — explicit URLs, with no storage options but
``headers`` — with this client instead; globbing an HTTP listing, chained URLs and any
other option go through fsspec (:mod:`shardpipes.fs` decides).

What it does: ``GET`` with a ``Range`` header and ``HEAD``; redirects are followed (a
bucket's presigned URL, a CDN); connections are kept alive and shared by the threads of
a process (a forked child opens its own); a connection that the server closed while idle
is replaced at once, not counted as a failure. Failures are the exceptions
:mod:`shardpipes.fs.retry` classifies: connection errors and timeouts (transient), and
:class:`HttpStatusError` carrying the ``status`` (404 a ``FileNotFoundError``, 401/403 a
``PermissionError``, 5xx/408/429 transient).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import re
import socket
import ssl
import threading
import weakref
from collections.abc import Mapping
from urllib.parse import quote, urljoin, urlsplit

__all__ = ["HttpClient", "HttpStatusError", "RangeIgnoredError"]

Origin = tuple[str, str]  # scheme, host[:port]
REDIRECTS = 10  # followed at most, per request
_REDIRECT = frozenset({301, 302, 303, 307, 308})
_SAFE = "/:@!$&'()*+,;=%~?#[]"  # left as they are in a URL's path and query


class HttpStatusError(OSError):
    """An HTTP answer that is not a success; ``status`` is its code."""

    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"HTTP {status} {reason}".rstrip())
        self.status, self.url = status, url


class _NotFoundError(HttpStatusError, FileNotFoundError):
    pass


class _RefusedError(HttpStatusError, PermissionError):
    pass


class RangeIgnoredError(OSError):
    """The server answered a ranged ``GET`` with more than the range (the whole file)."""


def _failed(response: http.client.HTTPResponse, url: str) -> HttpStatusError:
    """The error for a failed answer, with the storage's error code when its body has one.

    S3 and its kin answer ``<Error><Code>SlowDown</Code>…``: the code says what failed
    (``AccessDenied``, ``NoSuchBucket``, ``RequestTimeTooSkewed``…).
    """
    said = ""
    if response.length is not None and response.length <= 2**16:
        with contextlib.suppress(OSError, http.client.HTTPException):
            body = response.read().decode("utf-8", "replace")
            code = re.search(r"<Code>([^<]{1,100})</Code>", body)
            said = code[1] if code else ""
    reason = f"{response.reason} ({said})" if said else response.reason
    return _status_error(response.status, reason, url)


def _status_error(status: int, reason: str, url: str) -> HttpStatusError:
    kind = (
        _NotFoundError
        if status in (404, 410)
        else _RefusedError
        if status in (401, 403)
        else HttpStatusError
    )
    return kind(status, reason, url)


class HttpClient:
    """Requests with fixed extra ``headers`` and timeouts; thread-safe, fork-safe.

    Args:
        headers: Sent with every request (e.g. an ``Authorization``).
        connect_timeout: Seconds to wait for a connection.
        read_timeout: Seconds to wait for the next bytes of an answer.
    """

    def __init__(
        self, headers: Mapping[str, str], connect_timeout: float, read_timeout: float
    ) -> None:
        self.headers = {"User-Agent": "shardpipes", **headers}
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._lock = threading.Lock()
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._pid = os.getpid()
        _CLIENTS.add(self)

    def get_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (fewer at the end of the file, none past it).

        Raises:
            RangeIgnoredError: The server sent a whole file larger than the range.
            HttpStatusError: Any other answer than 200 (a whole file that fits), 206, 416.
            OSError: As the connection fails.
        """
        headers = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
        origin, conn, response = self._request("GET", url, headers)
        try:
            status = response.status
            if status == 200 and (start != 0 or response.length is None or response.length > end):
                raise RangeIgnoredError(url)  # the whole file, larger than asked: unread
            if status not in (200, 206, 416):
                raise _failed(response, url)
            data = response.read()
            if status == 416:
                data = b""
        except BaseException:
            _discard(conn, response)
            raise
        self._done(origin, conn, response)
        return data

    def size(self, url: str) -> int | None:
        """The file's size; ``None`` when the server does not say it.

        Asked with a ``GET`` of its first byte (the total is in the answer's
        ``Content-Range``), not a ``HEAD``: a presigned URL is signed for ``GET`` only.

        Raises:
            HttpStatusError: A failed answer (404: the file does not exist).
            OSError: As the connection fails.
        """
        origin, conn, response = self._request("GET", url, {"Range": "bytes=0-0"})
        status, total = response.status, None
        if status == 206:
            total = (response.getheader("Content-Range") or "").rpartition("/")[2]
        elif status == 200:
            total = response.getheader("Content-Length")
        elif status == 416:
            total = "0"
        if status >= 300 and status != 416:
            error = _failed(response, url)
            _discard(conn, response)
            raise error
        if status != 200 and response.length is not None and response.length < 2**16:
            response.read()
            self._done(origin, conn, response)
        else:
            _discard(conn, response)  # a whole file is not read
        return int(total) if total and total.isdigit() else None

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- connections --------------------------------------------------------------------

    def _request(
        self, method: str, url: str, headers: Mapping[str, str]
    ) -> tuple[Origin, http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send a request, following redirects; where to, the connection, the answer's head."""
        for _ in range(REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                msg = f"not an http(s) URL: {url}"
                raise ValueError(msg)
            target = quote(parts.path or "/", safe=_SAFE)
            if parts.query:
                target += "?" + quote(parts.query, safe=_SAFE)
            sent = {**self.headers, **headers}
            origin = (parts.scheme, parts.netloc)
            conn, response = self._send(origin, method, target, sent)
            location = response.getheader("Location")
            if response.status not in _REDIRECT or not location:
                return origin, conn, response
            response.read()
            self._done(origin, conn, response)
            url = urljoin(url, location)
            method = "GET" if response.status == 303 and method != "HEAD" else method
        raise _status_error(310, f"more than {REDIRECTS} redirects", url)

    def _send(
        self, origin: Origin, method: str, target: str, headers: Mapping[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn, reused = self._take(origin)
        while True:
            try:
                conn.request(method, target, headers=dict(headers))
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                if not reused:
                    raise
            except BaseException:
                conn.close()
                raise
            # the server closed the kept-alive connection while it was idle: a new one
            conn, reused = self._connect(origin), False

    def _take(self, origin: Origin) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours to use
                inherited, self._pid, self._idle = self._idle, os.getpid(), {}
                for conn in (c for conns in inherited.values() for c in conns):
                    conn.close()  # this process's copy only: the parent's stays open
            idle = self._idle.get(origin)
            if idle:
                return idle.pop(), True
        return self._connect(origin), False

    def _connect(self, origin: Origin) -> http.client.HTTPConnection:
        scheme, netloc = origin
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(netloc, timeout=self.connect_timeout, context=_tls())
        else:
            conn = http.client.HTTPConnection(netloc, timeout=self.connect_timeout)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self.read_timeout)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _done(
        self, origin: Origin, conn: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        """Keep ``conn`` for the next request, if its answer was read and it stays open."""
        if not response.will_close and response.isclosed():
            with self._lock:
                if self._pid == os.getpid():
                    self._idle.setdefault(origin, []).append(conn)
                    return
        _discard(conn, response)


_CLIENTS: weakref.WeakSet[HttpClient] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Close idle connections at exit (not left to the garbage collector's warnings)."""
    for client in list(_CLIENTS):
        client.close()


def _discard(conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
    """Close a connection and its answer (which holds the socket once it will close)."""
    response.close()
    conn.close()


_context: list[ssl.SSLContext] = []


def _tls() -> ssl.SSLContext:
    """The TLS context of every HTTPS connection: the system's certificates (made once)."""
    if not _context:
        _context.append(ssl.create_default_context())
    return _context[0]
