"""shardpipes' own HTTP client (issue 13): what real servers do that a loopback one does not.

A server on loopback, written here, that can insist on a header, redirect, refuse
``HEAD`` (as a presigned URL does), and close kept-alive connections without saying so;
the reads go through ``tar_shards`` as a user would write them.
"""

from __future__ import annotations

import http.server
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import shardpipes as sp
from shardpipes import fs
from shardpipes.fs.readahead import FIRST_BLOCK
from tests.cloud.servers import SeaweedS3
from tests.cloud.test_readahead import big_shard
from tests.conftest import opener_of

TOKEN = "Bearer let-me-in"


@dataclass
class Rules:
    """How the server behaves, and what it saw."""

    files: dict[str, bytes] = field(default_factory=dict)
    token: str | None = None  # required Authorization header
    redirect: bool = False  # /x answers 302 to /real/x
    no_head: bool = False  # HEAD is 405 (a URL presigned for GET)
    one_request: bool = False  # closes every connection after one answer, unannounced
    connections: int = 0
    requests: Counter[str] = field(default_factory=Counter)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    rules: Rules

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.rules.connections += 1

    def do_HEAD(self) -> None:
        self.rules.requests["HEAD"] += 1
        if self.rules.no_head:
            self._answer(405, b"")
        else:
            self._serve(body=False)

    def do_GET(self) -> None:
        self.rules.requests["GET"] += 1
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        rules = self.rules
        if rules.token is not None and self.headers.get("Authorization") != rules.token:
            self._answer(403, b"AccessDenied")
            return
        path = self.path
        if rules.redirect and not path.startswith("/real/"):
            self.send_response(302)
            self.send_header("Location", f"/real{path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = rules.files.get(path.removeprefix("/real"))
        if data is None:
            self._answer(404, b"NoSuchKey")
            return
        found = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if found is None:
            self._answer(200, data, body=body)
            return
        start, end = int(found[1]), min(int(found[2]) + 1, len(data))
        if start >= len(data):
            self._answer(416, b"", extra={"Content-Range": f"bytes */{len(data)}"})
            return
        extra = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        self._answer(206, data[start:end], body=body, extra=extra)

    def _answer(
        self, status: int, data: bytes, *, body: bool = True, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
        if self.rules.one_request:
            self.close_connection = True  # without a Connection: close header


@pytest.fixture
def server() -> Iterator[tuple[Rules, str]]:
    """A threaded HTTP/1.1 server on loopback: (its rules, its base URL)."""
    rules = Rules()
    handler = type("Handler", (_Handler,), {"rules": rules})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        yield rules, f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.shutdown()


def shards(
    rules: Rules, base: str, count: int = 3, samples: int = 12
) -> tuple[list[str], list[str]]:
    """``count`` shards of a few MB on the server: (URLs, every key)."""
    urls, keys = [], []
    for s in range(count):
        data, names = big_shard(s, samples)
        rules.files[f"/shard-{s}.tar"] = data
        urls.append(f"{base}/shard-{s}.tar")
        keys += names
    return urls, keys


def keys_read(urls: list[str], **options: Any) -> list[str]:
    samples = iter(sp.recipes.tar_shards(urls, fields=("__key__",), shuffle=False, **options))
    try:
        return [key for (key,) in samples]
    finally:
        samples.close()  # type: ignore[attr-defined] # on failure too: its reads stop


def test_headers_are_sent_and_redirects_followed(server: tuple[Rules, str]) -> None:
    """A bucket behind a redirect that wants a token: every sample once, with the headers."""
    rules, base = server
    rules.token, rules.redirect = TOKEN, True
    urls, keys = shards(rules, base)
    got = keys_read(urls, storage_options={"headers": {"Authorization": TOKEN}})
    assert got == keys
    with pytest.raises(sp.StorageAccessError, match=rf"^{base}/shard-0\.tar: access denied"):
        keys_read(urls)


def test_a_failed_or_abandoned_pipeline_stops_fetching_ahead(server: tuple[Rules, str]) -> None:
    """Once the pipeline raised or was closed, nothing is planned or open in its read-ahead.

    (Its error's traceback had kept the next shards' fetches alive: they were retried
    against a server already gone, after the test that raised had ended.)
    """
    rules, base = server
    rules.token, rules.redirect = TOKEN, True
    urls, _ = shards(rules, base)
    pipe = sp.recipes.tar_shards(urls, fields=("__key__",), shuffle=False, check_exists=False)
    ahead = opener_of(pipe).reader.ahead
    with pytest.raises(sp.StorageAccessError) as raised:
        list(pipe)
    assert ahead._sources == []
    del raised
    rules.token = None
    samples = iter(pipe)
    next(samples)
    assert any(not s.started for s in ahead._sources)  # the next shards were planned
    samples.close()  # type: ignore[attr-defined]
    assert ahead._sources == []


def test_a_get_only_url_is_checked_and_read(server: tuple[Rules, str]) -> None:
    """HEAD refused (a presigned URL): the existence check and the size use a GET of 1 byte."""
    rules, base = server
    rules.no_head = True
    urls, keys = shards(rules, base)
    assert keys_read(urls, check_exists=True) == keys
    assert fs.missing_files([*urls, f"{base}/gone.tar"]) == [f"{base}/gone.tar"]
    assert rules.requests["HEAD"] == 0


def test_connections_are_kept_alive(server: tuple[Rules, str]) -> None:
    """Requests reuse connections: fewer connections than requests, in one process."""
    rules, base = server
    urls, keys = shards(rules, base, count=6)
    fs.READ_STATS.reset()
    assert keys_read(urls, io_concurrency=2, readahead="4MiB", check_exists=False) == keys
    assert rules.requests["GET"] >= 18  # 1 MiB blocks: 3 per shard, and its size
    assert rules.connections <= rules.requests["GET"] // 2, (rules.connections, rules.requests)


def test_connections_closed_by_the_server_are_replaced(
    server: tuple[Rules, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A server that drops each connection after one answer: reconnects, no retry made."""
    rules, base = server
    rules.one_request = True
    urls, keys = shards(rules, base)
    with caplog.at_level("WARNING", logger="shardpipes"):
        assert keys_read(urls, io_concurrency=1) == keys
    # each retry logs a warning; READ_STATS would also count another test's late retries
    assert not [r.message for r in caplog.records if base in r.message]
    assert rules.connections == rules.requests["GET"]


def test_plain_http_reads_do_not_import_aiohttp(server: tuple[Rules, str]) -> None:
    """Reading explicit http:// URLs never imports aiohttp (0.2 s of a worker's start), nor fsspec."""
    rules, base = server
    urls, keys = shards(rules, base, count=2, samples=3)
    code = (
        "import sys, shardpipes as sp\n"
        f"pipe = sp.recipes.tar_shards({urls!r}, fields=('__key__',), shuffle=False)\n"
        "print(len(list(pipe)), 'aiohttp' in sys.modules, 'fsspec' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == [str(len(keys)), "False", "False"]


def exact_shard(size: int) -> tuple[bytes, list[str]]:
    """A valid tar of exactly ``size`` bytes (its end padded with zero blocks)."""
    data, keys = big_shard(7, 2)
    data = data.rstrip(b"\0")
    data += b"\0" * (-len(data) % 512)
    assert len(data) + 1024 <= size
    return data + b"\0" * (size - len(data)), keys


def test_a_shard_of_exactly_the_first_block(
    server: tuple[Rules, str], s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """The second block, asked for before the size is known, starts at the end: empty.

    Over HTTP the server says 416; S3 refuses the range (InvalidRange), which the
    read-ahead recognises once the size is known.
    """
    data, keys = exact_shard(FIRST_BLOCK)
    rules, base = server
    rules.files["/exact.tar"] = data
    assert keys_read([f"{base}/exact.tar"]) == keys
    path = tmp_path / "exact.tar"
    path.write_bytes(data)
    with s3_server.bucket_with([path]) as bucket:
        url = f"s3://{bucket}/exact.tar"
        assert keys_read([url], storage_options=s3_server.storage_options) == keys


def test_a_chain_reads_with_the_options_given_to_list_shards(server: tuple[Rules, str]) -> None:
    """Credentials given to list_shards serve open_tar too, unless it has its own."""
    rules, base = server
    rules.token = TOKEN
    urls, keys = shards(rules, base, count=2, samples=3)
    options = {"headers": {"Authorization": TOKEN}}
    chain = sp.list_shards(urls, storage_options=options).split_shards(shuffle=False).open_tar()
    assert [s["__key__"] for s in chain] == keys
    own = sp.list_shards(urls, storage_options=options).split_shards(shuffle=False)
    with pytest.raises(sp.StorageAccessError, match="access denied"):
        list(own.open_tar(storage_options={"headers": {"Authorization": "Bearer no"}}))
