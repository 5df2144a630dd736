"""A flaky network loses nothing: shardpipes' one retry layer over real faults on loopback.

A TCP proxy in front of the SeaweedFS server resets connections on accept and cuts
responses mid-body; moto behind a WSGI wrapper answers 503 SlowDown, 500 and truncated
bodies. An epoch through ``tar_shards`` must yield exactly what a direct read yields.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest

import shardpipes as sp
from shardpipes import fs
from shardpipes.fs.readahead import FIRST_BLOCK
from tests.cloud.faults import FaultyMoto, ResetProxy
from tests.cloud.servers import SeaweedS3
from tests.conftest import Dataset


def epoch_keys(url: str, options: dict[str, object], **kwargs: object) -> Counter[str]:
    pipe = sp.recipes.tar_shards(url, fields=("txt", "__key__"), storage_options=options, **kwargs)
    return Counter(key for _, key in pipe)


@pytest.fixture
def seaweed_shards(
    s3_server: SeaweedS3, make_shards: Callable[..., Dataset]
) -> Iterator[tuple[Dataset, str]]:
    data = make_shards(6, 40)  # ~60 KB shards: a cut after 20 KB lands mid-body
    bucket = s3_server.make_bucket([Path(u) for u in data.urls])
    yield data, f"s3://{bucket}/train-*.tar"
    s3_server.remove_bucket(bucket)


@pytest.fixture
def proxy(s3_server: SeaweedS3) -> Iterator[ResetProxy]:
    host, port = s3_server.endpoint_url.removeprefix("http://").split(":")
    with ResetProxy(host, int(port)) as running:
        yield running


def through(proxy: ResetProxy, server: SeaweedS3) -> dict[str, object]:
    """Storage options that reach the server through the proxy (a fresh s3fs instance)."""
    options = {**server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    return {**options, "skip_instance_cache": True}


def test_resets_and_cuts_lose_nothing(
    s3_server: SeaweedS3,
    seaweed_shards: tuple[Dataset, str],
    proxy: ResetProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every 3rd connection reset on accept, every 2nd of the others cut mid-body.

    The same samples, once. Reads share pooled connections (one client per process), so
    a handful of connections carry the epoch: every 2nd, not every 3rd, is cut, so that
    one that carries more than 20 KB is among them.
    """
    data, pattern = seaweed_shards
    direct = epoch_keys(pattern, s3_server.storage_options, shuffle=False)
    assert direct == Counter(data.keys)
    proxy.reset_on_accept(every=3)
    proxy.cut_after(20_000, every=2)
    fs.READ_STATS.reset()
    with caplog.at_level(logging.WARNING, logger="shardpipes"):
        flaky = epoch_keys(pattern, through(proxy, s3_server), shuffle=False)
    assert flaky == direct
    stats = proxy.stats
    assert stats.resets_on_accept > 0 and stats.cuts > 0, stats
    assert fs.READ_STATS.retries > 0
    assert "retry 1 of 5" in caplog.text


def test_a_dead_endpoint_gives_up_with_the_url_and_offset(
    s3_server: SeaweedS3, seaweed_shards: tuple[Dataset, str], proxy: ResetProxy
) -> None:
    """Every connection reset: StorageError naming the URL after the retries, no storm.

    Two requests go out at once, the size and the first block; each gets at most 3 tries
    and aiohttp resends an idempotent request once after a reset, while botocore's own
    retries are off: at most 12 connections (botocore's defaults alone would make 5x5 per
    request). The block's retries stop once the open has failed.
    """
    _, pattern = seaweed_shards
    url = pattern.replace("*", "000000")
    proxy.reset_on_accept()
    pipe = sp.recipes.tar_shards(
        url, storage_options=through(proxy, s3_server), retries=2, check_exists=False
    )  # unchecked, the shard is opened (with the check, the listing fails the same way)
    with pytest.raises(sp.StorageError, match=rf"^{url}: open failed after 2 retries"):
        list(pipe)
    assert 3 <= proxy.stats.accepted <= 12


# -- HTTP-level faults from moto -------------------------------------------------------


def fresh(server: FaultyMoto) -> dict[str, object]:
    return {**server.storage_options, "skip_instance_cache": True}


@pytest.fixture(scope="module")
def moto() -> Iterator[FaultyMoto]:
    with FaultyMoto() as server:
        yield server


@pytest.fixture
def moto_shard(
    moto: FaultyMoto, make_shards: Callable[..., Dataset], request: pytest.FixtureRequest
) -> Iterator[tuple[Dataset, str]]:
    """One ~120 KB shard in moto: a body truncated at 10 KB leaves most of it unread."""
    data = make_shards(1, 60)
    s3 = fsspec.filesystem("s3", **moto.storage_options, skip_instance_cache=True)
    if not s3.exists("faults"):
        s3.mkdir("faults")
    # a key of its own: a request an earlier test's pipe still has under way (a retry in
    # its back-off) must not land in this test's log as one of its reads
    key = f"faults/{request.node.name}.tar"
    s3.put(data.urls[0], key)
    moto.clear(log=True)
    yield data, f"s3://{key}"
    moto.clear(log=True)
    s3.rm(key)


def test_503_slowdown_is_retried(
    moto: FaultyMoto, moto_shard: tuple[Dataset, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Two 503 SlowDown answers, then the shard: every sample, and the retries logged."""
    data, url = moto_shard
    moto.inject("503", times=2)
    with caplog.at_level(logging.WARNING, logger="shardpipes"):
        got = epoch_keys(url, fresh(moto))
    assert got == Counter(data.keys)
    assert moto.faults_injected == 2
    assert caplog.text.count("retry") >= 2


def test_truncated_body_resumes_at_the_offset(
    moto: FaultyMoto, moto_shard: tuple[Dataset, str]
) -> None:
    """A body cut short: reopened at the byte reached, no sample twice or lost."""
    data, url = moto_shard
    moto.inject("truncate", times=1, truncate_at=10_000)
    got = epoch_keys(url, fresh(moto))
    assert got == Counter(data.keys)
    assert moto.faults_injected == 1


def test_persistent_500_gives_up_after_the_retries(
    moto: FaultyMoto, moto_shard: tuple[Dataset, str]
) -> None:
    """A 500 on every GET: StorageError after `retries`, with the cause; no retry storm."""
    _, url = moto_shard
    moto.inject("500")
    with pytest.raises(sp.StorageError, match=rf"^{url}: (open|read) failed after 3 retries"):
        list(sp.recipes.tar_shards(url, storage_options=fresh(moto), retries=3))
    # one try and 3 retries of the request that gave up first (the size, asked with a GET
    # of one byte, or the first block), fewer of the others asked for at once, which stop
    # retrying then; no retries inside s3fs, botocore or the HTTP client
    tries = Counter(get.range for get in moto.gets())
    assert max(tries.values()) == 4 and tries.total() <= 12, tries


FIRST = f"bytes=0-{FIRST_BLOCK - 1}"  # the first block's range: asked for once per epoch


def test_s3_reads_are_presigned_gets_unless_options_change_the_requests(
    moto: FaultyMoto, moto_shard: tuple[Dataset, str]
) -> None:
    """Blocks go as presigned GETs; with s3_additional_kwargs, as s3fs signs them.

    Those options (server-side encryption keys…) change the requests themselves: s3fs
    makes them. The bytes agree either way.
    """
    data, url = moto_shard
    assert epoch_keys(url, fresh(moto)) == Counter(data.keys)
    gets = [get for get in moto.gets(url.removeprefix("s3://")) if get.range == FIRST]
    assert gets and all("X-Amz-Signature=" in get.query for get in gets)
    # the second read is of a copy: a request of the first still under way is not its own
    copy = url.replace(".tar", "-copy.tar")
    fsspec.filesystem("s3", **fresh(moto)).copy(url, copy)
    options = {**fresh(moto), "s3_additional_kwargs": {"RequestPayer": "requester"}}
    assert epoch_keys(copy, options) == Counter(data.keys)
    gets = [get for get in moto.gets(copy.removeprefix("s3://")) if get.range == FIRST]
    assert gets and not any("X-Amz-Signature=" in get.query for get in gets)


def test_a_refused_presigned_get_falls_back_to_s3fs(
    moto: FaultyMoto, moto_shard: tuple[Dataset, str]
) -> None:
    """A 400 to presigned GETs: the reads go on through s3fs; every sample once.

    AWS answers 400 to a URL signed for another region than its bucket's; s3fs follows
    region redirects.
    """
    data, url = moto_shard
    moto.inject("400")  # every presigned GET
    assert epoch_keys(url, fresh(moto)) == Counter(data.keys)
    assert moto.faults_injected >= 1
    first = [get for get in moto.gets() if get.range == FIRST and get.fault is None]
    assert first and "X-Amz-Signature=" not in first[0].query
