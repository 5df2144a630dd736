"""Reading ahead (issue 13): exactly once under faults, within the budget, ahead of use.

Shards of a few MB of random payloads, so that each is fetched in several blocks; real
servers on loopback (SeaweedFS, the aiohttp static server, Python's own http.server).
"""

from __future__ import annotations

import functools
import http.server
import io
import os
import tarfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader, graph_settings

import shardpipes as sp
from shardpipes import fs
from shardpipes.fs.readahead import MIN_BLOCK
from tests.cloud.faults import ResetProxy
from tests.cloud.servers import SeaweedS3, StaticHTTP
from tests.conftest import opener_of

SAMPLE = 200_000  # bytes of payload per sample


def big_shard(shard: int, samples: int, ext: str = "bin") -> tuple[bytes, list[str]]:
    """A tar of ``samples`` samples of random payloads (``.bin``) and a ``.cls``: (bytes, keys)."""
    out, keys = io.BytesIO(), []
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(samples):
            key = f"s{shard}/{i:04d}"
            for suffix, data in ((ext, os.urandom(SAMPLE)), ("cls", str(i % 5).encode())):
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            keys.append(key)
    return out.getvalue(), keys


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[str]]:
    """4 shards of ~3 MB (15 samples of 200 KB): (paths, every key)."""
    root = tmp_path_factory.mktemp("big")
    paths, keys = [], []
    for s in range(4):
        data, names = big_shard(s, 15)
        path = root / f"big-{s:06d}.tar"
        path.write_bytes(data)
        paths.append(path)
        keys += names
    return paths, keys


@pytest.fixture
def bucket(s3_server: SeaweedS3, shards: tuple[list[Path], list[str]]) -> Iterator[str]:
    name = s3_server.make_bucket(shards[0])
    yield name
    s3_server.remove_bucket(name)


def keys_of(pipe: object, workers: int = 0) -> Counter[str]:
    loader = DataLoader(pipe, batch_size=None, num_workers=workers)  # type: ignore[arg-type]
    return Counter(key for _, key in loader)


@pytest.mark.slow
def test_two_workers_read_ahead_exactly_once_through_resets_and_cuts(
    s3_server: SeaweedS3, bucket: str, shards: tuple[list[Path], list[str]]
) -> None:
    """1 MiB blocks, 2 in flight, a connection in 3 reset, one in 2 cut after 300 kB.

    Of the connections that carry 300 kB (a pool's idle ones are not counted): so there
    is a cut in every run.
    """
    paths, keys = shards
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    with ResetProxy(host, int(port)) as proxy:
        proxy.reset_on_accept(every=3)
        proxy.cut_after(300_000, every=2)
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
        pipe = sp.recipes.tar_shards(
            [f"s3://{bucket}/{p.name}" for p in paths], fields=("cls", "__key__"),
            storage_options=options, readahead="2MiB", io_concurrency=2, retries=8,
        )  # fmt: skip
        assert keys_of(pipe, workers=2) == Counter(keys)
        assert proxy.stats.resets_on_accept > 0 and proxy.stats.cuts > 0


def test_the_budget_holds_and_the_next_shard_comes_ahead(
    http_server: StaticHTTP, shards: tuple[list[Path], list[str]]
) -> None:
    """Held bytes stay within readahead, plus the one block a reader waits on.

    The next shard's blocks are asked for while the current one is still being read.
    """
    paths, keys = shards
    urls = http_server.add({f"ahead/{p.name}": p for p in paths})
    pipe = sp.recipes.tar_shards(
        urls, fields=("cls", "__key__"), shuffle=False, readahead="3MiB", io_concurrency=2
    )
    ahead = opener_of(pipe).reader.ahead
    seen, early = Counter[str](), []
    fs.READ_STATS.reset()
    for _, key in pipe:
        seen[key] += 1
        if key.endswith("/0013"):  # the last but one sample of a shard
            early.append(any(s.blocks and not s.started for s in ahead._sources))
    assert seen == Counter(keys)
    assert 0 < ahead.peak <= 3 * 2**20 + MIN_BLOCK
    assert early[:3] == [True, True, True]  # shards 1-3 were on their way
    assert fs.READ_STATS.requests >= 4 * 3  # ~3 MB shards in blocks of at most 1 MiB
    assert fs.READ_STATS.fetched >= sum(p.stat().st_size for p in paths) - 4 * 10240


def test_readahead_zero_reads_block_by_block(
    http_server: StaticHTTP, shards: tuple[list[Path], list[str]]
) -> None:
    paths, keys = shards
    urls = http_server.add({f"zero/{p.name}": p for p in paths})
    pipe = sp.recipes.tar_shards(urls, fields=("cls", "__key__"), shuffle=False, readahead=0)
    assert keys_of(pipe) == Counter(keys)
    assert opener_of(pipe).reader.ahead.peak <= MIN_BLOCK


def test_bad_readahead_options() -> None:
    with pytest.raises(ValueError, match="readahead must be at least 0"):
        sp.recipes.tar_shards("s3://b/x.tar", readahead=-1)
    with pytest.raises(TypeError, match="readahead must be bytes"):
        sp.recipes.tar_shards("s3://b/x.tar", readahead=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="io_concurrency must be at least 1"):
        sp.recipes.tar_shards("s3://b/x.tar", io_concurrency=0)


def test_the_cache_fills_from_parts(s3_server: SeaweedS3, s3_bucket: str, tmp_path: Path) -> None:
    """Three workers each read their part of an indexed shard: the next epoch fetches nothing."""
    data, keys = big_shard(0, 15, ext="jpg")
    (tmp_path / "one.tar").write_bytes(data)
    s3_server.upload(s3_bucket, [tmp_path / "one.tar"])
    url = f"s3://{s3_bucket}/one.tar"
    sp.write_index(url, storage_options=s3_server.storage_options)
    cache = tmp_path / "cache"
    pipes = []
    for worker in range(3):
        pipe = sp.recipes.indexed_tar(
            url, image="bytes", storage_options=s3_server.storage_options,
            cache_dir=str(cache), cache_size="1GB",
        )  # fmt: skip
        graph_settings.apply_sharding(pipe, 3, worker)
        pipes.append(pipe)
    fs.READ_STATS.reset()
    first = Counter(label for pipe in pipes for _, label in pipe)
    assert first.total() == len(keys) and fs.READ_STATS.fetched > 0
    fs.READ_STATS.reset()
    again = Counter(label for pipe in pipes for _, label in pipe)
    assert again == first and fs.READ_STATS.fetched == 0 and fs.READ_STATS.bytes > 0


class _NoRanges(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def plain_http(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Python's http.server (it ignores Range): (its folder, its base URL)."""
    handler = functools.partial(_NoRanges, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def test_a_server_without_ranges_is_named(plain_http: tuple[Path, str]) -> None:
    """A shard larger than a block: a StorageError that says why; a small one reads whole."""
    root, base = plain_http
    big, _ = big_shard(0, 15)
    small, small_keys = big_shard(1, 2)
    (root / "big.tar").write_bytes(big)
    (root / "small.tar").write_bytes(small)
    with pytest.raises(sp.StorageError, match=r"big\.tar: the server ignores HTTP Range"):
        list(sp.recipes.tar_shards(f"{base}/big.tar", fields=("cls",)))
    got = sp.recipes.tar_shards(f"{base}/small.tar", fields=("__key__",), shuffle=False)
    assert [key for (key,) in got] == small_keys


@pytest.mark.parametrize("stop", [5, 25, 44])
def test_resuming_refetches_the_buffer_through_the_read_ahead(
    http_server: StaticHTTP, shards: tuple[list[Path], list[str]], stop: int
) -> None:
    """A state taken mid-epoch restores its shuffle buffer by ranges: the rest, exactly."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    paths, keys = shards
    urls = http_server.add({f"resume/{p.name}": p for p in paths})

    def make() -> object:
        return sp.recipes.tar_shards(urls, fields=("cls", "__key__"), seed=17, buffer_size=10)

    whole = [key for _, key in StatefulDataLoader(make(), batch_size=None)]
    first = StatefulDataLoader(make(), batch_size=None)
    head = []
    for _, key in first:
        head.append(key)
        if len(head) == stop:
            break
    state = first.state_dict()
    again = StatefulDataLoader(make(), batch_size=None)
    again.load_state_dict(state)
    assert head + [key for _, key in again] == whole
    assert sorted(whole) == sorted(keys)


def test_flat_options_on_a_chained_url_are_refused() -> None:
    """Flat options would go to simplecache, which drops them: the reads would go to AWS."""
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://x"}}
    with pytest.raises(ValueError, match=r"per protocol, e\.g\. storage_options=\{'s3'"):
        sp.recipes.tar_shards("simplecache::s3://b/train-{0..3}.tar", storage_options=options)
    per_protocol = {"s3": options, "simplecache": {"cache_storage": "/tmp/unused"}}
    sp.recipes.tar_shards("simplecache::s3://b/train-{0..3}.tar", storage_options=per_protocol)
