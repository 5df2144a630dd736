"""The latency-shaping proxy of ``benchmarks/shaper.py``: bytes unchanged, delay and pace added.

Only lower bounds on time are asserted (a busy machine can make the proxy slower, never
faster than it is told to be).
"""

from __future__ import annotations

import hashlib
import importlib.util
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shaper", ROOT / "benchmarks" / "shaper.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shaper = _load()


class _Digest(socketserver.BaseRequestHandler):
    """Reads a 4-byte length and that many bytes, answers with their SHA-256 and echoes them."""

    def handle(self) -> None:
        size = int.from_bytes(_exactly(self.request, 4), "big")
        data = _exactly(self.request, size)
        self.request.sendall(hashlib.sha256(data).digest() + data)


def _exactly(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 16))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


@pytest.fixture
def server() -> Iterator[int]:
    """A threaded TCP server on 127.0.0.1 (its port)."""
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Digest)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _exchange(port: int, data: bytes) -> tuple[bytes, bytes, float]:
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(len(data).to_bytes(4, "big") + data)
        digest = _exactly(sock, 32)
        echoed = _exactly(sock, len(data))
    return digest, echoed, time.monotonic() - start


@pytest.mark.parametrize(("rtt", "rate", "size"), [(0.08, None, 1000), (0.02, 4e6, 2_000_000)])
def test_bytes_pass_unchanged_after_the_delay_and_pace(
    server: int, rtt: float, rate: float | None, size: int
) -> None:
    """Both ways intact; at least one round trip, and at least size / rate each way."""
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    with shaper.Shaper("127.0.0.1", server, rtt=rtt, rate=rate) as proxy:
        digest, echoed, seconds = _exchange(proxy.port, data)
        assert proxy.connections == 1
    assert digest == hashlib.sha256(data).digest() and echoed == data
    floor = rtt + (2 * size / rate if rate else 0.0)
    assert seconds >= floor * 0.99


def test_connections_are_paced_independently(server: int) -> None:
    """Two connections at once each get the rate: together faster than one after the other."""
    data = b"y" * 1_000_000
    rate = 4e6  # 0.25 s per direction per connection
    with shaper.Shaper("127.0.0.1", server, rtt=0.0, rate=rate) as proxy:
        results: list[float] = []
        threads = [
            threading.Thread(target=lambda: results.append(_exchange(proxy.port, data)[2]))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert proxy.connections == 2
    assert len(results) == 2
    assert min(results) >= 2 * len(data) / rate * 0.99


def test_a_refused_target_closes_the_client() -> None:
    """Nothing listens behind the proxy: the client sees the connection closed, no hang."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    with (
        shaper.Shaper("127.0.0.1", dead, rtt=0.01, rate=None) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
    ):
        assert sock.recv(10) == b""


@pytest.mark.parametrize(
    ("text", "seconds"), [("50ms", 0.05), ("0.1s", 0.1), ("0.02", 0.02)]
)  # fmt: skip
def test_parse_seconds(text: str, seconds: float) -> None:
    """Round trips in ms or s."""
    assert shaper.parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "rate"), [("40MB", 40e6), ("500KB/s", 5e5), ("none", None), ("1000", 1000.0)]
)  # fmt: skip
def test_parse_rate(text: str, rate: float | None) -> None:
    """Rates in B, KB, MB, GB per second, or none."""
    assert shaper.parse_rate(text) == rate
