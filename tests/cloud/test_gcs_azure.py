"""Reading shards from GCS (fake-gcs-server) and Azure (Azurite), both on 127.0.0.1."""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import shardpipes as sp
from shardpipes import fs
from tests.cloud.checks import about_a_third_each, indexed_reads
from tests.cloud.servers_gcs_azure import Azurite, FakeGCS
from tests.conftest import Dataset, batch_keys

Store = FakeGCS | Azurite
SERVERS = {"gcs": "gcs_server", "azure": "azure_server"}


@pytest.fixture(params=sorted(SERVERS))
def store(request: pytest.FixtureRequest) -> Store:
    """The GCS or the Azure server (only the one a test asks for is started)."""
    server: Store = request.getfixturevalue(SERVERS[request.param])
    return server


@pytest.fixture
def shards(store: Store, make_shards: Callable[..., Dataset]) -> Iterator[tuple[Dataset, str]]:
    """Four local shards of 6 samples, uploaded to a fresh bucket: (local data, bucket)."""
    data = make_shards(4, 6)
    with store.bucket_with(data.urls) as bucket:
        yield data, bucket


def test_list_shards_braces_and_globs(store: Store, shards: tuple[Dataset, str]) -> None:
    """Brace patterns and globs list URLs in the pattern's own scheme (az://, not abfs://)."""
    _, bucket = shards
    options, base = store.storage_options, f"{store.scheme}://{bucket}"
    expected = store.urls(bucket, [f"train-{i:06d}.tar" for i in range(4)])
    braces = sp.list_shards(f"{base}/train-{{000000..000003}}.tar", storage_options=options)
    assert list(braces) == expected
    globbed = sp.list_shards(f"{base}/train-*.tar", storage_options=options)
    assert list(globbed) == expected
    with pytest.raises(sp.NoShardsError, match="no shard matches"):
        list(sp.list_shards(f"{base}/val-*.tar", storage_options=options))


def test_tar_shards_streams_every_sample_once(store: Store, shards: tuple[Dataset, str]) -> None:
    """The recipe streams every sample of the bucket exactly once."""
    data, bucket = shards
    pipe = sp.recipes.tar_shards(
        f"{store.scheme}://{bucket}/train-*.tar", fields=("txt", "__key__"), batch_size=4,
        storage_options=store.storage_options,
    )  # fmt: skip
    assert Counter(batch_keys(pipe)) == Counter(data.keys)


def test_indexed_tar_reads_only_its_own_ranges(
    store: Store, make_shards: Callable[..., Dataset]
) -> None:
    """With an index sidecar in the bucket, each of 3 workers reads about a third."""
    data = make_shards(1, 60, images=True)
    with store.bucket_with(data.urls) as bucket:
        (url,) = store.urls(bucket, ["train-000000.tar"])
        options = store.storage_options
        sp.write_index(url, storage_options=options)
        seen, reads = indexed_reads(url, options)
        assert Counter(seen) == Counter(data.labels.values())
        assert about_a_third_each(reads, fs.size(url, options)), reads


@pytest.mark.parametrize("what", ["key", "bucket"])
def test_missing_key_or_bucket(store: Store, shards: tuple[Dataset, str], what: str) -> None:
    """A missing key or bucket: ShardNotFoundError naming the URL, not retried."""
    _, bucket = shards
    (url,) = store.urls(bucket if what == "key" else "no-such-bucket-sp", ["nope.tar"])
    fs.READ_STATS.reset()
    with pytest.raises(sp.ShardNotFoundError, match=rf"^{re.escape(url)}: no such file"):
        list(sp.recipes.tar_shards(url, storage_options=store.storage_options))
    assert fs.READ_STATS.retries == 0


def test_azure_wrong_key_is_one_clear_error(
    azure_server: Azurite, make_shards: Callable[..., Dataset]
) -> None:
    """A wrong account key: StorageAccessError naming the URL, at once, without the key."""
    data = make_shards(1, 2)
    bucket = azure_server.make_bucket([Path(data.urls[0])])
    try:
        (url,) = azure_server.urls(bucket, ["train-000000.tar"])
        wrong = base64.b64encode(b"not the key" * 6).decode()  # well-formed, wrong
        options = {"connection_string": azure_server.connection_string(wrong)}
        fs.READ_STATS.reset()
        with pytest.raises(sp.StorageAccessError, match=rf"^{re.escape(url)}: access denied") as e:
            list(sp.recipes.tar_shards(url, storage_options=options))
        assert fs.READ_STATS.retries == 0
        assert wrong not in str(e.value)
    finally:
        azure_server.remove_bucket(bucket)
