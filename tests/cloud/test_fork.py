"""Forked DataLoader workers leave the parent's pooled bucket connections working.

The parent reads first (lists and streams shards), forks DataLoader workers that collect
their garbage (finalizing the filesystems fsspec dropped from its cache in the child), and
then reads again through its cached filesystem and pooled keep-alive connections. Before
``shardpipes.fs.fork`` the parent's next request waited out the client timeout: the child had
removed the parent's sockets from the shared epoll set.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import ClientTimeout
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes import fs
from tests.cloud.servers import SeaweedS3, StaticHTTP
from tests.cloud.test_http import serve
from tests.conftest import Dataset, batch_keys

pytestmark = pytest.mark.slow


def collect_garbage(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: finalize what the fork left unreferenced, now."""
    gc.collect()


def epoch_then_read_again(pattern: str, options: dict[str, Any], data: Dataset) -> None:
    """Read in the parent, run an epoch with 2 forked workers, read in the parent again."""
    urls = list(sp.list_shards(pattern, storage_options=options))
    cached, path = fs.url_to_fs(urls[0], options)
    before = cached.cat_file(path)  # leaves a pooled connection in the parent's cached instance
    cached_id = id(cached)
    del cached  # only fsspec's cache holds it now, as when the library made it
    pipe = sp.recipes.tar_shards(
        urls, fields=("txt", "__key__"), batch_size=4, storage_options=options
    )
    loader = DataLoader(
        pipe, batch_size=None, num_workers=2, multiprocessing_context="fork",
        worker_init_fn=collect_garbage,
    )  # fmt: skip
    assert Counter(batch_keys(loader)) == Counter(data.keys)
    # The same cached filesystem and pool, straight through fsspec (no retry layer, no
    # HEAD-then-GET fallback to hide a stall): a lost epoll registration times out here.
    cached = fs.url_to_fs(urls[0], options)[0]
    assert id(cached) == cached_id
    assert cached.cat_file(path) == before
    assert Counter(batch_keys(DataLoader(pipe, batch_size=None))) == Counter(data.keys)


def test_http_parent_reads_after_forked_workers(
    http_server: StaticHTTP, make_shards: Callable[..., Dataset]
) -> None:
    """HTTP: the parent's cached HTTPFileSystem answers after the workers are gone."""
    data = make_shards(4, 6)
    base = serve(http_server, data)
    pattern = base + "/train-{000000..000003}.tar"
    # no skip_instance_cache: the point is the cached instance; the timeout turns a lost
    # registration into an error instead of a 300 s wait
    options = {"client_kwargs": {"timeout": ClientTimeout(total=20)}}
    epoch_then_read_again(pattern, options, data)


def test_s3_parent_reads_after_forked_workers(
    s3_server: SeaweedS3, make_shards: Callable[..., Dataset]
) -> None:
    """S3: the parent's cached S3FileSystem answers after the workers are gone.

    s3fs's finalizer takes another path in the child today (it schedules the session's
    close instead of closing the connector), so this guards the same user path in case
    that changes.
    """
    data = make_shards(4, 6)
    with s3_server.bucket_with(data.urls) as bucket:
        options = {
            **s3_server.storage_options,
            "config_kwargs": {"read_timeout": 20, "connect_timeout": 5},
        }
        epoch_then_read_again(f"s3://{bucket}/train-*.tar", options, data)
