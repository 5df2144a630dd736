"""Reading shards from S3 (a real SeaweedFS server on 127.0.0.1, credentials checked)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from shardpipes import fs
from shardpipes.cli import main
from tests.cloud.checks import about_a_third_each, indexed_reads
from tests.cloud.servers import SeaweedS3
from tests.conftest import Dataset, batch_keys


@pytest.fixture
def s3_shards(
    s3_server: SeaweedS3, make_shards: Callable[..., Dataset]
) -> Iterator[tuple[Dataset, str]]:
    """Four local shards of 6 samples, uploaded to a fresh bucket: (local data, bucket)."""
    data = make_shards(4, 6)
    with s3_server.bucket_with(data.urls) as bucket:
        yield data, bucket


def test_list_shards_braces_and_globs(s3_server: SeaweedS3, s3_shards: tuple[Dataset, str]) -> None:
    """Brace patterns and globs list s3:// URLs, with storage_options."""
    _, bucket = s3_shards
    options = s3_server.storage_options
    braces = sp.list_shards(f"s3://{bucket}/train-{{000000..000003}}.tar", storage_options=options)
    globbed = sp.list_shards(f"s3://{bucket}/train-*.tar", storage_options=options)
    assert list(globbed) == list(braces) == [f"s3://{bucket}/train-{i:06d}.tar" for i in range(4)]
    with pytest.raises(sp.NoShardsError, match="no shard matches"):
        list(sp.list_shards(f"s3://{bucket}/val-*.tar", storage_options=options))


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_tar_shards_streams_every_sample_once(
    s3_server: SeaweedS3, s3_shards: tuple[Dataset, str], workers: int
) -> None:
    """The recipe streams from the bucket; storage_options reach the DataLoader workers."""
    data, bucket = s3_shards
    pipe = sp.recipes.tar_shards(
        f"s3://{bucket}/train-*.tar", fields=("txt", "__key__"), batch_size=4,
        storage_options=s3_server.storage_options,
    )  # fmt: skip
    got = batch_keys(DataLoader(pipe, batch_size=None, num_workers=workers))
    assert Counter(got) == Counter(data.keys)


def test_indexed_tar_reads_only_its_own_ranges(
    s3_server: SeaweedS3, make_shards: Callable[..., Dataset]
) -> None:
    """With an index sidecar in the bucket, each of 3 workers reads about a third."""
    data = make_shards(1, 60, images=True)
    with s3_server.bucket_with(data.urls) as bucket:
        url, options = f"s3://{bucket}/train-000000.tar", s3_server.storage_options
        sp.write_index(url, storage_options=options)
        seen, reads = indexed_reads(url, options)
        assert Counter(seen) == Counter(data.labels.values())
        assert about_a_third_each(reads, fs.size(url, options)), reads


def test_cli_over_s3(
    s3_server: SeaweedS3,
    s3_bucket: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """write, index and inspect with s3:// URLs (endpoint and keys from the environment)."""
    from PIL import Image

    for label in ("cat", "dog"):
        (tmp_path / "src" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / "src" / label / f"{i}.png")
    out = f"s3://{s3_bucket}/out-%06d.tar"
    assert main(["write", str(tmp_path / "src"), out, "--samples-per-shard", "4"]) == 0
    assert main(["index", f"s3://{s3_bucket}/out-*.tar"]) == 0
    capsys.readouterr()
    assert main(["inspect", f"s3://{s3_bucket}/out-{{000000..000001}}.tar"]) == 0
    report = capsys.readouterr().out
    assert "6 samples" in report or "samples: 6" in report, report
    assert s3_server.filesystem().exists(f"{s3_bucket}/out-000000.tar.idx")


def test_wrong_secret_is_one_clear_error(
    s3_server: SeaweedS3, s3_shards: tuple[Dataset, str]
) -> None:
    """Bad credentials: StorageAccessError naming the URL, at once (no retries)."""
    _, bucket = s3_shards
    options = {**s3_server.storage_options, "secret": "wrong", "skip_instance_cache": True}
    url = f"s3://{bucket}/train-000000.tar"
    fs.READ_STATS.reset()
    with pytest.raises(sp.StorageAccessError, match=rf"^{url}: access denied"):
        list(sp.recipes.tar_shards(url, storage_options=options))
    assert fs.READ_STATS.retries == 0


@pytest.mark.parametrize("what", ["key", "bucket"])
def test_missing_key_or_bucket(
    s3_server: SeaweedS3, s3_shards: tuple[Dataset, str], what: str
) -> None:
    """A missing key or bucket: ShardNotFoundError naming the URL, not retried."""
    _, bucket = s3_shards
    url = f"s3://{bucket}/nope.tar" if what == "key" else "s3://no-such-bucket-sp/x.tar"
    fs.READ_STATS.reset()
    with pytest.raises(sp.ShardNotFoundError, match=rf"^{url}: no such file"):
        list(sp.recipes.tar_shards(url, storage_options=s3_server.storage_options))
    assert fs.READ_STATS.retries == 0


def test_cli_errors_are_one_line(
    s3_server: SeaweedS3, s3_shards: tuple[Dataset, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI prints one line for a missing key and for an unknown protocol."""
    _, bucket = s3_shards
    assert main(["inspect", f"s3://{bucket}/nope.tar"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"shardpipes: error: s3://{bucket}/nope.tar: no such file"]
    assert main(["inspect", "foo://bucket/x.tar"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown protocol 'foo'" in err[0]
    url = f"s3://{bucket}/train-000000.tar"
    wrong = ["-o", f"key={s3_server.key}", "-o", "secret=wrong", "-o", "skip_instance_cache=1"]
    assert main(["inspect", url, *wrong]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shardpipes: error: {url}: access denied"), err
    assert "wrong" not in err[0]  # the secret is not printed


@pytest.mark.parametrize("layer", ["simplecache", "filecache"])
def test_chained_cache_urls(
    s3_server: SeaweedS3, s3_shards: tuple[Dataset, str], tmp_path: Path, layer: str
) -> None:
    """``simplecache::s3://…`` and ``filecache::`` (options per protocol) stream every sample."""
    data, bucket = s3_shards
    options = {"s3": s3_server.storage_options, layer: {"cache_storage": str(tmp_path)}}
    pattern = f"{layer}::s3://{bucket}/train-*.tar"
    assert len(sp.list_shards(pattern, storage_options=options)) == 4
    pipe = sp.recipes.tar_shards(pattern, fields=("txt", "__key__"), storage_options=options)
    assert Counter(key for _, key in pipe) == Counter(data.keys)
    assert any(tmp_path.iterdir())  # the layer kept its copies
