"""The corruption corpus: broken and hostile shards, built byte by byte at test time.

Every case is a shard of ten good samples ``s0000``..``s0009`` (``.txt`` and ``.cls``, plus
one member of the case's extension for the decode cases) with one thing broken at the
fifth sample, and says what a reader must do with it: the error type with ``"raise"``, the
member the message names, and the keys that a skipping handler still yields.

Where the reader cannot tell which sample lost a member (a header too damaged to name
one, a stream cut off, a gzip stream that fails), the sample being gathered is dropped as
well: a sample missing a member is never yielded.
"""

from __future__ import annotations

import gzip
import io
import pickle
import random
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy
from PIL import Image

from shardpipes.errors import DecodeError, TarFormatError, UnsafeDataError

N = 10
BAD = 5
KEYS = [f"s{i:04d}" for i in range(N)]
END = bytes(1024)


def member(name: str, data: bytes, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """One regular member: header(s), data, padding."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    header = info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape")
    return header + data + bytes(-len(data) % 512)


def sample(i: int, extra: dict[str, bytes] | None = None) -> bytes:
    """The members of sample ``i``: text, label, and any ``extra`` extensions."""
    out = member(f"{KEYS[i]}.txt", f"sample {i}\n".encode() * 5)
    for ext, data in (extra or {}).items():
        out += member(f"{KEYS[i]}.{ext}", data)
    return out + member(f"{KEYS[i]}.cls", str(i).encode())


def samples(indices: range, extra: Callable[[int], dict[str, bytes]] | None = None) -> bytes:
    return b"".join(sample(i, extra(i) if extra else None) for i in indices)


HEAD = samples(range(BAD))  # s0000..s0004
TAIL = samples(range(BAD, N)) + END  # s0005..s0009 and the end-of-archive marker


def checksummed(header: bytearray) -> bytes:
    """Recompute a header's checksum after editing it."""
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def with_size(name: str, size_field: bytes, data: bytes = b"x" * 100) -> bytes:
    """A member whose header's size field is replaced (checksum kept valid)."""
    raw = bytearray(member(name, data))
    raw[124:136] = size_field
    return checksummed(raw[:512]) + bytes(raw[512:])


def pax_flood(n: int) -> bytes:
    """``n`` pax extended headers in a row."""
    one = tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
        {"comment": "x" * 40}, tarfile.XHDTYPE, "utf-8"
    )
    return one * n


def endless_long_name(size: int) -> bytes:
    """A GNU long-name header claiming ``size`` bytes, then that many non-NUL bytes."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, size
    return info.tobuf(format=tarfile.GNU_FORMAT) + b"a" * size


def image(fmt: str, i: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), (i * 20, 40, 60)).save(out, format=fmt)
    return out.getvalue()


def bomb_png() -> bytes:
    """A tiny PNG whose header claims 100,000 x 100,000 pixels."""
    data = bytearray(image("PNG"))
    data[16:24] = struct.pack(">II", 100_000, 100_000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def bad_crc_png() -> bytes:
    """A PNG whose header chunk (IHDR) fails its CRC."""
    data = bytearray(image("PNG"))
    data[29] ^= 0xFF  # IHDR: length 4, type 4, data 13 from byte 8; then the CRC
    return bytes(data)


def npy(array: numpy.ndarray) -> bytes:
    out = io.BytesIO()
    numpy.save(out, array, allow_pickle=True)
    return out.getvalue()


def all_but(*bad: int) -> list[str]:
    return [k for i, k in enumerate(KEYS) if i not in bad]


@dataclass
class Case:
    """A broken shard and what readers must do with it."""

    data: Callable[[], bytes]
    error: type[Exception] | None  # with handler="raise"; None: no error at all
    kept: list[str]  # the keys a skipping handler yields
    member: str | None = None  # the member the error names
    match: str = ""  # a piece of the error message
    gz: bool = False  # a .tar.gz shard


def _shard_with(middle: bytes) -> Callable[[], bytes]:
    return lambda: HEAD + middle + TAIL


def _bad_checksum() -> bytes:
    raw = bytearray(sample(BAD))
    raw[148:156] = b"0000000\0"
    return HEAD + bytes(raw) + samples(range(BAD + 1, N)) + END


def _gz_cut() -> bytes:
    data = gzip.compress(HEAD + TAIL)
    return data[: len(data) * 6 // 10]


def complete_samples(tar: bytes, available: int) -> list[str]:
    """The keys a skipping reader keeps when a stream breaks after ``available`` bytes.

    Samples read whole, less the one being gathered at the break (it may lack members).
    """
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        ends = [(m.name.split(".")[0], m.offset_data + m.size + -m.size % 512) for m in archive]
    done = [key for key, end in ends if end <= available]
    return sorted(set(done) - {done[-1]}) if done else []


def _gz_cut_kept() -> list[str]:
    available = len(zlib.decompressobj(31).decompress(_gz_cut()))
    assert 0 < available < len(HEAD + TAIL)  # the cut falls inside the tar
    return complete_samples(HEAD + TAIL, available)


def _gz_bad_crc() -> bytes:
    data = bytearray(gzip.compress(HEAD + TAIL))
    data[-8] ^= 0xFF
    return bytes(data)


TAR_CASES: dict[str, Case] = {
    "truncated_in_header": Case(
        lambda: HEAD + TAIL[:300], TarFormatError, KEYS[: BAD - 1], match="truncated header"
    ),
    "truncated_in_member": Case(
        lambda: HEAD + TAIL[:515], TarFormatError, KEYS[:BAD], f"{KEYS[BAD]}.txt", "truncated"
    ),
    "truncated_at_block_boundary": Case(
        lambda: HEAD + TAIL[:1024], TarFormatError, KEYS[:BAD], match="no end-of-archive"
    ),
    "bad_header_checksum": Case(
        _bad_checksum, TarFormatError, all_but(BAD), f"{KEYS[BAD]}.txt", "checksum"
    ),
    "size_not_octal": Case(
        _shard_with(with_size("evil.txt", b"12x4\0\0\0\0\0\0\0\0")),
        TarFormatError, KEYS, "evil.txt", "not octal",
    ),
    "size_past_the_end": Case(
        lambda: HEAD + with_size(f"{KEYS[BAD]}.txt", b"%011o\0" % (10 << 20)),
        TarFormatError, KEYS[:BAD], f"{KEYS[BAD]}.txt", "truncated member",
    ),
    "negative_size": Case(
        _shard_with(with_size("evil.txt", b"\xff" * 12)),
        TarFormatError, KEYS, "evil.txt", "negative size",
    ),
    "huge_size": Case(
        _shard_with(with_size("evil.txt", b"\x80" + (1 << 80).to_bytes(11, "big"))),
        TarFormatError, KEYS[:BAD], "evil.txt", "max_member_bytes",
    ),
    "zero_block_in_the_middle": Case(
        _shard_with(bytes(512)), TarFormatError, KEYS, match="all-zero block"
    ),
    "endless_pax_headers": Case(
        _shard_with(pax_flood(100)), TarFormatError, KEYS[: BAD - 1], match="extended headers"
    ),
    "gnu_long_name_that_never_ends": Case(
        _shard_with(endless_long_name(3 << 20)),
        TarFormatError, KEYS[: BAD - 1] + KEYS[BAD + 1 :], match="extended header of",
    ),
    "gzip_cut": Case(_gz_cut, TarFormatError, _gz_cut_kept(), match="compressed", gz=True),
    "gzip_bad_crc": Case(_gz_bad_crc, TarFormatError, KEYS[:-1], match="CRC", gz=True),
    "random_bytes": Case(
        lambda: random.Random(6).randbytes(10_000), TarFormatError, [], match="bad header"
    ),
    "empty_file": Case(lambda: b"", TarFormatError, [], match="empty file"),
    "zero_members": Case(lambda: bytes(10240), None, []),
    "dotdot_name": Case(
        _shard_with(member("../evil.txt", b"x") + member("../evil.cls", b"1")),
        TarFormatError, KEYS, "../evil.txt", "unsafe member name",
    ),
    "absolute_name": Case(
        _shard_with(member("/etc/evil.txt", b"x")),
        TarFormatError, KEYS, "/etc/evil.txt", "unsafe member name",
    ),
    "nul_in_name": Case(
        _shard_with(member("é\0vil.txt", b"x", fmt=tarfile.PAX_FORMAT)),
        TarFormatError, KEYS, "é\0vil.txt", "unsafe member name",
    ),
    "duplicate_extension": Case(
        lambda: HEAD + sample(BAD, {"txt": b"again"}) + samples(range(BAD + 1, N)) + END,
        TarFormatError, all_but(BAD), f"{KEYS[BAD]}.txt", "duplicate extension",
    ),
}  # fmt: skip


@dataclass
class DecodeCase:
    """A shard whose fifth sample holds a member that fails to decode."""

    ext: str
    good: Callable[[int], bytes] | None  # the member in the other samples (None: absent)
    bad: bytes
    error: type[Exception]
    match: str

    def extra(self, i: int) -> dict[str, bytes]:
        """The member of the case's extension in sample ``i`` (none, or a good one)."""
        if i == BAD:
            return {self.ext: self.bad}
        return {self.ext: self.good(i)} if self.good is not None else {}

    def data(self) -> bytes:
        return samples(range(N), self.extra) + END


DECODE_CASES: dict[str, DecodeCase] = {
    "jpeg_cut_in_the_scan": DecodeCase(
        "jpg", lambda i: image("JPEG", i), image("JPEG")[:400], DecodeError, "truncated"
    ),
    "png_bad_crc": DecodeCase("png", lambda i: image("PNG", i), bad_crc_png(), DecodeError, "crc"),
    "decompression_bomb": DecodeCase(
        "png", lambda i: image("PNG", i), bomb_png(), DecodeError, "decompression bomb"
    ),
    "npy_asking_for_pickle": DecodeCase(
        "npy", lambda i: npy(numpy.arange(i)), npy(numpy.array([{}], dtype=object)),
        UnsafeDataError, "pickle",
    ),
    "pyd_pickle": DecodeCase("pyd", None, pickle.dumps({"a": 1}), UnsafeDataError, "pickle"),
    "json_that_is_not_json": DecodeCase(
        "json", lambda i: b'{"i": %d}' % i, b"{not json", DecodeError, "JSONDecodeError"
    ),
    "cls_that_is_not_an_integer": DecodeCase(
        "cls2", lambda i: b"%d" % i, b"seven", DecodeError, "invalid literal"
    ),
}  # fmt: skip
