"""shardpipes.fs.http_client.HttpClient driven directly, against http.server on 127.0.0.1.

What mutation testing found that the end-to-end tests (tests/cloud/test_http_client.py)
leave open: the exact request (range, headers, quoting), each kind of answer (a whole file,
416, errors and the storage's error code), the redirect limit, which answers leave a
connection to reuse, a forked child's own connections, the read timeout, and HTTPS.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import ipaddress
import os
import re
import socket
import ssl
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import pytest

from shardpipes.fs import http_client as _http
from shardpipes.fs.http_client import HttpClient, HttpStatusError, RangeIgnoredError

DATA = bytes(range(256)) * 40  # 10240 bytes

pytestmark = pytest.mark.timeout(60)  # a request that waits forever fails, not hangs the run


@dataclass
class Site:
    """What the server serves and how, and what it saw."""

    files: dict[str, bytes] = field(default_factory=lambda: {"/f.bin": DATA})
    routes: dict[str, Callable[[Handler], None]] = field(default_factory=dict)
    ignore_ranges: bool = False  # a whole file (200) for a ranged GET
    one_request: bool = False  # every connection closed after one answer, unannounced
    drop: bool = False  # every request's connection closed with no answer
    connections: int = 0
    requests: list[tuple[str, Message]] = field(default_factory=list)  # (target, headers)
    release: threading.Event = field(default_factory=threading.Event)  # for answers held back


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    site: Site

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.site.connections += 1

    def do_GET(self) -> None:
        site = self.site
        site.requests.append((self.path, self.headers))
        if site.drop:
            self.close_connection = True
            return
        route = site.routes.get(self.path.partition("?")[0])
        if route is not None:
            route(self)
            return
        data = site.files.get(self.path)
        if data is None:
            self.answer(404, b"<Error><Code>NoSuchKey</Code></Error>")
            return
        found = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if found is None or site.ignore_ranges:
            self.answer(200, data)
            return
        start, end = int(found[1]), min(int(found[2]) + 1, len(data))
        if start >= len(data):
            self.answer(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            return
        self.answer(206, data[start:end], {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"})

    def answer(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
    ) -> None:
        self.send_response(status, reason)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.site.one_request:
            self.close_connection = True  # without a Connection: close header


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that closed mid-answer (as the tests make it do)


@contextlib.contextmanager
def serve(site: Site, tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 within the block: its base URL."""
    handler = type("SiteHandler", (Handler,), {"site": site})
    with Server(("127.0.0.1", 0), handler) as httpd:
        if tls is not None:
            httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
        thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        scheme = "https" if tls is not None else "http"
        try:
            yield f"{scheme}://127.0.0.1:{httpd.server_address[1]}"
        finally:
            site.release.set()
            httpd.shutdown()


@pytest.fixture
def site() -> Iterator[tuple[Site, str]]:
    """A threaded HTTP/1.1 server on loopback: (what it serves, its base URL)."""
    s = Site()
    with serve(s) as base:
        yield s, base


@pytest.fixture
def client() -> Iterator[HttpClient]:
    made = HttpClient({}, 10.0, 10.0)
    yield made
    made.close()


# -- what is asked, what comes back ----------------------------------------------------------


def test_a_range_is_asked_with_the_clients_headers(site: tuple[Site, str]) -> None:
    s, base = site
    client = HttpClient({"Authorization": "Bearer t"}, 10.0, 10.0)
    assert client.get_range(f"{base}/f.bin", 10, 20) == DATA[10:20]
    target, headers = s.requests[-1]
    assert target == "/f.bin"
    assert headers.get_all("Range") == ["bytes=10-19"]
    assert [v.lower() for v in headers.get_all("Accept-Encoding", [])] == ["identity"]
    assert headers.get_all("Authorization") == ["Bearer t"]
    assert headers.get_all("User-Agent") == ["shardpipes"]
    client.close()


def test_the_clients_headers_win_over_the_default_user_agent(site: tuple[Site, str]) -> None:
    s, base = site
    client = HttpClient({"User-Agent": "mine/1"}, 10.0, 10.0)
    assert client.get_range(f"{base}/f.bin", 0, 4) == DATA[:4]
    assert s.requests[-1][1].get_all("User-Agent") == ["mine/1"]
    client.close()


def test_the_end_of_the_file(site: tuple[Site, str], client: HttpClient) -> None:
    """Fewer bytes at the end of the file; none from its end on (the server's 416)."""
    _, base = site
    n = len(DATA)
    assert client.get_range(f"{base}/f.bin", n - 5, n + 100) == DATA[-5:]
    assert client.get_range(f"{base}/f.bin", n, n + 10) == b""
    assert client.get_range(f"{base}/f.bin", n + 100, n + 200) == b""


def test_a_whole_file_answer_is_taken_only_when_it_is_the_range(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """A server that ignores ranges: its 200 is the data when it starts at 0 and fits."""
    s, base = site
    s.ignore_ranges = True
    n = len(DATA)
    assert client.get_range(f"{base}/f.bin", 0, n) == DATA  # exactly the range
    assert client.get_range(f"{base}/f.bin", 0, n + 50) == DATA
    with pytest.raises(RangeIgnoredError):
        client.get_range(f"{base}/f.bin", 0, n - 1)  # more than asked
    with pytest.raises(RangeIgnoredError):
        client.get_range(f"{base}/f.bin", 1, n + 50)  # not from where asked


def test_a_whole_file_of_unknown_length_is_refused(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """A 200 without Content-Length (ended by closing): it may be larger than the range."""
    s, base = site

    def unsized(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b"x" * 10)
        h.close_connection = True

    s.routes["/unsized"] = unsized
    with pytest.raises(RangeIgnoredError):
        client.get_range(f"{base}/unsized", 0, 100)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, FileNotFoundError),
        (410, FileNotFoundError),
        (401, PermissionError),
        (403, PermissionError),
        (500, HttpStatusError),
        (400, HttpStatusError),
        (300, HttpStatusError),  # not a redirect to follow
    ],
)
def test_failures_are_classified_by_status(
    site: tuple[Site, str], client: HttpClient, status: int, kind: type[Exception]
) -> None:
    s, base = site
    s.routes["/x"] = lambda h: h.answer(status, b"no")
    url = f"{base}/x"
    for call in (lambda: client.get_range(url, 0, 10), lambda: client.size(url)):
        with pytest.raises(HttpStatusError) as caught:
            call()
        assert isinstance(caught.value, kind)
        assert caught.value.status == status and caught.value.url == url
        other = {FileNotFoundError, PermissionError} - {kind}
        assert not isinstance(caught.value, tuple(other))
        assert str(caught.value) == f"HTTP {status} {http.HTTPStatus(status).phrase}"


def test_the_storages_error_code_is_quoted(site: tuple[Site, str], client: HttpClient) -> None:
    """S3's ``<Code>`` from a short error body; a long or unsized body is not read for it."""
    s, base = site
    slow = b"<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
    s.routes["/slow"] = lambda h: h.answer(503, slow)
    s.routes["/no-code"] = lambda h: h.answer(503, b"<Error>busy</Error>")
    edge = b"<Error><Code>Edge</Code></Error>"
    s.routes["/64k"] = lambda h: h.answer(503, edge + b" " * (2**16 - len(edge)))
    s.routes["/big"] = lambda h: h.answer(503, edge + b" " * (2**16 + 1 - len(edge)))
    s.routes["/long-code"] = lambda h: h.answer(503, b"<Code>" + b"C" * 101 + b"</Code>")

    def chunked(h: Handler) -> None:
        h.send_response(503)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(edge), edge))

    s.routes["/chunked"] = chunked
    said = {}
    for name in ("slow", "no-code", "64k", "big", "long-code", "chunked"):
        with pytest.raises(HttpStatusError) as caught:
            client.get_range(f"{base}/{name}", 0, 10)
        said[name] = str(caught.value)
    assert said == {
        "slow": "HTTP 503 Service Unavailable (SlowDown)",
        "no-code": "HTTP 503 Service Unavailable",
        "64k": "HTTP 503 Service Unavailable (Edge)",
        "big": "HTTP 503 Service Unavailable",
        "long-code": "HTTP 503 Service Unavailable",
        "chunked": "HTTP 503 Service Unavailable",
    }
    with pytest.raises(HttpStatusError, match=r"^HTTP 503 Service Unavailable \(SlowDown\)$"):
        client.size(f"{base}/slow")


def test_an_error_body_that_is_not_utf8_is_read(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site
    s.routes["/latin"] = lambda h: h.answer(
        403, b"<Error>\xe9\xff<Code>AccessDenied</Code></Error>"
    )
    with pytest.raises(PermissionError, match=r"^HTTP 403 Forbidden \(AccessDenied\)$"):
        client.get_range(f"{base}/latin", 0, 10)


def test_an_error_body_cut_short_still_gives_the_status(site: tuple[Site, str]) -> None:
    """The body of an error answer ends early, or stops coming: the status is what counts."""
    s, base = site

    def cut(h: Handler) -> None:
        h.send_response(404)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.write(b"<Error><Code>NoSuchKey</Code>")
        h.close_connection = True

    def stalled(h: Handler) -> None:
        h.send_response(404)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.write(b"<Error><Code>NoSuchKey</Code>")
        h.wfile.flush()
        h.site.release.wait(60)

    s.routes["/cut"], s.routes["/stalled"] = cut, stalled
    client = HttpClient({}, 10.0, 0.3)
    for name in ("cut", "stalled"):
        with pytest.raises(FileNotFoundError, match=r"^HTTP 404 Not Found$"):
            client.get_range(f"{base}/{name}", 0, 10)
        with pytest.raises(FileNotFoundError, match=r"^HTTP 404 Not Found$"):
            client.size(f"{base}/{name}")
    client.close()


def test_a_status_without_a_reason(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site
    s.routes["/odd"] = lambda h: h.answer(599, b"", reason="")
    with pytest.raises(HttpStatusError) as caught:
        client.get_range(f"{base}/odd", 0, 10)
    assert str(caught.value) == "HTTP 599"
    assert not isinstance(caught.value, FileNotFoundError | PermissionError)


def test_the_size(site: tuple[Site, str], client: HttpClient) -> None:
    """From Content-Range (206), Content-Length (200), 0 for a 416; None when unsaid."""
    s, base = site
    s.files["/empty"] = b""
    s.routes["/no-range-header"] = lambda h: h.answer(206, b"x")
    s.routes["/unknown-total"] = lambda h: h.answer(206, b"x", {"Content-Range": "bytes 0-0/*"})
    assert client.size(f"{base}/f.bin") == len(DATA)
    assert s.requests[-1][1].get_all("Range") == ["bytes=0-0"]
    assert client.size(f"{base}/empty") == 0
    assert client.size(f"{base}/no-range-header") is None
    assert client.size(f"{base}/unknown-total") is None
    s.ignore_ranges = True
    assert client.size(f"{base}/f.bin") == len(DATA)
    with pytest.raises(FileNotFoundError):
        client.size(f"{base}/gone")


# -- connections ------------------------------------------------------------------------------


def test_connections_are_kept_alive(site: tuple[Site, str], client: HttpClient) -> None:
    """Answers read to their end leave their connection for the next request."""
    s, base = site
    for start in range(0, 5000, 1000):
        assert client.get_range(f"{base}/f.bin", start, start + 1000) == DATA[start : start + 1000]
    assert client.size(f"{base}/f.bin") == len(DATA)  # 206: its byte is read
    assert client.get_range(f"{base}/f.bin", len(DATA), len(DATA) + 1) == b""  # 416
    assert client.size(f"{base}/f.bin") == len(DATA)
    assert len(s.requests) == 8 and s.connections == 1


def test_a_whole_file_answer_to_a_size_is_not_read(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """A 200 to the 1-byte GET: the connection is closed, not read to the end of the file."""
    s, base = site
    s.ignore_ranges = True
    assert client.size(f"{base}/f.bin") == len(DATA)
    assert client.size(f"{base}/f.bin") == len(DATA)
    assert s.connections == 2


def test_a_large_answer_to_a_size_is_not_read(site: tuple[Site, str], client: HttpClient) -> None:
    """A 206 whose body is 64 KiB or more is not read for the sake of its connection."""
    s, base = site
    body = b"x" * 2**16
    s.routes["/large"] = lambda h: h.answer(206, body, {"Content-Range": "bytes 0-65535/70000"})
    s.routes["/small"] = lambda h: h.answer(
        206, body[:-1], {"Content-Range": "bytes 0-65534/70000"}
    )
    assert client.size(f"{base}/small") == 70000
    assert client.size(f"{base}/small") == 70000
    assert s.connections == 1
    assert client.size(f"{base}/large") == 70000
    assert client.size(f"{base}/large") == 70000
    assert s.connections == 2  # the large answer's connection was closed, twice


def test_error_answers_do_not_leave_their_connection(
    site: tuple[Site, str], client: HttpClient
) -> None:
    s, base = site
    with pytest.raises(FileNotFoundError):
        client.get_range(f"{base}/gone", 0, 10)
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    assert s.connections == 2


def test_a_connection_the_server_closed_is_replaced(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """Closed while idle, without saying so: each request opens a new one, with no error."""
    s, base = site
    s.one_request = True
    for start in (0, 100, 200):
        assert client.get_range(f"{base}/f.bin", start, start + 10) == DATA[start : start + 10]
    assert s.connections == len(s.requests) == 3


def test_a_new_connection_that_fails_is_not_tried_again(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """Only a kept-alive connection is replaced; a new one's failure is the caller's to retry."""
    s, base = site
    s.drop = True
    with pytest.raises(ConnectionError):
        client.get_range(f"{base}/f.bin", 0, 10)
    assert s.connections == len(s.requests) == 1


def test_a_replaced_connection_that_fails_again_raises(
    site: tuple[Site, str], client: HttpClient
) -> None:
    s, base = site
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    s.drop = True
    with pytest.raises(ConnectionError):
        client.get_range(f"{base}/f.bin", 0, 10)
    assert s.connections == 2 and len(s.requests) == 3


def test_closing_the_client_closes_its_idle_connections(
    site: tuple[Site, str], client: HttpClient
) -> None:
    s, base = site
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    client.close()
    client.close()
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    assert s.connections == 2


def test_every_client_is_closed_at_exit(site: tuple[Site, str]) -> None:
    s, base = site
    clients = [HttpClient({}, 10.0, 10.0) for _ in range(2)]
    for client in clients:
        assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    assert s.connections == 2
    _http._close_all()  # what atexit runs
    for client in clients:
        assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
        client.close()
    assert s.connections == 4


def test_connections_are_per_origin(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site
    other = Site()
    with serve(other) as other_base:
        for _ in range(2):
            assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
            assert client.get_range(f"{other_base}/f.bin", 5, 10) == DATA[5:10]
    assert s.connections == other.connections == 1
    assert len(s.requests) == len(other.requests) == 2


def test_a_connection_waits_the_read_timeout(site: tuple[Site, str]) -> None:
    """An answer that does not come fails after read_timeout; the sockets say no delay."""
    s, base = site
    s.routes["/hang"] = lambda h: h.site.release.wait(60)
    client = HttpClient({}, 10.0, 0.2)
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    (conn,) = client._idle[("http", base.removeprefix("http://"))]
    assert conn.sock is not None
    assert conn.sock.gettimeout() == 0.2
    assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    with pytest.raises(TimeoutError):
        client.get_range(f"{base}/hang", 0, 10)
    client.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_connection_waits_the_connect_timeout(scheme: str) -> None:
    """A server that does not take the connection (HTTPS: its handshake) fails it in time.

    HTTP: a listener whose backlog is full (Linux then drops the next SYN); HTTPS: one that
    takes the connection into its backlog and never says a word.
    """
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        if scheme == "http":
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))  # the backlog
        client = HttpClient({}, 0.3, 60.0)
        with pytest.raises(TimeoutError):
            client.get_range(f"{scheme}://127.0.0.1:{port}/f.bin", 0, 10)


def test_connections_after_a_connection_close_are_opened_alike(site: tuple[Site, str]) -> None:
    """An answer with ``Connection: close``: the next request's connection is a new one of ours."""
    s, base = site
    s.routes["/last"] = lambda h: h.answer(206, b"x", {"Connection": "close"})
    client = HttpClient({}, 10.0, 0.25)
    assert client.get_range(f"{base}/last", 0, 1) == b"x"
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    (conn,) = client._idle[("http", base.removeprefix("http://"))]
    assert conn.sock is not None
    assert conn.sock.gettimeout() == 0.25
    assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    assert s.connections == 2
    client.close()


def test_a_forked_child_opens_its_own_connections(
    site: tuple[Site, str], client: HttpClient
) -> None:
    """The parent's pooled socket is not used in the child; it stays open for the parent."""
    s, base = site
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        pid = os.fork()
    if pid == 0:  # the child: exits 0 if it read the bytes
        code = 1
        try:
            code = 0 if client.get_range(f"{base}/f.bin", 20, 30) == DATA[20:30] else 2
            client.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert s.connections == 2
    assert client.get_range(f"{base}/f.bin", 40, 50) == DATA[40:50]
    assert s.connections == 2  # the parent's pooled connection still works


# -- URLs and redirects -----------------------------------------------------------------------


def test_urls_are_quoted_and_checked(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site
    s.files["/a%20b/%C3%A9.bin?v=1&sig=a%2Fb"] = b"quoted"
    s.files["/"] = b"root"
    assert client.get_range(f"{base}/a b/é.bin?v=1&sig=a%2Fb", 0, 100) == b"quoted"
    assert client.get_range(base, 0, 100) == b"root"
    assert [target for target, _ in s.requests] == ["/a%20b/%C3%A9.bin?v=1&sig=a%2Fb", "/"]
    for bad in ("ftp://127.0.0.1/x", "http:///x", "127.0.0.1/x"):
        with pytest.raises(ValueError, match=r"^not an http\(s\) URL: "):
            client.get_range(bad, 0, 1)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_followed_on_the_same_connection(
    site: tuple[Site, str], client: HttpClient, status: int
) -> None:
    s, base = site
    s.routes["/moved"] = lambda h: h.answer(status, b"see elsewhere", {"Location": "f.bin?x=1"})
    s.routes["/f.bin"] = lambda h: h.answer(206, b"found", {"Content-Range": "bytes 0-4/5"})
    assert client.get_range(f"{base}/moved", 0, 5) == b"found"
    assert client.size(f"{base}/moved") == 5
    assert [target for target, _ in s.requests] == ["/moved", "/f.bin?x=1"] * 2
    assert all(headers["Range"] == "bytes=0-4" for _, headers in s.requests[:2])
    assert s.connections == 1


def test_a_redirect_to_another_server(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site
    other = Site()
    with serve(other) as other_base:
        s.routes["/away"] = lambda h: h.answer(302, b"", {"Location": f"{other_base}/f.bin"})
        assert client.get_range(f"{base}/away", 3, 9) == DATA[3:9]
    assert [target for target, _ in other.requests] == ["/f.bin"]


def test_a_redirect_without_a_location_is_the_answer(
    site: tuple[Site, str], client: HttpClient
) -> None:
    s, base = site
    s.routes["/nowhere"] = lambda h: h.answer(302, b"")
    with pytest.raises(HttpStatusError) as caught:
        client.get_range(f"{base}/nowhere", 0, 5)
    assert caught.value.status == 302
    assert len(s.requests) == 1


def test_ten_redirects_are_followed_not_eleven(site: tuple[Site, str], client: HttpClient) -> None:
    s, base = site

    def hop(h: Handler) -> None:
        n = int(h.path.partition("?n=")[2])
        if n:
            h.answer(302, b"", {"Location": f"/hop?n={n - 1}"})
        else:
            h.answer(206, b"here", {"Content-Range": "bytes 0-3/4"})

    s.routes["/hop"] = hop
    assert client.get_range(f"{base}/hop?n={_http.REDIRECTS}", 0, 4) == b"here"
    assert len(s.requests) == _http.REDIRECTS + 1
    s.requests.clear()
    with pytest.raises(HttpStatusError, match=r"^HTTP 310 more than 10 redirects$") as caught:
        client.get_range(f"{base}/hop?n={_http.REDIRECTS + 1}", 0, 4)
    assert caught.value.status == 310
    assert caught.value.url == f"{base}/hop?n=0"
    assert len(s.requests) == _http.REDIRECTS + 1


# -- HTTPS ------------------------------------------------------------------------------------


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_site(tmp_path: Path) -> Iterator[tuple[Site, str, Path]]:
    """An HTTPS server on loopback with a self-signed certificate: (site, base URL, cert)."""
    cert, key = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    s = Site()
    with serve(s, context) as base:
        yield s, base, cert


def test_https_checks_the_certificate_with_the_systems_trust(
    tls_site: tuple[Site, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    s, base, cert = tls_site
    monkeypatch.setattr(_http, "_context", [])  # made anew, from the environment below
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    client = HttpClient({}, 10.0, 10.0)
    assert client.get_range(f"{base}/f.bin", 0, 10) == DATA[:10]
    assert client.get_range(f"{base}/f.bin", 10, 20) == DATA[10:20]
    assert s.connections == 1
    assert _http._tls() is _http._tls()  # one context for every connection
    client.close()


def test_https_refuses_an_untrusted_certificate(
    tls_site: tuple[Site, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, base, _ = tls_site
    monkeypatch.setattr(_http, "_context", [])  # not one that trusts the certificate
    client = HttpClient({}, 10.0, 10.0)
    with pytest.raises(ssl.SSLCertVerificationError):
        client.get_range(f"{base}/f.bin", 0, 10)
