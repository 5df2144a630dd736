"""``.ten`` (webdataset's tenbin) and ``.mp`` (msgpack) members (issue 15 §3).

The same bytes as webdataset's encoder; shards written by webdataset's own ``TarWriter``
decode; damaged or hostile tenbin is a ``DecodeError`` naming the shard and member.
"""

from __future__ import annotations

import gc
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shardpipes as sp
from shardpipes._core.tenbin import MAGIC, decode_tenbin, encode_tenbin
from shardpipes.errors import DecodeError

ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array([[-1, 2]], dtype=np.int64),
    np.zeros((0, 3), dtype=np.uint8),
    np.ones((2, 2, 2), dtype=np.float16),
    np.arange(5, dtype=np.int16),
]


def test_the_same_bytes_as_webdataset_both_ways() -> None:
    tenbin = pytest.importorskip("webdataset.tenbin")
    ours = encode_tenbin(ARRAYS)
    assert ours == bytes(tenbin.encode_buffer(ARRAYS))
    for got, want in zip(tenbin.decode_buffer(ours), ARRAYS, strict=True):
        assert np.array_equal(got, want)
    back = decode_tenbin(bytes(tenbin.encode_buffer(ARRAYS)))
    assert [a.dtype for a in back] == [a.dtype for a in ARRAYS]
    assert all(np.array_equal(a, b) for a, b in zip(back, ARRAYS, strict=True))
    assert all(a.flags.writeable for a in back)  # torch.from_numpy takes them as they are


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_shards_written_by_webdataset_decode(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    url = str(tmp_path / "wds-000.tar")
    with wds.TarWriter(url) as sink:
        for i in range(3):
            sink.write({
                "__key__": f"k{i}",
                "ten": [np.full((2, i + 1), i, dtype=np.float32)],
                "mp": {"id": i, "tags": ["a", "b"]},
                "cls": i,
            })  # fmt: skip
    gc.collect()
    got = list(sp.list_shards(url).open_tar().decode())
    assert [s["mp"] for s in got] == [{"id": i, "tags": ["a", "b"]} for i in range(3)]
    for i, sample in enumerate(got):
        (array,) = sample["ten"]
        assert array.shape == (2, i + 1)
        assert (array == i).all()


def header(code: str, shape: tuple[int, ...], *, ndim: int | None = None) -> bytes:
    fields = [code, "", len(shape) if ndim is None else ndim, *shape]
    return b"".join(
        f.encode().ljust(8, b"\0") if isinstance(f, str) else struct.pack("<q", f) for f in fields
    )


def chunk(body: bytes, *, size: int | None = None) -> bytes:
    length = len(body) if size is None else size
    return MAGIC + struct.pack("<q", length) + body + b"\0" * (-len(body) % 64)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"~TenBox~" + bytes(8), "no ~TenBin~ mark"),
        (MAGIC + b"\x01\x02", "cut short"),
        (chunk(b"x" * 10, size=1 << 40), "says 1099511627776 bytes"),
        (chunk(b"x" * 10, size=-5), "says -5 bytes"),
        (chunk(header("f4", (2,))), "a header without its data"),
        (chunk(header("c8", (2,))) + chunk(bytes(16)), "unknown type 'c8'"),
        (chunk(header("f4", (2,), ndim=40)) + chunk(bytes(8)), "40 dimensions"),
        (chunk(header("f4", (2,), ndim=3)) + chunk(bytes(8)), "3 dimensions in a header of 1"),
        # a shape that claims far more than the member holds: refused, nothing allocated
        (chunk(header("f8", (1 << 30, 1 << 30))) + chunk(bytes(8)), "in 8 bytes"),
        (chunk(header("f4", (-2, -1))) + chunk(bytes(8)), r"shape \(-2, -1\)"),
        (chunk(b"abc") + chunk(bytes(8)), "a tenbin header of 3 bytes"),
    ],
)
def test_damaged_tenbin_is_refused_saying_why(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_tenbin(data)


def test_a_damaged_member_names_the_shard_and_member(tmp_path: Path) -> None:
    url = str(tmp_path / "bad-000.tar")
    with sp.TarWriter(url) as sink:
        sink.write({"__key__": "good", "ten": np.arange(3, dtype=np.int32)})
        sink.write({"__key__": "evil", "ten": chunk(header("f8", (1 << 40,))) + chunk(bytes(8))})
    with pytest.raises(DecodeError, match=r"evil\.ten") as info:
        list(sp.list_shards(url).open_tar().decode())
    assert info.value.url == url
    with pytest.warns(sp.ShardpipesWarning, match="evil"):
        kept = list(sp.list_shards(url).open_tar().decode(handler="warn"))
    assert [s["__key__"] for s in kept] == ["good"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_tenbin_decodes_or_raises_value_error(data: st.DataObject) -> None:
    """Any byte of a valid member changed, or the member cut: arrays back, or ValueError."""
    valid = bytearray(encode_tenbin(ARRAYS[:3]))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(valid) - 1))
        valid[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(valid)))
    try:
        arrays = decode_tenbin(bytes(valid[:cut]))
    except ValueError:
        return
    assert sum(a.nbytes for a in arrays) <= cut


def test_the_writer_refuses_what_webdataset_could_not_read(tmp_path: Path) -> None:
    with sp.TarWriter(str(tmp_path / "w.tar")) as sink:
        with pytest.raises(TypeError, match=r"'k'.*'ten'.*uint32"):
            sink.write({"__key__": "k", "ten": np.zeros(3, dtype=np.uint32)})
        with pytest.raises(TypeError, match=r"'k'.*'ten'.*a numpy array or tensor, or a list"):
            sink.write({"__key__": "k", "ten": [1, 2]})
        sink.write({"__key__": "t", "ten": [torch.arange(4, dtype=torch.int16)]})
    (back,) = next(iter(sp.list_shards(str(tmp_path / "w.tar")).open_tar().decode()))["ten"]
    assert back.dtype == np.int16
    assert back.tolist() == [0, 1, 2, 3]


def test_msgpack_missing_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(tmp_path / "mp-000.tar")
    with sp.TarWriter(url) as sink:
        sink.write({"__key__": "k", "mp": {"a": 1}})
    monkeypatch.setitem(sys.modules, "msgpack", None)  # as if not installed
    with pytest.raises(DecodeError, match=r"pip install msgpack.*member 'k\.mp'"):
        list(sp.list_shards(url).open_tar().decode())
    got: Any = next(iter(sp.list_shards(url).open_tar().decode(mp=None)))
    assert isinstance(got["mp"], bytes)


@pytest.mark.parametrize(
    "arrays",
    [
        [np.array(5, dtype=np.int64)],  # no dimension: a header of 24 bytes
        [np.zeros((1,) * 9, dtype=np.uint8)],  # the most dimensions
        [np.arange(1000, dtype=np.float32), np.arange(7, dtype=np.int8)],  # padded chunks
    ],
)
def test_our_own_round_trips_at_the_edges(arrays: list[Any]) -> None:
    back = decode_tenbin(encode_tenbin(arrays))
    assert [(a.dtype, a.shape) for a in back] == [(a.dtype, a.shape) for a in arrays]
    assert all(np.array_equal(a, b) for a, b in zip(back, arrays, strict=True))


def test_the_last_chunk_may_go_without_its_padding() -> None:
    data = encode_tenbin([np.arange(3, dtype=np.int16)])
    body = 6  # the last chunk's bytes, before its padding to 64
    unpadded = data[: len(data) - (64 - body)]
    assert decode_tenbin(unpadded)[0].tolist() == [0, 1, 2]
    assert decode_tenbin(b"") == []
    with pytest.raises(ValueError, match="a header without its data"):
        decode_tenbin(MAGIC + struct.pack("<q", 0))  # 16 bytes: one empty chunk


def test_a_header_may_hold_more_fields_than_its_dimensions() -> None:
    data = chunk(header("i2", (3,)) + struct.pack("<q", 99)) + chunk(
        np.arange(3, dtype="<i2").tobytes()
    )
    (array,) = decode_tenbin(data)
    assert array.shape == (3,)


@pytest.mark.parametrize("code", [b"f4\0\0\0\0\0\xff", b"\xff\xfe\0\0\0\0\0\0"])
def test_a_type_code_that_is_not_ascii_is_unknown(code: bytes) -> None:
    head = code + header("f4", (2,))[8:]
    with pytest.raises(ValueError, match="unknown type"):
        decode_tenbin(chunk(head) + chunk(bytes(8)))


def test_encode_refuses_what_is_not_a_numpy_array_saying_what() -> None:
    with pytest.raises(TypeError, match=r"tenbin holds numpy arrays \(got a Tensor\)"):
        encode_tenbin([torch.zeros(2)])
    with pytest.raises(TypeError, match=r"float16, float32.*at most 9 dimensions"):
        encode_tenbin([np.zeros((1,) * 10, dtype=np.uint8)])


@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
        b"\xdf\xff\xff\xff\xff",  # a map claiming as many
        b"\xc6\xff\xff\xff\xff",  # 4 GiB of bin in 5 bytes
        b"\x91" * 100_000 + b"\xc0",  # nested 100,000 deep
    ],
)
def test_hostile_msgpack_is_a_decode_error_naming_the_member(tmp_path: Path, data: bytes) -> None:
    """The unpackb of msgpack holds claims to the member's size and its nesting to a limit."""
    url = str(tmp_path / "mp-000.tar")
    with sp.TarWriter(url) as sink:
        sink.write({"__key__": "good", "mp": {"a": 1}})
        sink.write({"__key__": "evil", "mp": data})
    with pytest.raises(DecodeError, match=r"member 'evil\.mp'"):
        list(sp.list_shards(url).open_tar().decode())
    with pytest.warns(sp.ShardpipesWarning, match="evil"):
        kept = list(sp.list_shards(url).open_tar().decode(handler="warn"))
    assert [s["mp"] for s in kept] == [{"a": 1}]
