"""A TCP proxy on loopback that puts a round trip and a per-connection bandwidth in the way.

Loopback servers answer in microseconds and stream at GB/s; a real bucket costs a round
trip to the first byte (20–100 ms) and one connection carries ~50–100 MB/s. Put this proxy
in front of the HTTP server or SeaweedFS to measure readers the way a real bucket treats
them (issue 13):

    python benchmarks/shaper.py --target 127.0.0.1:8333 --rtt 50ms --rate 40MB

prints the port it listens on. Each direction of each connection delays every chunk by
half the round trip (so a request and its answer cost one ``rtt``) and paces the bytes at
``rate`` per second; connections are independent, as on a real network, so N connections
carry N times the rate. Used from Python: ``with Shaper(host, port, rtt=0.05,
rate=40e6) as proxy: proxy.port``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from types import TracebackType

CHUNK = 64 * 1024

__all__ = ["Shaper", "parse_rate", "parse_seconds"]


class Shaper:
    """The proxy, run on an event loop of its own in a daemon thread.

    Args:
        host: The server to forward to.
        port: Its port.
        rtt: Round trip added, in seconds (half each way).
        rate: Bytes per second per connection and direction (``None``: no cap).
    """

    def __init__(self, host: str, port: int, *, rtt: float, rate: float | None) -> None:
        if rtt < 0 or (rate is not None and rate <= 0):
            msg = f"rtt must be >= 0 and rate > 0 or None (got rtt={rtt}, rate={rate})"
            raise ValueError(msg)
        self.target = (host, port)
        self.rtt, self.rate = rtt, rate
        self.port = 0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # one per connection

    def start(self) -> Shaper:
        """Listen on a free port of 127.0.0.1 (then ``port``)."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Close the listener and every connection, and end the thread and its loop."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def __enter__(self) -> Shaper:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        writers = [client_w]
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
            writers.append(server_w)
            await asyncio.gather(self._pump(client_r, server_w), self._pump(server_r, client_w))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in writers:
                writer.close()
            await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction: each chunk delayed by rtt/2, paced at ``rate``."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def receive() -> None:
            try:
                while data := await reader.read(CHUNK):
                    queue.put_nowait((time.monotonic(), data))
            finally:
                queue.put_nowait((time.monotonic(), b""))

        receiving = asyncio.ensure_future(receive())
        free_at = 0.0  # when the paced link is free again
        try:
            while True:
                arrived, data = await queue.get()
                # a chunk is through once the link has carried all its bytes
                pace = len(data) / self.rate if self.rate else 0.0
                free_at = max(arrived + self.rtt / 2, free_at) + pace
                if (wait := free_at - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError):
                if writer.can_write_eof():
                    writer.write_eof()
        finally:
            receiving.cancel()


def parse_seconds(text: str) -> float:
    """``"50ms"``, ``"0.05s"`` or ``"0.05"`` as seconds."""
    text = text.strip().lower()
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    return float(text.removesuffix("s"))


def parse_rate(text: str) -> float | None:
    """``"40MB"`` (per second), ``"500KB"``, ``"none"`` as bytes per second."""
    text = text.strip().upper().removesuffix("/S")
    if text == "NONE":
        return None
    for suffix, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt", default="50ms", help="round trip added (default 50ms)")
    parser.add_argument("--rate", default="40MB", help="per connection and direction, or none")
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    shaper = Shaper(host, int(port), rtt=parse_seconds(args.rtt), rate=parse_rate(args.rate))
    with shaper:
        print(shaper.port, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
