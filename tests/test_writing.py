"""``sp.ShardWriter`` and ``sp.TarWriter`` (issue 15 §1): values encoded by extension.

Shards written here are read back by shardpipes and by webdataset 1.0.2, field by field;
the same samples give the same bytes; bad input is a clear error and leaves nothing
half-written.
"""

from __future__ import annotations

import gc
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import pytest
import torch

import shardpipes as sp


def samples() -> list[dict[str, Any]]:
    """Samples of every kind of value the writer encodes (images of mixed sizes and modes)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(5):
        h, w = 20 + 7 * i, 31 - 3 * i
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out.append({
            "__key__": f"sample{i:03d}",
            "png": PIL.Image.fromarray(rgb),  # RGB PIL image: lossless
            "gray.png": rng.integers(0, 256, (h, w), dtype=np.uint8),  # a uint8 HW array
            "chw.png": torch.from_numpy(rgb).permute(2, 0, 1).contiguous(),  # a CHW tensor
            "jpg": PIL.Image.fromarray(rgb).convert("L"),
            "cls": i,
            "txt": f"caption {i} — ünïcode",
            "json": {"id": i, "tags": ["a", "b"][: i % 3]},
            "npy": rng.standard_normal((3, i + 1)).astype(np.float32),
            "pth": {"emb": torch.arange(4, dtype=torch.float32) * i},
            "bin": bytes([i]) * 10,
            "txt.gz": f"compressed {i}",
            "ten": [rng.standard_normal((2, i + 1)).astype(np.float32), np.arange(i + 3, dtype=np.uint8)],
            "mp": {"id": i, "values": [1.5, "x", None]},
        })  # fmt: skip
    return out


def write(pattern: str, **options: Any) -> list[sp.ShardWriter]:
    with sp.ShardWriter(pattern, **options) as sink:
        for sample in samples():
            sink.write(sample)
    return sink.shards


def test_written_shards_read_back_in_shardpipes(tmp_path: Path) -> None:
    shards = write(str(tmp_path / "w-%03d.tar"), maxcount=2)
    assert [s.samples for s in shards] == [2, 2, 1]
    pipe = sp.list_shards(str(tmp_path / "w-*.tar")).open_tar().decode("numpy")
    got = {s["__key__"]: s for s in pipe}
    for want in samples():
        back = got[want["__key__"]]
        assert np.array_equal(back["png"], np.asarray(want["png"]))
        assert np.array_equal(back["chw.png"], want["chw.png"].permute(1, 2, 0).numpy())
        assert back["gray.png"].shape[:2] == want["gray.png"].shape  # decoded to RGB
        assert back["jpg"].shape[:2] == want["gray.png"].shape
        assert back["cls"] == want["cls"]
        assert back["txt"] == want["txt"]
        assert back["json"] == want["json"]
        assert np.array_equal(back["npy"], want["npy"])
        assert torch.equal(back["pth"]["emb"], want["pth"]["emb"])
        assert back["bin"] == want["bin"]
        assert back["txt.gz"] == want["txt.gz"]  # gunzipped, then decoded as txt
        assert_arrays(back["ten"], want["ten"])
        assert back["mp"] == want["mp"]


def assert_arrays(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for x, y in zip(got, want, strict=True):
        assert x.dtype == y.dtype
        assert np.array_equal(x, y)


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # webdataset leaves its files open
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_tar_gz_name_is_written_compressed_as_webdataset_does(tmp_path: Path) -> None:
    """``.tar.gz``: gzip bytes (no sidecar: ranged reads need a plain tar), read by both."""
    wds = pytest.importorskip("webdataset")
    shards = write(str(tmp_path / "w-%03d.tar.gz"), maxcount=2)
    assert len(shards) == 3
    for shard in shards:
        assert Path(shard.url).read_bytes()[:2] == b"\x1f\x8b"
        assert not Path(shard.url + ".idx").exists()
    with sp.TarWriter(str(tmp_path / "one.tgz")) as sink:
        sink.write(samples()[0])
    assert (tmp_path / "one.tgz").read_bytes()[:2] == b"\x1f\x8b"
    keys = [s["__key__"] for s in samples()]
    ours = sp.list_shards([s.url for s in shards]).split_shards(shuffle=False).open_tar()
    assert [s["__key__"] for s in ours] == keys
    theirs = wds.WebDataset([s.url for s in shards], shardshuffle=False)
    assert [s["__key__"] for s in theirs] == keys


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # webdataset leaves its files open
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_written_shards_read_back_in_webdataset(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    shards = write(str(tmp_path / "w-%03d.tar"), maxcount=3)
    dataset = wds.WebDataset([s.url for s in shards], shardshuffle=False).decode("rgb8")
    got = {s["__key__"]: s for s in dataset}
    assert len(got) == 5
    for want in samples():
        back = got[want["__key__"]]
        assert np.array_equal(back["png"], np.asarray(want["png"]))
        assert back["cls"] == want["cls"]
        assert back["txt"] == want["txt"]
        assert back["json"] == want["json"]
        assert np.array_equal(back["npy"], want["npy"])
        assert torch.equal(back["pth"]["emb"], want["pth"]["emb"])
        assert back["txt.gz"] == want["txt.gz"]  # webdataset decompresses .gz itself
        assert_arrays(back["ten"], want["ten"])
        assert back["mp"] == want["mp"]
    del dataset, got
    gc.collect()  # its open files' warnings here, under this test's filters


def test_the_same_samples_give_the_same_bytes(tmp_path: Path) -> None:
    one = write(str(tmp_path / "a-%03d.tar"), maxcount=2)
    two = write(str(tmp_path / "b-%03d.tar"), maxcount=2)
    for x, y in zip(one, two, strict=True):
        assert Path(x.url).read_bytes() == Path(y.url).read_bytes()


def test_limits_and_one_archive(tmp_path: Path) -> None:
    for maxsize in (60_000, "60k"):  # a number, or a text as the command takes
        sizes = [s.size for s in write(str(tmp_path / f"w{maxsize}-%03d.tar"), maxsize=maxsize)]
        assert len(sizes) > 1
        assert all(size <= 60_000 for size in sizes)
    with sp.TarWriter(str(tmp_path / "one.tar")) as sink:
        for sample in samples():
            sink.write(sample)
    assert sink.count == 5
    keys = [s["__key__"] for s in sp.list_shards(str(tmp_path / "one.tar")).open_tar()]
    assert keys == [f"sample{i:03d}" for i in range(5)]


def test_any_fsspec_url(memfs: Any) -> None:
    shards = write("memory://written/w-%03d.tar", maxcount=4)
    assert [s.url for s in shards] == ["memory://written/w-000.tar", "memory://written/w-001.tar"]
    keys = [s["__key__"] for s in sp.list_shards("memory://written/w-*.tar").open_tar()]
    assert len(keys) == 5


def test_pickle_only_under_its_names(tmp_path: Path) -> None:
    with sp.TarWriter(str(tmp_path / "p.tar")) as sink:
        sink.write({"__key__": "a", "pyd": {"x": (1, 2)}})
    member = next(iter(sp.list_shards(str(tmp_path / "p.tar")).open_tar()))
    assert pickle.loads(member["pyd"]) == {"x": (1, 2)}  # written by this test
    with (
        sp.TarWriter(str(tmp_path / "q.tar")) as sink,
        pytest.raises(
            TypeError, match=r"^sample 'a' field 'bin': cannot store a dict under extension 'bin'"
        ),
    ):
        sink.write({"__key__": "a", "bin": {"x": 1}})


@pytest.mark.parametrize(
    ("sample", "error", "match"),
    [
        ({"__key__": "k", "jpg": 3}, TypeError, r"^sample 'k' field 'jpg': cannot store a int .*PIL image"),
        ({"__key__": "k", "cls": 1.5}, TypeError, r"^sample 'k' field 'cls': cannot store a float .*an int"),
        ({"__key__": "k", "cls": True}, TypeError, r"field 'cls': cannot store a bool"),
        ({"__key__": "k", "npy": [1, 2]}, TypeError, r"field 'npy': cannot store a list .*numpy array"),
        ({"__key__": "k", "png": np.zeros((2, 2, 2), np.uint8)}, TypeError, r"^sample 'k' field 'png': an image array must be"),
        ({"__key__": "../k", "txt": "x"}, ValueError, r"key"),
        ({"txt": "x"}, TypeError, r"__key__ must be a string \(got None\)"),
    ],
)  # fmt: skip
def test_bad_values_name_the_sample_and_field(
    tmp_path: Path, sample: dict[str, Any], error: type[Exception], match: str
) -> None:
    with sp.ShardWriter(str(tmp_path / "w-%03d.tar")) as sink, pytest.raises(error, match=match):
        sink.write(sample)


def test_an_error_leaves_nothing_half_written(tmp_path: Path) -> None:
    """The with block raises during shard 2: shard 1 stays whole, shard 2 is removed."""

    def stopped() -> None:
        with sp.ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=2) as sink:
            for sample in samples()[:3]:
                sink.write(sample)
            msg = "stop"
            raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="stop"):
        stopped()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w-000.tar", "w-000.tar.idx"]
    keys = [s["__key__"] for s in sp.list_shards(str(tmp_path / "w-000.tar")).open_tar()]
    assert keys == ["sample000", "sample001"]
    with pytest.raises(ValueError, match="exactly one integer field"):
        sp.ShardWriter(str(tmp_path / "no-field.tar"))
    with pytest.raises(ValueError, match="maxcount must be a positive number"):
        sp.ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=0)


def test_encoded_images_are_what_pillow_reads(tmp_path: Path) -> None:
    """A uint8 tensor CHW, an HWC array with alpha, a 1-channel HWC array."""
    rgba = np.random.default_rng(1).integers(0, 256, (9, 7, 4), dtype=np.uint8)
    with sp.TarWriter(str(tmp_path / "i.tar")) as sink:
        sink.write({"__key__": "a", "png": rgba, "one.png": rgba[:, :, :1], "webp": rgba[:, :, :3]})
    raw = next(iter(sp.list_shards(str(tmp_path / "i.tar")).open_tar()))
    assert np.array_equal(np.asarray(PIL.Image.open(io.BytesIO(raw["png"]))), rgba)
    assert np.array_equal(np.asarray(PIL.Image.open(io.BytesIO(raw["one.png"]))), rgba[:, :, 0])
    assert PIL.Image.open(io.BytesIO(raw["webp"])).size == (7, 9)


def test_gzipped_members_decode_by_their_inner_extension(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x.json.gz`` is gunzipped then read as json; one that inflates too far is refused."""
    from shardpipes._core import decoders

    with sp.TarWriter(str(tmp_path / "g.tar")) as sink:
        sink.write({"__key__": "a", "json.gz": {"n": 1}, "cls.gz": 7, "bin.gz": b"\0" * 5000})
    back = next(iter(sp.list_shards(str(tmp_path / "g.tar")).open_tar().decode()))
    assert (back["json.gz"], back["cls.gz"], back["bin.gz"]) == ({"n": 1}, 7, b"\0" * 5000)
    monkeypatch.setattr(decoders, "GUNZIP_LIMIT", 4096)
    pipe = sp.list_shards(str(tmp_path / "g.tar")).open_tar().decode()
    with pytest.raises(sp.DecodeError, match=r"bin\.gz.*more than 4096 bytes"):
        list(pipe)


def test_closed_empty_and_webdataset_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From a new-user trial: writing after close, an empty archive, start_shard/post/verbose."""
    one = sp.TarWriter(str(tmp_path / "empty.tar"))
    one.close()
    assert (tmp_path / "empty.tar").stat().st_size == 1024  # a valid, empty tar
    assert list(sp.list_shards(str(tmp_path / "empty.tar")).open_tar()) == []
    with pytest.raises(ValueError, match=r"empty\.tar: the writer is closed"):
        one.write({"__key__": "a", "txt": "x"})
    posted: list[str] = []
    with sp.ShardWriter(
        str(tmp_path / "w-%02d.tar"), maxcount=2, start_shard=5, post=posted.append, verbose=1
    ) as sink:
        for sample in samples()[:3]:
            sink.write(sample)
    assert posted == [str(tmp_path / "w-05.tar"), str(tmp_path / "w-06.tar")]
    assert f"# wrote {tmp_path / 'w-05.tar'}: 2 samples" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the writer is closed"):
        sink.write(samples()[3])


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("jpg", "hello", r"a str under 'jpg', a binary format: it takes a PIL image"),
        ("npy", "1,2", r"a str under 'npy', a binary format: it takes a numpy array"),
        ("jpg", PIL.Image.new("RGBA", (4, 4)), r"RGBA image under a JPEG extension: .*png or webp"),
        ("png", np.full((4, 4), 2.0, np.float32), r"values in \[0, 1\] \(got 2.0\.\.2.0\)"),
        ("jpg", np.zeros((4, 4), np.uint16), r"must be uint8, or float in \[0, 1\] \(got uint16\)"),
        ("png", np.zeros((4, 4, 3), np.uint16), r"\(got uint16\); one channel of uint16 is wr"),
        ("png", np.zeros((4, 4), np.int32), r"must be uint8, or float in \[0, 1\] \(got int32\)"),
    ],
)  # fmt: skip
def test_values_a_format_cannot_hold(tmp_path: Path, field: str, value: Any, match: str) -> None:
    with sp.TarWriter(str(tmp_path / "x.tar")) as sink, pytest.raises(TypeError, match=match):
        sink.write({"__key__": "k", field: value})


def test_sixteen_bit_depth_maps_under_png_and_tiff(tmp_path: Path) -> None:
    """One channel of uint16 (HW, HW1, a 1HW tensor) is written 16-bit, read back exactly."""
    depth = (np.arange(12 * 10, dtype=np.uint16).reshape(12, 10) * 500).astype(np.uint16)
    with sp.TarWriter(str(tmp_path / "d.tar")) as sink:
        sink.write({"__key__": "a", "png": depth, "tiff": depth[:, :, None]})
        sink.write({"__key__": "b", "png": torch.from_numpy(depth.astype(np.int32))[None]
                    .to(torch.uint16)})  # fmt: skip
    for raw in sp.list_shards(str(tmp_path / "d.tar")).open_tar():
        for field in ("png", "tiff"):
            if field in raw:
                image = PIL.Image.open(io.BytesIO(raw[field]))
                assert image.mode.startswith("I;16") and np.array_equal(np.asarray(image), depth)


def test_float_images_and_pickled_text(tmp_path: Path) -> None:
    gray = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    with sp.TarWriter(str(tmp_path / "f.tar")) as sink:
        sink.write({"__key__": "k", "png": gray, "pyd": "text, pickled"})
    raw = next(iter(sp.list_shards(str(tmp_path / "f.tar")).open_tar()))
    assert np.array_equal(np.asarray(PIL.Image.open(io.BytesIO(raw["png"]))), (gray * 255).round())
    assert pickle.loads(raw["pyd"]) == "text, pickled"  # written by this test
    with pytest.raises(ValueError, match=r"the key would come back as 'img'; .*'img_0001'"):
        sp.TarWriter(str(tmp_path / "d.tar")).write({"__key__": "img.0001", "txt": "x"})


def test_a_member_that_is_not_its_format_says_so(tmp_path: Path) -> None:
    """Bytes under npy/pth that are no such file: 'not an .npy array', not 'unpickles'."""
    for name, field, data in (("n", "npy", b"1,2,3"), ("p", "pth", b"hello")):
        with sp.TarWriter(str(tmp_path / f"{name}.tar")) as sink:
            sink.write({"__key__": "k", field: data})
    decoded = sp.list_shards(str(tmp_path / "n.tar")).open_tar().decode()
    with pytest.raises(sp.DecodeError, match=r"not an \.npy array"):
        list(decoded)
    decoded = sp.list_shards(str(tmp_path / "p.tar")).open_tar().decode()
    with pytest.raises(sp.DecodeError, match=r"not a torch\.save file"):
        list(decoded)


def test_image_tensors_chw_or_hwc(tmp_path: Path) -> None:
    """A tensor is CHW when its first side is 1, 3 or 4 channels, else HWC.

    An error shows the shape given.
    """
    rgb = np.arange(8 * 6 * 3, dtype=np.uint8).reshape(8, 6, 3)
    url = str(tmp_path / "t.tar")
    with sp.TarWriter(url) as sink:
        sink.write({"__key__": "chw", "png": torch.from_numpy(rgb).permute(2, 0, 1)})
        sink.write({"__key__": "hwc", "png": torch.from_numpy(rgb)})
        with pytest.raises(TypeError, match=r"\(got \(8, 6, 5\)\)"):
            sink.write({"__key__": "bad", "png": torch.zeros(8, 6, 5, dtype=torch.uint8)})
    back = {s["__key__"]: s["png"] for s in sp.list_shards(url).open_tar().decode("numpy")}
    assert np.array_equal(back["chw"], rgb)
    assert np.array_equal(back["hwc"], rgb)


def test_field_stages_are_exported() -> None:
    assert sp.FieldRenamer.__name__ == "FieldRenamer"
    assert sp.FieldMapper.__name__ == "FieldMapper"


def test_sidecars_are_written_by_default(tmp_path: Path) -> None:
    """Each shard's URL.idx is written beside it: len() is exact on day one (issue 24 §5)."""
    from torch.utils.data import DataLoader

    with sp.ShardWriter(str(tmp_path / "w-%03d.tar"), maxcount=3) as sink:
        for sample in samples():  # 5, in shards of 3 and 2
            sink.write(sample)
    urls = [shard.url for shard in sink.shards]
    for url in urls:
        assert sp.read_index(url) == sp.build_index(url)
    pipe = sp.recipes.tar_shards(str(tmp_path / "w-*.tar"), fields=("__key__",), batch_size=2)
    loader = DataLoader(pipe, batch_size=None, num_workers=0)
    assert len(loader) == sum(1 for _ in loader) == 3  # 5 samples in batches of 2
    with sp.TarWriter(str(tmp_path / "one.tar")) as one:
        one.write(samples()[0])
    assert sp.read_index(str(tmp_path / "one.tar")) == sp.build_index(str(tmp_path / "one.tar"))
    with sp.ShardWriter(str(tmp_path / "x-%03d.tar"), index=False) as bare:
        bare.write(samples()[0])
    assert sorted(p.name for p in tmp_path.glob("x-*")) == ["x-000.tar"]
