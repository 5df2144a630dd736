"""open_tar: samples out of shards on any filesystem."""

from __future__ import annotations

import gzip
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from shardpipes import ShardNotFoundError, ShardPart, ShardpipesWarning, TarFormatError, write_index
from shardpipes.pipes.shards import ShardLister
from tests.conftest import Dataset, write_tar


def keys(pipe: object) -> list[str]:
    return [s["__key__"] for s in pipe]  # type: ignore[attr-defined]


class TestTarOpener:
    def test_samples_have_key_url_and_bytes(self, make_shards: Callable[..., Dataset]) -> None:
        """Each sample is a dict of __key__, __url__ and bytes per extension."""
        data = make_shards(2, 3)
        samples = list(ShardLister(data.urls).open_tar())
        assert [s["__key__"] for s in samples] == data.keys
        first = samples[0]
        assert first["__url__"] == data.urls[0]
        assert first["cls"] == str(data.labels[first["__key__"]]).encode()
        assert isinstance(first["txt"], bytes)

    def test_gzip_shards(self, make_shards: Callable[..., Dataset]) -> None:
        """.tar.gz and .tgz shards are read as gzip streams."""
        data = make_shards(2, 4, suffix=".tar.gz")
        assert keys(ShardLister(data.urls).open_tar()) == data.keys
        assert gzip.decompress(Path(data.urls[0]).read_bytes())[:3] != b"\x1f\x8b"

    def test_gnu_tar_long_names(self, gnu_tar: Callable[[dict[str, bytes], str], str]) -> None:
        """GNU tar archives with ././@LongLink names, './' prefixes stripped."""
        long_key = "d" * 150 + "/sample"
        path = gnu_tar({f"{long_key}.txt": b"x", f"{long_key}.cls": b"1", "short.txt": b"y"}, "gnu")
        got = {s["__key__"]: s for s in ShardLister(path).open_tar()}
        assert sorted(got) == sorted([long_key, "short"])
        assert got[long_key]["cls"] == b"1"

    def test_memory_filesystem(self, memfs: fsspec.AbstractFileSystem) -> None:
        """Shards on memory:// stream like local ones."""
        write_tar("memory://m/a.tar", [("k.txt", b"1"), ("k.cls", b"2")])
        assert [s["cls"] for s in ShardLister("memory://m/*.tar").open_tar()] == [b"2"]

    def test_missing_shard_names_url(self, tmp_path: Path) -> None:
        """A missing shard raises ShardNotFoundError (a FileNotFoundError) naming it."""
        url = str(tmp_path / "gone.tar")
        with pytest.raises(ShardNotFoundError, match=r"gone\.tar") as info:
            list(IterableWrapper([url]).open_tar())
        assert isinstance(info.value, FileNotFoundError)

    def test_corrupt_shard_raises_with_url(self, make_shards: Callable[..., Dataset]) -> None:
        """A truncated shard raises TarFormatError naming the shard and member."""
        data = make_shards(2, 5)
        blob = Path(data.urls[0]).read_bytes()
        Path(data.urls[0]).write_bytes(blob[: len(blob) // 2 + 100])
        with pytest.raises(TarFormatError, match=data.urls[0]):
            list(ShardLister(data.urls).open_tar())

    def test_corrupt_shard_skipped_with_warn(self, make_shards: Callable[..., Dataset]) -> None:
        """handler='warn' keeps the samples before the damage and the other shards."""
        data = make_shards(2, 5)
        blob = Path(data.urls[0]).read_bytes()
        Path(data.urls[0]).write_bytes(blob[: 3 * 2048 + 700])  # cut inside sample 3
        with pytest.warns(ShardpipesWarning, match="truncated"):
            got = keys(ShardLister(data.urls).open_tar(handler="warn"))
        assert got == data.keys[:3] + data.keys[5:]

    def test_callable_handler_gets_context(self, tmp_path: Path) -> None:
        """A callable handler receives the error and the shard URL."""
        seen = []
        url = str(tmp_path / "missing.tar")
        pipe = IterableWrapper([url]).open_tar(
            handler=lambda exc, ctx: bool(seen.append(ctx["url"])) or True
        )
        assert list(pipe) == []
        assert seen == [url]

    @pytest.mark.parametrize(("handler", "error"), [("skip", ValueError), (3, TypeError)])
    def test_bad_handler(self, handler: object, error: type[Exception]) -> None:
        """Unknown handlers are refused at construction."""
        with pytest.raises(error, match="handler must be"):
            IterableWrapper([]).open_tar(handler=handler)


class TestParts:
    @pytest.mark.parametrize("index", [False, True])
    @pytest.mark.parametrize("parts", [1, 2, 3, 7])
    def test_parts_cover_the_shard(
        self, make_shards: Callable[..., Dataset], index: bool, parts: int
    ) -> None:
        """The parts of one shard yield each sample once, streaming or by index."""
        data = make_shards(1, 11)
        got = []
        for k in range(parts):
            got += keys(IterableWrapper([ShardPart(data.urls[0], k, parts)]).open_tar(index=index))
        assert sorted(got) == data.keys

    def test_sidecar_index_used(self, make_shards: Callable[..., Dataset]) -> None:
        """With a sidecar, a part reads only its block (contiguous keys)."""
        data = make_shards(1, 10)
        idx, count = write_index(data.urls[0])
        assert count == 10 and Path(idx).exists()
        got = keys(IterableWrapper([ShardPart(data.urls[0], 1, 2)]).open_tar(index=True))
        assert got == data.keys[5:]

    def test_stale_index_refused(self, make_shards: Callable[..., Dataset]) -> None:
        """An index made for another version of the shard is refused."""
        data = make_shards(2, 4)
        write_index(data.urls[0])
        shutil.copy(data.urls[1] + "", data.urls[0])
        with tarfile.open(data.urls[0], "a") as tar:
            tar.add(data.urls[1], arcname="extra.bin")
        from shardpipes import ShardIndexError

        with pytest.raises(ShardIndexError, match="stale"):
            list(IterableWrapper([ShardPart(data.urls[0], 0, 2)]).open_tar(index=True))

    def test_gzip_part_falls_back_to_streaming(self, make_shards: Callable[..., Dataset]) -> None:
        """A compressed shard cannot be indexed; its parts are streamed instead."""
        data = make_shards(1, 9, suffix=".tgz")
        got = [
            k
            for p in range(3)
            for k in keys(IterableWrapper([ShardPart(data.urls[0], p, 3)]).open_tar(index=True))
        ]
        assert sorted(got) == data.keys


def test_file_opener_output_is_read(make_shards: Callable[..., Dataset]) -> None:
    """Torch's FileLister -> FileOpener pairs (URL, stream), as torchdata 0.9 users chain them."""
    from torch.utils.data import DataLoader
    from torch.utils.data.datapipes.iter import FileLister, FileOpener, IterableWrapper

    data = make_shards(4, 5)
    folder = str(Path(data.urls[0]).parent)
    pipe = FileOpener(FileLister(folder, "*.tar").sharding_filter(), mode="b").open_tar()
    keys = [s["__key__"] for s in DataLoader(pipe, batch_size=None, num_workers=2)]
    assert sorted(keys) == sorted(data.keys)
    with pytest.raises(TypeError, match=r"open_tar reads shard URLs .* got a int: 3"):
        list(IterableWrapper([3]).open_tar())
