"""The local shard cache over S3 (SeaweedFS): second epoch from disk, byte bound, no partials."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes import fs
from shardpipes.fs.cache import ShardCache
from tests.cloud.faults import ResetProxy
from tests.cloud.servers import SeaweedS3
from tests.conftest import Dataset


@pytest.fixture
def bucket_shards(
    s3_server: SeaweedS3, make_shards: Callable[..., Dataset]
) -> Iterator[tuple[Dataset, str, int]]:
    """Six shards in a fresh bucket: (data, glob URL, bytes of one shard)."""
    data = make_shards(6, 20)
    bucket = s3_server.make_bucket([Path(u) for u in data.urls])
    yield data, f"s3://{bucket}/train-*.tar", Path(data.urls[0]).stat().st_size
    s3_server.remove_bucket(bucket)


def epoch(
    pattern: str, server: SeaweedS3, cache: Path, size: int | str, workers: int = 0
) -> Counter[str]:
    # one request at a time: shards fill the cache in the order they are read (blocks
    # fetched in parallel may fill the next shard's entry before the current one's)
    pipe = sp.recipes.tar_shards(
        pattern, fields=("txt", "__key__"), storage_options=server.storage_options,
        cache_dir=str(cache), cache_size=size, shuffle=False, io_concurrency=1,
    )  # fmt: skip
    return Counter(key for _, key in DataLoader(pipe, batch_size=None, num_workers=workers))


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.name != ".lock")


def test_second_epoch_reads_from_disk(
    s3_server: SeaweedS3, bucket_shards: tuple[Dataset, str, int], tmp_path: Path
) -> None:
    """Epoch 1 fills the cache as it streams; epoch 2 reads no byte from the bucket."""
    data, pattern, _ = bucket_shards
    cache = tmp_path / "cache"
    fs.READ_STATS.reset()
    assert epoch(pattern, s3_server, cache, "1GB") == Counter(data.keys)
    assert fs.READ_STATS.bytes > 0 and len(entries(cache)) == 6
    fs.READ_STATS.reset()
    assert epoch(pattern, s3_server, cache, "1GB") == Counter(data.keys)
    assert fs.READ_STATS.bytes == 0 and fs.READ_STATS.cache_hits == 6
    local = {p.read_bytes() for p in entries(cache)}
    assert local == {Path(u).read_bytes() for u in data.urls}  # byte for byte


def test_the_bound_holds_and_evicts_the_least_recently_used(
    s3_server: SeaweedS3, bucket_shards: tuple[Dataset, str, int], tmp_path: Path
) -> None:
    """Room for 2.5 shards: at most 2 entries, the two read last (shards in order)."""
    data, pattern, shard = bucket_shards
    cache = tmp_path / "cache"
    bound = shard * 5 // 2
    assert epoch(pattern, s3_server, cache, bound) == Counter(data.keys)
    kept = entries(cache)
    assert sum(p.stat().st_size for p in kept) <= bound
    assert {p.name.rsplit("-", 1)[1] for p in kept} == {"000004.tar", "000005.tar"}


@pytest.mark.slow
def test_workers_share_one_cache(
    s3_server: SeaweedS3, bucket_shards: tuple[Dataset, str, int], tmp_path: Path
) -> None:
    """Two DataLoader workers fill one folder at once: whole entries only, read back intact."""
    data, pattern, _ = bucket_shards
    cache = tmp_path / "cache"
    assert epoch(pattern, s3_server, cache, "1GB", workers=2) == Counter(data.keys)
    assert not [p for p in cache.iterdir() if p.name.endswith(".part")]
    fs.READ_STATS.reset()
    assert epoch(pattern, s3_server, cache, "1GB", workers=2) == Counter(data.keys)
    assert len(entries(cache)) == 6


def test_a_broken_download_is_never_served(
    s3_server: SeaweedS3, bucket_shards: tuple[Dataset, str, int], tmp_path: Path
) -> None:
    """A read that fails half-way leaves no entry; the next read fetches the shard whole."""
    data, pattern, _ = bucket_shards
    url = pattern.replace("*", "000000")
    cache = tmp_path / "cache"
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    with ResetProxy(host, int(port)) as proxy:
        proxy.cut_after(3000)
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
        options["skip_instance_cache"] = True
        pipe = sp.recipes.tar_shards(url, storage_options=options, retries=0,
                                     cache_dir=str(cache), cache_size="1GB")  # fmt: skip
        with pytest.raises(sp.StorageError):
            list(pipe)
    assert entries(cache) == []
    got = epoch(url, s3_server, cache, "1GB")
    assert got == Counter(k for k in data.keys if k.startswith("s00/"))
    assert len(entries(cache)) == 1


def test_bad_cache_settings() -> None:
    with pytest.raises(ValueError, match="cache_dir needs cache_size"):
        sp.recipes.tar_shards("s3://b/x.tar", cache_dir="/tmp/x")
    with pytest.raises(ValueError, match="size must look like"):
        sp.recipes.tar_shards("s3://b/x.tar", cache_dir="/tmp/x", cache_size="lots")


def test_blocks_fill_entries_and_evict_complete_ones_first(tmp_path: Path) -> None:
    """Blocks are served once written; a shard is an entry once whole; room: LRU, partials last."""
    cache = ShardCache(tmp_path, max_bytes=1000)
    cache.fill("s3://b/a.tar", 600, 0, b"a" * 100)  # a partial entry of 600 bytes
    assert cache.read("s3://b/a.tar", 0, 100) == b"a" * 100
    assert cache.read("s3://b/a.tar", 50, 100) is None  # bytes 100..150 were never written
    assert cache.lookup("s3://b/a.tar") is None
    cache.fill("s3://b/c.tar", 300, 150, b"c" * 150)
    cache.fill("s3://b/c.tar", 300, 0, b"c" * 150)  # whole: published
    assert cache.lookup("s3://b/c.tar") is not None
    assert cache.read("s3://b/c.tar", 100, 100) == b"c" * 100
    cache.fill("s3://b/b.tar", 600, 0, b"b" * 10)  # needs 600: c goes, then the partial a
    assert cache.lookup("s3://b/c.tar") is None and cache.read("s3://b/a.tar", 0, 100) is None
    assert cache.read("s3://b/b.tar", 0, 10) == b"b" * 10
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 1000 + 100  # + the records
    cache.fill("s3://b/d.tar", 1001, 0, b"d")  # larger than the bound: not cached
    assert cache.read("s3://b/d.tar", 0, 1) is None
