"""Smoke tests of the cloud fixtures: real servers on 127.0.0.1, real fsspec clients."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import fsspec
import pytest

from tests.cloud.servers import SeaweedS3, StaticHTTP

MB = 1 << 20


@pytest.fixture(scope="module")
def blob() -> bytes:
    """About 1 MB of random bytes."""
    return os.urandom(MB + 123)


@pytest.fixture
def local_files(tmp_path: Path, blob: bytes) -> list[Path]:
    """Two shard-like files and one that no train-*.tar glob matches."""
    paths = [tmp_path / "train-000.tar", tmp_path / "train-001.tar", tmp_path / "val-000.tar"]
    for i, path in enumerate(paths):
        path.write_bytes(blob[i:] + blob[:i])
    return paths


class TestSeaweedS3:
    def test_environment_cut_off_from_aws(self, s3_server: SeaweedS3) -> None:
        """The S3 fixtures set fake credentials and turn IMDS and AWS config files off."""
        assert os.environ["AWS_EC2_METADATA_DISABLED"] == "true"
        assert os.environ["AWS_ACCESS_KEY_ID"] == s3_server.key
        assert (
            os.environ["AWS_CONFIG_FILE"]
            == os.environ["AWS_SHARED_CREDENTIALS_FILE"]
            == "/dev/null"
        )
        assert os.environ["AWS_ENDPOINT_URL"] == s3_server.endpoint_url
        assert s3_server.endpoint_url.startswith("http://127.0.0.1:")

    def test_environment_alone_reaches_the_server(
        self, s3_server: SeaweedS3, s3_bucket: str, local_files: list[Path]
    ) -> None:
        """fsspec.open("s3://…") with no storage options goes to weed through the environment."""
        (url,) = s3_server.upload(s3_bucket, local_files[:1])
        with fsspec.open(url, "rb", skip_instance_cache=True) as f:
            assert f.read(1000) == local_files[0].read_bytes()[:1000]

    @pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
    def test_listens_on_loopback_only(self, s3_server: SeaweedS3) -> None:
        """Every TCP listener of weed is on 127.0.0.1, on the ports the fixture chose."""
        assert s3_server.proc is not None
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
        mine = [
            line.split()[3] for line in out.splitlines() if f"pid={s3_server.proc.pid}," in line
        ]
        expected = {p + d for p in s3_server.ports.values() for d in (0, 10000)}
        assert sorted(mine) == sorted(f"127.0.0.1:{p}" for p in expected)

    def test_bucket_starts_empty(self, s3_server: SeaweedS3, s3_bucket: str) -> None:
        """s3_bucket is a fresh, existing, empty bucket."""
        fs = s3_server.filesystem()
        assert fs.exists(s3_bucket)
        assert fs.ls(s3_bucket) == []

    def test_put_glob_read(
        self, s3_server: SeaweedS3, s3_bucket: str, local_files: list[Path]
    ) -> None:
        """Upload, glob, sequential md5 and an exact ranged read all agree with the local files."""
        urls = s3_server.upload(s3_bucket, local_files)
        matched = fsspec.open_files(
            f"s3://{s3_bucket}/train-*.tar", "rb", **s3_server.storage_options
        )
        assert sorted(f.full_name for f in matched) == urls[:2]
        fs = s3_server.filesystem()
        for path, url in zip(local_files, urls, strict=True):
            digest = hashlib.md5()
            with fs.open(url, "rb") as f:
                while chunk := f.read(256 * 1024):
                    digest.update(chunk)
            assert digest.hexdigest() == hashlib.md5(path.read_bytes()).hexdigest()
        assert fs.cat_file(urls[1], start=100, end=612) == local_files[1].read_bytes()[100:612]

    @pytest.mark.parametrize("op", ["open", "cat_file", "info"])
    def test_missing_key(self, s3_server: SeaweedS3, s3_bucket: str, op: str) -> None:
        """A missing key raises FileNotFoundError."""
        fs = s3_server.filesystem()
        with pytest.raises(FileNotFoundError):
            getattr(fs, op)(f"{s3_bucket}/nope.tar")

    def test_wrong_secret(self, s3_server: SeaweedS3, s3_bucket: str) -> None:
        """The server checks credentials: a wrong secret raises PermissionError."""
        fs = s3_server.filesystem(secret="not-the-secret", skip_instance_cache=True)
        with pytest.raises(PermissionError):
            fs.ls(s3_bucket)
        with pytest.raises(PermissionError):
            fs.cat_file(f"{s3_bucket}/anything")


class TestStaticHTTP:
    def test_ls_and_glob(self, http_server: StaticHTTP, local_files: list[Path]) -> None:
        """The HTML index lets fsspec list and glob a folder."""
        folder = http_server.new_folder()
        urls = http_server.add({f"{folder}/{p.name}": p for p in local_files})
        fs = fsspec.filesystem("http")
        assert sorted(fs.ls(http_server.url(folder) + "/", detail=False)) == urls
        assert sorted(fs.glob(http_server.url(f"{folder}/train-*.tar"))) == urls[:2]

    def test_ranged_cat_file(self, http_server: StaticHTTP, blob: bytes) -> None:
        """A ranged read returns exactly the range, not the whole file."""
        url = http_server.put(f"{http_server.new_folder()}/train-000.tar", blob)
        fs = fsspec.filesystem("http")
        assert fs.cat_file(url, start=100, end=612) == blob[100:612]
        assert fs.cat_file(url, start=len(blob) - 10) == blob[-10:]
        assert fs.info(url)["size"] == len(blob)

    def test_missing_file(self, http_server: StaticHTTP) -> None:
        """A 404 raises FileNotFoundError and exists() is False."""
        fs = fsspec.filesystem("http")
        url = http_server.url("no/such/file.tar")
        with pytest.raises(FileNotFoundError):
            fs.cat_file(url)
        assert not fs.exists(url)
