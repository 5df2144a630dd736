"""ShardStream: the fused engine gives what the chained pipes give, stage for stage."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import PIL.Image
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import shardpipes as sp
from shardpipes.pipes.stream import ShardStream
from tests.conftest import Dataset, write_tar


def _stream(data: Dataset, **kwargs: Any) -> ShardStream:
    return ShardStream(sp.list_shards(data.urls).split_shards(shuffle=False), **kwargs)


def _chain(data: Dataset) -> Any:
    return sp.list_shards(data.urls).split_shards(shuffle=False).open_tar()


@pytest.mark.parametrize("image", ["pil", "numpy", "torch", "bytes"])
def test_same_samples_as_the_chain(make_shards: Callable[..., Dataset], image: str) -> None:
    data = make_shards(3, 4, images=True)
    fused = list(_stream(data, image=image))
    chained = list(_chain(data).decode(image))
    assert [s["__key__"] for s in fused] == [s["__key__"] for s in chained] == data.keys
    for a, b in zip(fused, chained, strict=True):
        assert a["cls"] == b["cls"]
        if image == "pil":
            assert a["png"].tobytes() == b["png"].tobytes()
        elif image != "bytes":
            assert (a["png"] == b["png"]).all()


def test_same_tuples_and_batches_as_the_chain(make_shards: Callable[..., Dataset]) -> None:
    data = make_shards(2, 5, images=True)
    fused = list(_stream(data, fields=("png", "cls"), image="torch", batch_size=3))
    chained = list(
        _chain(data).decode("torch").to_tuple("png", "cls").batch(3).collate(sp.collate_samples)
    )
    assert len(fused) == len(chained) == 4
    for a, b in zip(fused, chained, strict=True):
        assert type(a) is type(b) is sp.Batch
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_transform_applies_to_the_first_field(make_shards: Callable[..., Dataset]) -> None:
    data = make_shards(1, 3, images=True)
    got = list(_stream(data, fields=("png", "cls"), transform=lambda img: img.size))
    assert got == [((12, 10), data.labels[k]) for k in data.keys]


def test_only_the_picked_fields_are_decoded(tmp_path: Any) -> None:
    """A member that would fail to decode is never decoded when it is not picked."""
    url = str(tmp_path / "s.tar")
    write_tar(url, [("a.cls", b"1"), ("a.json", b"{not json"), ("b.cls", b"2")])
    data = Dataset([url])
    assert list(_stream(data, fields=("cls",))) == [(1,), (2,)]
    with pytest.raises(sp.DecodeError, match=r"a\.json"):
        list(_stream(data))


def test_shuffle_buffer_is_seeded_and_complete(make_shards: Callable[..., Dataset]) -> None:
    data = make_shards(2, 10)

    def keys(seed: int) -> list[str]:
        pipe = _stream(data, fields=("__key__",), buffer_size=6).set_seed(seed)
        return [k for (k,) in pipe]

    assert keys(1) == keys(1) != keys(2)
    assert sorted(keys(1)) == sorted(data.keys)
    assert keys(1) != data.keys


@pytest.mark.parametrize("handler", ["warn", "ignore"])
def test_handler_skips_bad_samples(tmp_path: Any, handler: str) -> None:
    url = str(tmp_path / "s.tar")
    write_tar(url, [("a.cls", b"x"), ("b.cls", b"2"), ("c.txt", b"no label"), ("d.cls", b"4")])
    pipe = _stream(Dataset([url]), fields=("cls", "__key__"), handler=handler)
    if handler == "warn":
        with pytest.warns(sp.ShardpipesWarning) as caught:
            got = list(pipe)
        messages = " ".join(str(w.message) for w in caught)
        assert "a.cls" in messages and "'c'" in messages
    else:
        got = list(pipe)
    assert got == [(2, "b"), (4, "d")]


def test_errors_raise_by_default(tmp_path: Any) -> None:
    url = str(tmp_path / "s.tar")
    write_tar(url, [("a.cls", b"1"), ("b.txt", b"?")])
    with pytest.raises(sp.MissingFieldError, match="no field 'cls'"):
        list(_stream(Dataset([url]), fields=("cls",)))


def test_resize_and_crop(tmp_path: Any) -> None:
    png = io.BytesIO()
    PIL.Image.new("RGB", (40, 20), "blue").save(png, format="PNG")
    url = str(tmp_path / "s.tar")
    write_tar(url, [("a.png", png.getvalue()), ("a.cls", b"0")])
    ((image, label),) = list(
        _stream(Dataset([url]), fields=("png", "cls"), image="torch", resize=10, crop=8)
    )
    assert tuple(image.shape) == (3, 8, 8) and label == 0
    assert image[2].float().mean() > 250


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"batch_size": 0}, ValueError),
        ({"image": "jpeg"}, ValueError),
        ({"resize": -1}, ValueError),
        ({"fields": (3,)}, TypeError),
        ({"handler": "skip"}, ValueError),
        ({"threads": -1}, ValueError),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        ShardStream(IterableWrapper(["x.tar"]), **kwargs)


@pytest.mark.parametrize("batch_size", [None, 3])
def test_threads_give_the_same_output_in_order(
    make_shards: Callable[..., Dataset], batch_size: int | None
) -> None:
    data = make_shards(3, 7, images=True)
    kwargs: dict[str, Any] = {"fields": ("png", "__key__"), "image": "torch"}
    plain = list(_stream(data, batch_size=batch_size, **kwargs))
    threaded = list(_stream(data, batch_size=batch_size, threads=3, **kwargs))
    assert len(plain) == len(threaded) > 0
    for a, b in zip(plain, threaded, strict=True):
        assert torch.equal(a[0], b[0]) and a[1] == b[1]


def test_threads_keep_the_handler(tmp_path: Any) -> None:
    url = str(tmp_path / "s.tar")
    write_tar(url, [(f"{i}.cls", b"x" if i % 3 == 0 else str(i).encode()) for i in range(10)])
    pipe = _stream(Dataset([url]), fields=("cls",), handler="ignore", threads=2, batch_size=4)
    batches = list(pipe)
    assert [len(b[0]) for b in batches] == [4, 2]
    assert [v for b in batches for v in b[0].tolist()] == [1, 2, 4, 5, 7, 8]
    with pytest.raises(sp.DecodeError, match=r"0\.cls"):
        list(_stream(Dataset([url]), fields=("cls",), threads=2))
