"""Reading shards over HTTP (an aiohttp static server on 127.0.0.1, with Range support)."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import ClientTimeout
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes import fs
from tests.cloud.checks import about_a_third_each, indexed_reads
from tests.cloud.servers import StaticHTTP
from tests.conftest import Dataset

# fsspec's cached HTTPFileSystem, as users get it. A run once hung here for 300 s after a
# test with forked DataLoader workers (the children unhooked the parent's pooled sockets
# from its epoll set; shardpipes.fs.fork fixes it, tests/cloud/test_fork.py checks it); the
# 60 s client timeout turns any such stall into an error instead of a test timeout.
CACHED = {"client_kwargs": {"timeout": ClientTimeout(total=60)}}


def serve(server: StaticHTTP, data: Dataset) -> str:
    """Copy the shards (and any .idx sidecars) into a fresh served folder; return its URL."""
    folder = server.new_folder()
    for url in data.urls:
        for path in (Path(url), Path(url + ".idx")):
            if path.exists():
                shutil.copyfile(path, server.root / folder / path.name)
    return server.url(folder)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_tar_shards_over_http(
    http_server: StaticHTTP, make_shards: Callable[..., Dataset], workers: int
) -> None:
    """A brace pattern of https?:// URLs streams every sample once, with workers too."""
    data = make_shards(4, 5)
    base = serve(http_server, data)
    pattern = f"{base}/train-{{000000..000003}}.tar"
    pipe = sp.recipes.tar_shards(pattern, fields=("txt", "__key__"), storage_options=CACHED)
    got = [key for _, key in DataLoader(pipe, batch_size=None, num_workers=workers)]
    assert Counter(got) == Counter(data.keys)


def test_indexed_tar_over_http_reads_ranges(
    http_server: StaticHTTP, make_shards: Callable[..., Dataset]
) -> None:
    """With the .idx sidecar served next to the shard, each of 3 workers reads about a third."""
    data = make_shards(1, 60, images=True)
    sp.write_index(data.urls[0])
    url = serve(http_server, data) + "/train-000000.tar"
    seen, reads = indexed_reads(url, CACHED)
    assert Counter(seen) == Counter(data.labels.values())
    assert about_a_third_each(reads, fs.size(url, CACHED)), reads


def test_missing_url_is_not_retried(http_server: StaticHTTP) -> None:
    """A 404: ShardNotFoundError naming the URL, at once."""
    url = http_server.url("nope/train-000000.tar")
    fs.READ_STATS.reset()
    with pytest.raises(sp.ShardNotFoundError, match=rf"^{url}: no such file"):
        list(sp.recipes.tar_shards(url, storage_options=CACHED))
    assert fs.READ_STATS.retries == 0
