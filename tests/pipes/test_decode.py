import io
import json
import pickle
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import shardpipes as sp
from shardpipes._core.decoders import decode_sample, default_decoders
from shardpipes._core.handlers import ShardpipesWarning
from shardpipes._core.images import decode_image
from shardpipes.errors import DecodeError, UnsafeDataError
from shardpipes.pipes.decode import SampleDecoder, decoder_table
from tests.conftest import write_tar

URL = "memory://train-000.tar"
DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3


def _image(fmt: str = "PNG", mode: str = "RGB", size: tuple[int, int] = (4, 2)) -> bytes:
    buffer = io.BytesIO()
    PIL.Image.new(mode, size, "red" if mode == "RGB" else 1).save(buffer, format=fmt)
    return buffer.getvalue()


def _npy(array: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _sample(key: str = "k", /, **fields: Any) -> dict[str, Any]:
    return {"__key__": key, "__url__": URL, **fields}


def _decode_one(sample: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = next(iter(SampleDecoder(IterableWrapper([sample]), *args, **kwargs)))
    return result


def _bomb_png() -> bytes:
    """A tiny PNG whose IHDR claims 40000 x 40000 pixels (over twice Pillow's limit)."""
    data = bytearray(_image("PNG"))
    data[16:24] = struct.pack(">II", 40_000, 40_000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


EXECUTED: list[str] = []


def _mark_executed(tag: str) -> str:
    EXECUTED.append(tag)
    return tag


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_mark_executed, ("ran",))


class TestImages:
    @pytest.mark.parametrize(
        ("ext", "fmt", "mode"),
        [
            ("jpg", "JPEG", "RGB"),
            ("jpeg", "JPEG", "RGB"),
            ("png", "PNG", "RGB"),
            ("ppm", "PPM", "RGB"),
            ("pgm", "PPM", "L"),
            ("pbm", "PPM", "1"),
            ("pnm", "PPM", "RGB"),
            ("bmp", "BMP", "RGB"),
            ("gif", "GIF", "RGB"),
            ("tif", "TIFF", "RGB"),
            ("tiff", "TIFF", "RGB"),
            ("webp", "WEBP", "RGB"),
        ],
    )
    def test_each_image_extension_decodes_to_rgb_pil(self, ext: str, fmt: str, mode: str) -> None:
        """Every image extension decodes to a loaded RGB PIL image of the right size."""
        image = _decode_one(_sample(**{ext: _image(fmt, mode)}))[ext]
        assert isinstance(image, PIL.Image.Image)
        assert (image.mode, image.size) == ("RGB", (4, 2))

    def test_pil_mode(self) -> None:
        """image='pil' gives an RGB PIL image with the pixels of the source."""
        image = _decode_one(_sample(png=_image()), "pil")["png"]
        assert image.getpixel((0, 0)) == (255, 0, 0)

    def test_numpy_mode(self) -> None:
        """image='numpy' gives a writable uint8 HWC array."""
        array = _decode_one(_sample(png=_image()), "numpy")["png"]
        assert isinstance(array, np.ndarray)
        assert (array.dtype, array.shape, array.flags.writeable) == (np.uint8, (2, 4, 3), True)
        assert array[0, 0].tolist() == [255, 0, 0]

    def test_torch_mode(self) -> None:
        """image='torch' gives a contiguous uint8 CHW tensor."""
        tensor = _decode_one(_sample(png=_image()), "torch")["png"]
        assert isinstance(tensor, torch.Tensor)
        assert (tensor.dtype, tuple(tensor.shape)) == (torch.uint8, (3, 2, 4))
        assert tensor.is_contiguous()
        assert tensor[:, 0, 0].tolist() == [255, 0, 0]

    def test_bytes_mode_leaves_images_encoded(self) -> None:
        """image='bytes' leaves image members as the original bytes."""
        data = _image()
        assert _decode_one(_sample(png=data, cls=b"1"), "bytes") == _sample(png=data, cls=1)

    def test_image_extension_with_other_format_content(self) -> None:
        """A '.jpg' member holding a PNG still decodes (content decides the format)."""
        assert _decode_one(_sample(jpg=_image("PNG")), "numpy")["jpg"].shape == (2, 4, 3)

    def test_eps_content_is_not_opened(self) -> None:
        """Non-raster formats such as EPS (run through Ghostscript) are not opened."""
        eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4 2\nshowpage\n"
        with pytest.raises(DecodeError, match="cannot identify"):
            _decode_one(_sample(jpg=eps))

    def test_decompression_bomb_is_refused(self) -> None:
        """A PNG claiming over twice MAX_IMAGE_PIXELS fails with DecodeError."""
        with pytest.raises(DecodeError, match="decompression bomb") as info:
            _decode_one(_sample(png=_bomb_png()))
        assert isinstance(info.value.__cause__, PIL.Image.DecompressionBombError)
        assert PIL.Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS

    def test_bomb_warning_becomes_error_when_warnings_are_errors(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Over the limit but under twice it: the warning, made an error, is a DecodeError."""
        monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 6)
        with pytest.raises(DecodeError, match="decompression bomb"):
            _decode_one(_sample(png=_image()))

    def test_bomb_warning_is_not_swallowed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Over the limit but under twice it: Pillow's warning reaches the caller."""
        monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 6)
        with pytest.warns(PIL.Image.DecompressionBombWarning):
            assert _decode_one(_sample(png=_image()))["png"].size == (4, 2)


def _torch_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _npz_bytes() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, a=np.arange(3), b=np.eye(2))
    return buffer.getvalue()


class TestDecoders:
    @pytest.mark.parametrize(
        ("ext", "data", "expected"),
        [
            ("cls", b" 7\n", 7),
            ("cls2", b"-2", -2),
            ("index", b"12\n", 12),
            ("label", b"\t3 ", 3),
            ("txt", "héllo".encode(), "héllo"),
            ("text", b"line\n", "line\n"),
            ("json", json.dumps({"a": [1, 2]}).encode(), {"a": [1, 2]}),
            ("bin", b"\x00\x01", b"\x00\x01"),
        ],
    )
    def test_scalar_decoders(self, ext: str, data: bytes, expected: Any) -> None:
        """Labels, text and json decode to Python objects; unknown extensions stay bytes."""
        decoded = _decode_one(_sample(**{ext: data}))[ext]
        assert (type(decoded), decoded) == (type(expected), expected)

    def test_npy(self) -> None:
        """An npy member decodes to the saved array."""
        array = np.arange(6, dtype=np.float32).reshape(2, 3)
        decoded = _decode_one(_sample(npy=_npy(array)))["npy"]
        np.testing.assert_array_equal(decoded, array)
        assert decoded.dtype == np.float32

    def test_npz(self) -> None:
        """An npz member decodes to a dict of arrays."""
        decoded = _decode_one(_sample(npz=_npz_bytes()))["npz"]
        assert sorted(decoded) == ["a", "b"]
        np.testing.assert_array_equal(decoded["b"], np.eye(2))

    @pytest.mark.parametrize("ext", ["pth", "pt"])
    def test_torch_files(self, ext: str) -> None:
        """Members pth and pt decode with torch.load (weights only)."""
        decoded = _decode_one(_sample(**{ext: _torch_bytes({"w": torch.ones(2)})}))[ext]
        assert torch.equal(decoded["w"], torch.ones(2))

    def test_pth_with_arbitrary_object_is_refused(self) -> None:
        """torch.load runs with weights_only=True: pickled code objects are refused."""
        EXECUTED.clear()
        with pytest.raises(UnsafeDataError, match=r"k\.pth"):
            _decode_one(_sample(pth=_torch_bytes(_Payload())))
        assert EXECUTED == []

    def test_npy_with_object_dtype_is_refused(self) -> None:
        """An npy of object dtype (which needs pickle) is refused as unsafe."""
        data = _npy(np.array([{"a": 1}], dtype=object))
        with pytest.raises(UnsafeDataError, match="Python objects"):
            _decode_one(_sample(npy=data))

    def test_last_dot_part_rule(self) -> None:
        """'seg.png' decodes as a PNG and 'a.cls' as a label."""
        decoded = _decode_one(_sample(**{"seg.png": _image(), "a.cls": b"4"}), "numpy")
        assert decoded["seg.png"].shape == (2, 4, 3)
        assert decoded["a.cls"] == 4

    def test_dunder_fields_are_never_decoded(self) -> None:
        """__key__ and __url__ stay as they are, even with a decoder of that name."""
        sample = {"__key__": b"k", "__url__": b"u"}
        assert _decode_one(sample, __key__=len, __url__=len) == sample

    def test_values_that_are_not_bytes_are_kept(self) -> None:
        """Already decoded values pass through unchanged."""
        assert _decode_one(_sample(cls=3, txt="x")) == _sample(cls=3, txt="x")

    def test_input_sample_is_not_modified(self) -> None:
        """Decoding builds a new dict and leaves the input sample alone."""
        sample = _sample(cls=b"1")
        assert _decode_one(sample) is not sample
        assert sample == _sample(cls=b"1")


class TestOverrides:
    def test_new_extension(self) -> None:
        """A keyword adds a decoder for a new extension."""
        assert _decode_one(_sample(seg=b"ab"), seg=bytes.upper)["seg"] == b"AB"

    def test_override_default(self) -> None:
        """A keyword overrides a default decoder."""
        assert _decode_one(_sample(cls=b"5"), cls=float)["cls"] == 5.0

    def test_full_extension_override_wins_over_last_part(self) -> None:
        """A 'seg.png' override applies to 'seg.png' only; 'png' keeps the default."""
        decoded = _decode_one(_sample(png=_image(), **{"seg.png": b"x"}), **{"seg.png": len})
        assert decoded["seg.png"] == 1
        assert isinstance(decoded["png"], PIL.Image.Image)

    def test_last_part_override_applies_to_compound_extension(self) -> None:
        """A 'png' override applies to 'seg.png' too."""
        assert _decode_one(_sample(**{"seg.png": b"xyz"}), png=len)["seg.png"] == 3

    @pytest.mark.parametrize(
        ("overrides", "field"),
        [({"cls": None}, "cls"), ({"png": None}, "seg.png"), ({"seg.png": None}, "seg.png")],
    )
    def test_none_leaves_bytes(self, overrides: dict[str, None], field: str) -> None:
        """A None decoder leaves the field as bytes."""
        data = b"1" if field == "cls" else _image()
        assert _decode_one(_sample(**{field: data}), **overrides)[field] == data

    def test_keywords_win_over_overrides_mapping(self) -> None:
        """**decoders take precedence over the overrides mapping."""
        decoded = _decode_one(
            _sample(seg=b"ab", txt=b"x"), overrides={"seg": len, "txt": len}, seg=bytes.upper
        )
        assert (decoded["seg"], decoded["txt"]) == (b"AB", 1)

    def test_none_for_full_extension_keeps_last_part_default(self) -> None:
        """Removing 'seg.png' leaves plain 'png' decoded."""
        decoded = _decode_one(_sample(png=_image()), **{"seg.png": None})
        assert isinstance(decoded["png"], PIL.Image.Image)


class TestPickle:
    @pytest.mark.parametrize("ext", ["pyd", "pickle", "pkl"])
    def test_refused_by_default(self, ext: str) -> None:
        """Pickle members raise UnsafeDataError naming url and member, without unpickling."""
        EXECUTED.clear()
        with pytest.raises(UnsafeDataError, match="executes arbitrary code") as info:
            _decode_one(_sample(**{ext: pickle.dumps(_Payload())}))
        assert EXECUTED == []
        assert (info.value.url, info.value.member, info.value.key) == (URL, f"k.{ext}", "k")
        assert "allow_pickle=True" in str(info.value)
        assert URL in str(info.value)

    @pytest.mark.parametrize("ext", ["pyd", "pickle", "pkl"])
    def test_allow_all(self, ext: str) -> None:
        """allow_pickle=True unpickles every pickle extension."""
        data = pickle.dumps({"x": [1, 2]})
        assert _decode_one(_sample(**{ext: data}), allow_pickle=True)[ext] == {"x": [1, 2]}

    def test_allow_per_extension(self) -> None:
        """allow_pickle=('pyd',) unpickles pyd and still refuses pkl."""
        data = pickle.dumps(5)
        assert _decode_one(_sample(pyd=data), allow_pickle=("pyd",))["pyd"] == 5
        with pytest.raises(UnsafeDataError, match="'pkl'"):
            _decode_one(_sample(pkl=data), allow_pickle=("pyd",))

    @pytest.mark.parametrize(
        ("allow_pickle", "error"),
        [(("npy",), ValueError), ("pkl", TypeError), (3, TypeError)],
    )
    def test_invalid_allow_pickle(self, allow_pickle: Any, error: type[Exception]) -> None:
        """allow_pickle takes a bool or pickle extensions only."""
        with pytest.raises(error, match="allow_pickle must"):
            SampleDecoder(IterableWrapper([]), allow_pickle=allow_pickle)


CORRUPT = [
    ("jpg", b"\xff\xd8\xff\xe0garbage"),
    ("png", _image()[:30]),
    ("json", b"{not json"),
    ("cls", b"seven"),
    ("txt", b"\xff\xfe\xfa"),
    ("npy", b"junk"),
    ("pth", b"junk"),
]


class TestErrors:
    @pytest.mark.parametrize(("ext", "data"), CORRUPT)
    def test_corrupt_member_names_url_and_member(self, ext: str, data: bytes) -> None:
        """A corrupt member raises DecodeError (a ValueError) naming url, member and key."""
        with pytest.raises(DecodeError) as info:
            _decode_one(_sample(**{ext: data}))
        error = info.value
        assert isinstance(error, ValueError)
        assert (error.url, error.member, error.key) == (URL, f"k.{ext}", "k")
        assert URL in str(error)
        assert f"'k.{ext}'" in str(error)
        assert error.__cause__ is not None

    def test_decode_sample_without_key_names_field(self) -> None:
        """Without a __key__ the member is the field name."""
        with pytest.raises(DecodeError) as info:
            decode_sample({"cls": b"x"}, default_decoders())
        assert (info.value.member, info.value.url) == ("cls", None)

    def test_invalid_image_mode(self) -> None:
        """An unknown image mode is a ValueError with the house wording."""
        expected = "image must be one of ('pil', 'numpy', 'torch', 'bytes') (got 'x')"
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            SampleDecoder(IterableWrapper([]), "x")

    def test_invalid_decoder(self) -> None:
        """A decoder that is neither callable nor None is a TypeError."""
        with pytest.raises(TypeError, match="decoder for 'seg' must be callable or None"):
            SampleDecoder(IterableWrapper([]), seg=3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="decoder for 'cls' must be callable or None"):
            SampleDecoder(IterableWrapper([]), overrides={"cls": "int"})  # type: ignore[dict-item]

    def test_invalid_handler(self) -> None:
        """An unknown handler name is a ValueError."""
        with pytest.raises(ValueError, match="handler must be"):
            SampleDecoder(IterableWrapper([]), handler="skip")


def _mixed() -> list[dict[str, Any]]:
    return [_sample("k0", cls=b"0"), _sample("k1", cls=b"bad"), _sample("k2", cls=b"2")]


class TestSampleDecoder:
    def test_warn_skips_with_warning(self) -> None:
        """handler='warn' skips the bad sample with a warning and yields the rest."""
        with pytest.warns(ShardpipesWarning, match=r"k1\.cls"):
            out = list(SampleDecoder(IterableWrapper(_mixed()), handler="warn"))
        assert [s["cls"] for s in out] == [0, 2]

    def test_ignore_skips_silently(self) -> None:
        """handler='ignore' skips the bad sample without a warning."""
        out = list(SampleDecoder(IterableWrapper(_mixed()), handler="ignore"))
        assert [s["cls"] for s in out] == [0, 2]

    def test_webdatasets_one_argument_handlers(self, tmp_path: Path) -> None:
        """wds.ignore_and_continue skips, wds.reraise_exception raises, under open_tar too.

        A handler of one argument is WebDataset's kind: called with the error alone.
        """
        import webdataset as wds

        out = list(SampleDecoder(IterableWrapper(_mixed()), handler=wds.ignore_and_continue))
        assert [s["cls"] for s in out] == [0, 2]
        with pytest.raises(DecodeError, match=r"k1\.cls"):
            list(SampleDecoder(IterableWrapper(_mixed()), handler=wds.reraise_exception))
        seen: list[BaseException] = []

        def record(exc: BaseException) -> bool:
            seen.append(exc)
            return True

        url = str(tmp_path / "bad.tar")
        members = [("a.jpg", b"not a jpeg"), ("a.cls", b"1"), ("b.cls", b"2")]
        write_tar(url, [*members, ("c.cls", b"x")])
        pipe = sp.list_shards(url).open_tar(handler=record).decode("pil", handler=record)
        assert [s["__key__"] for s in pipe] == ["b"]
        assert [type(e).__name__ for e in seen] == ["DecodeError", "DecodeError"]
        with pytest.raises(DecodeError, match=r"bad\.tar"):
            list(sp.list_shards(url).open_tar().decode("pil", handler=lambda exc: False))

    def test_raise_is_default(self) -> None:
        """The default handler raises on the bad sample."""
        with pytest.raises(DecodeError, match=r"k1\.cls"):
            list(SampleDecoder(IterableWrapper(_mixed())))

    @pytest.mark.parametrize(("skip", "expected"), [(True, [0, 2]), (False, None)])
    def test_callable_handler(self, skip: bool, expected: list[int] | None) -> None:
        """A callable handler gets the error and its context, and decides to skip or raise."""
        seen: list[tuple[BaseException, dict[str, Any]]] = []

        def handler(exc: BaseException, context: dict[str, Any]) -> bool:
            seen.append((exc, context))
            return skip

        pipe = SampleDecoder(IterableWrapper(_mixed()), handler=handler)
        if skip:
            assert [s["cls"] for s in pipe] == expected
        else:
            with pytest.raises(DecodeError):
                list(pipe)
        [(exc, context)] = seen
        assert isinstance(exc, DecodeError)
        assert context == {"stage": "decode", "url": URL, "member": "k1.cls", "key": "k1"}

    def test_functional_form_equals_constructor(self) -> None:
        """.decode(...) gives the same output as SampleDecoder(...)."""
        samples = [_sample(f"k{i}", cls=str(i).encode(), png=_image()) for i in range(3)]
        by_class = list(SampleDecoder(IterableWrapper(samples), "bytes", png=len))
        by_name = list(IterableWrapper(samples).decode("bytes", png=len))
        assert by_class == by_name
        assert by_class[1]["cls"] == 1
        assert by_class[1]["png"] == len(_image())

    def test_functional_form_overrides_cls(self) -> None:
        """.decode(overrides={"cls": ...}) overrides cls, which torch reserves as a keyword."""
        out = list(IterableWrapper([_sample(cls=b"2")]).decode(overrides={"cls": float}))
        assert out[0]["cls"] == 2.0

    def test_pickle_round_trip(self) -> None:
        """A pickled and unpickled pipe yields the same samples."""
        samples = [_sample(f"k{i}", cls=str(i).encode(), png=_image()) for i in range(2)]
        pipe = SampleDecoder(IterableWrapper(samples), "torch", allow_pickle=("pkl",))
        clone = pickle.loads(pickle.dumps(pipe))
        for a, b in zip(pipe, clone, strict=True):
            assert a["cls"] == b["cls"]
            assert torch.equal(a["png"], b["png"])

    def test_len(self) -> None:
        """len() is the source's length."""
        assert len(SampleDecoder(IterableWrapper(_mixed()))) == 3

    def test_len_without_source_length(self) -> None:
        """Without a source length, len() raises torch's TypeError naming the pipe, and why."""
        pipe = SampleDecoder(IterableWrapper(_mixed()).filter(bool))
        with pytest.raises(
            TypeError,
            match=r"^FilterIterDataPipe instance doesn't have valid length: shardpipes cannot count",
        ):
            len(pipe)

    def test_reiterating_gives_same_output(self) -> None:
        """Iterating twice gives the same samples."""
        pipe = SampleDecoder(IterableWrapper(_mixed()), handler="ignore")
        assert list(pipe) == list(pipe)

    def test_default_table_does_not_touch_max_image_pixels(self) -> None:
        """Building decoders leaves Pillow's decompression-bomb limit at its default."""
        default_decoders("pil", allow_pickle=True)
        assert PIL.Image.MAX_IMAGE_PIXELS == DEFAULT_MAX_PIXELS


def _reference(image: PIL.Image.Image, resize: int, crop: int) -> np.ndarray:
    """What torchvision's Resize(resize) + CenterCrop(crop) make of a PIL image."""
    width, height = image.size
    if width <= height:
        size = (resize, int(resize * height / width))
    else:
        size = (int(resize * width / height), resize)
    resized = image.convert("RGB").resize(size, PIL.Image.Resampling.BILINEAR)
    left, top = round((size[0] - crop) / 2), round((size[1] - crop) / 2)
    return np.asarray(resized.crop((left, top, left + crop, top + crop)))


def _photo(size: tuple[int, int], fmt: str) -> bytes:
    """A smooth gradient with some texture, like a photo to a resampler."""
    x = np.linspace(0, 255, size[0])[None, :, None]
    y = np.linspace(0, 255, size[1])[:, None, None]
    pixels = (x * 0.6 + y * 0.4 + 20 * np.sin(x / 7) * np.cos(y / 5)) * np.ones(3)
    out = io.BytesIO()
    PIL.Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format=fmt)
    return out.getvalue()


class TestResizeCrop:
    """decode(resize=, crop=) matches torchvision's Resize + CenterCrop, cheaper."""

    @pytest.mark.parametrize("size", [(470, 428), (300, 500), (256, 256), (333, 257)])
    def test_matches_resize_then_crop(self, size: tuple[int, int]) -> None:
        data = _photo(size, "PNG")
        got = decode_image(data, "numpy", resize=256, crop=224)
        want = _reference(PIL.Image.open(io.BytesIO(data)), 256, 224)
        assert got.shape == want.shape == (224, 224, 3)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 2

    def test_jpeg_draft_scale(self) -> None:
        """A JPEG 4x the target is decoded at a reduced scale, still close to the reference."""
        data = _photo((1200, 1000), "JPEG")
        got = decode_image(data, "numpy", resize=250, crop=224)
        want = _reference(PIL.Image.open(io.BytesIO(data)), 250, 224)
        assert got.shape == (224, 224, 3)
        assert np.abs(got.astype(int) - want.astype(int)).mean() < 3

    def test_only_resize_and_only_crop(self) -> None:
        data = _photo((60, 40), "PNG")
        assert decode_image(data, resize=20).size == (30, 20)
        cropped = decode_image(data, "numpy", crop=30)
        full = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
        assert (cropped == full[5:35, 15:45]).all()

    def test_crop_larger_than_the_image_pads_black(self) -> None:
        got = decode_image(_photo((20, 10), "PNG"), "numpy", crop=16)
        assert got.shape == (16, 16, 3)
        assert (got[0] == 0).all() and (got[-1] == 0).all() and got[8].any()

    def test_torch_mode_is_chw_contiguous(self) -> None:
        got = decoder_table("torch", resize=32, crop=32)["png"](_photo((50, 40), "PNG"))
        assert got.shape == (3, 32, 32) and got.is_contiguous() and got.dtype == torch.uint8

    def test_in_the_decode_pipe(self) -> None:
        sample = {"__key__": "a", "__url__": "memory://s.tar", "jpg": _photo((90, 70), "JPEG")}
        (out,) = IterableWrapper([sample]).decode("torch", resize=40, crop=36)
        assert tuple(out["jpg"].shape) == (3, 36, 36)

    @pytest.mark.parametrize("bad", [0, -3, 2.5, "256"])
    def test_bad_sizes(self, bad: Any) -> None:
        with pytest.raises(ValueError, match="must be a positive int"):
            IterableWrapper([]).decode(resize=bad)


def test_webdataset_image_specs_are_understood() -> None:
    """rgb8, torchrgb8 and pilrgb mean numpy, torch and pil; other specs say the way out."""
    from shardpipes._core.images import check_image_mode

    assert [check_image_mode(s) for s in ("rgb8", "torchrgb8", "pilrgb")] == [
        "numpy",
        "torch",
        "pil",
    ]
    with pytest.raises(ValueError, match=r"webdataset's 'l8' is not supported; .*map_fields"):
        check_image_mode("l8")
    with pytest.raises(ValueError, match=r"image must be one of"):
        check_image_mode("jpeg")


def test_errors_do_not_show_pillow_s_stream_object() -> None:
    """Pillow's 'cannot identify image file <_io.BytesIO object at 0x…>' (issue 24 §8)."""
    import shardpipes as sp

    sample = {"__key__": "a", "__url__": "memory://s.tar", "jpg": b"garbage, not a jpeg"}
    with pytest.raises(sp.DecodeError) as info:
        list(IterableWrapper([sample]).decode("pil"))
    assert "cannot identify image file" in str(info.value)
    assert "object at 0x" not in str(info.value)
