"""The streaming tar reader, against Python's tarfile and GNU tar."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardpipes._core.samples import group_samples
from shardpipes._core.tar import CHUNK, MAX_EXTENDED, Member, iter_members
from shardpipes.errors import StorageError, TarFormatError
from tests.conftest import add_member
from tests.hostile.corpus import TAR_CASES


def build(
    members: list[tuple[str, bytes]],
    fmt: int = tarfile.PAX_FORMAT,
    extra: Callable[[tarfile.TarFile], None] | None = None,
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            add_member(tar, name, data)
        if extra:
            extra(tar)
    return out.getvalue()


def reference(data: bytes) -> list[tuple[str, bytes]]:
    """What Python's tarfile reads: regular members, './' stripped."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        out = []
        for info in tar:
            if info.isreg():
                f = tar.extractfile(info)
                assert f is not None
                out.append((info.name.removeprefix("./"), f.read()))
        return out


def ours(data: bytes, **kwargs: object) -> list[tuple[str, bytes | None]]:
    return [(m.name, m.data) for m in iter_members(io.BytesIO(data), url="mem://t.tar", **kwargs)]  # type: ignore[arg-type]


LONG = "d" * 120 + "/" + "n" * 130 + ".jpg"


class TestFormats:
    @pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
    def test_python_tarfile_formats(self, fmt: int) -> None:
        """Ustar (prefix field), GNU long names and pax paths read like tarfile reads them."""
        names = ["a.jpg", "./b/c.cls", "p" * 90 + "/" + "q" * 90 + ".txt"]
        if fmt != tarfile.USTAR_FORMAT:
            names += [LONG, "üñí/çødé.json"]
        data = build([(n, n.encode() * (i * 97)) for i, n in enumerate(names)], fmt)
        assert ours(data) == reference(data)
        assert [n for n, _ in ours(data)][1] == "b/c.cls"

    @pytest.mark.parametrize("fmt", ["gnu", "posix", "oldgnu"])
    def test_gnu_tar_command(
        self, gnu_tar: Callable[[dict[str, bytes], str], str], fmt: str
    ) -> None:
        """Archives written by the GNU tar command, long names included."""
        files = {"k1.jpg": b"x" * 1000, "k1.cls": b"3", LONG: b"long" * 200}
        path = gnu_tar(files, fmt)
        with open(path, "rb") as f:
            got = dict(ours(f.read()))
        assert got == files

    def test_gzip_stream(self) -> None:
        """A .tar.gz is detected by magic and read as a gzip stream."""
        members = [(f"{i}.bin", bytes([i]) * (i * 300)) for i in range(20)]
        assert ours(gzip.compress(build(members))) == members

    def test_skips_non_regular_members(self) -> None:
        """Directories, symlinks, hard links and fifos are not yielded."""

        def extra(tar: tarfile.TarFile) -> None:
            for name, kind in [
                ("dir", tarfile.DIRTYPE),
                ("sym.jpg", tarfile.SYMTYPE),
                ("hard.jpg", tarfile.LNKTYPE),
                ("fifo", tarfile.FIFOTYPE),
            ]:
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = "a.jpg"
                tar.addfile(info)

        data = build([("a.jpg", b"123")], extra=extra)
        assert ours(data) == [("a.jpg", b"123")]

    def test_members_larger_than_the_read_chunk(self) -> None:
        """A member bigger than the 1 MiB read chunk comes out whole."""
        big = bytes(range(256)) * (CHUNK // 256 * 2 + 3)
        assert ours(build([("a.bin", b"1"), ("big.bin", big), ("z.bin", b"2")])) == [
            ("a.bin", b"1"),
            ("big.bin", big),
            ("z.bin", b"2"),
        ]

    @pytest.mark.parametrize("size", [1000, 4096, 70_000])
    def test_members_across_read_chunks(self, size: int) -> None:
        """Members and headers that straddle the 1 MiB read boundary (the general path)."""
        members = [(f"{i:05d}.bin", bytes([i % 251]) * (size + i % 7)) for i in range(40)]
        members = members * (2 * CHUNK // (40 * size) + 1)
        members = [(f"{i:06d}.{name}", data) for i, (name, data) in enumerate(members)]
        data = build(members, tarfile.USTAR_FORMAT)
        assert ours(data) == reference(data) == members

    def test_old_signed_checksum(self) -> None:
        """A header whose checksum was computed over signed bytes is accepted."""
        data = bytearray(build([("\xe9t\xe9.txt", b"x")], tarfile.USTAR_FORMAT))
        signed = 256 + sum(b - 256 if b > 127 else b for b in data[:148] + data[156:512])
        data[148:156] = b"%06o\0 " % signed
        assert ours(bytes(data)) == [("\xe9t\xe9.txt", b"x")]

    def test_keep_skips_data_and_reports_offsets(self) -> None:
        """Declined members come back with data None; offsets tile the archive."""
        data = build(
            [("a.x", b"1" * 600), ("b.x", b"2"), ("c.x", b"3" * 2000)], fmt=tarfile.USTAR_FORMAT
        )
        members = list(iter_members(io.BytesIO(data), url="u", keep=lambda n: n != "b.x"))
        assert [(m.name, m.data is None) for m in members] == [
            ("a.x", False),
            ("b.x", True),
            ("c.x", False),
        ]
        assert members[0].offset == 0
        assert [m.offset for m in members[1:]] == [m.end for m in members[:-1]]

    def test_range_read(self) -> None:
        """Reading from a header boundary with base and limit gives the members in range."""
        data = build([("a.x", b"1" * 600), ("b.x", b"2"), ("c.x", b"3")], fmt=tarfile.USTAR_FORMAT)
        members = list(iter_members(io.BytesIO(data), url="u"))
        start, end = members[1].offset, members[1].end
        got = list(iter_members(io.BytesIO(data[start:]), url="u", base=start, limit=end - start))
        assert [(m.name, m.offset) for m in got] == [("b.x", start)]


class TestErrors:
    def test_truncated_member(self) -> None:
        """A shard cut inside a member names the member and its header's offset."""
        data = build([("a.x", b"1" * 100), ("b.x", b"2" * 5000)])
        with pytest.raises(
            TarFormatError, match=r"mem://t\.tar: truncated member .*'b.x'.*at byte"
        ):
            ours(data[:3000])

    def test_truncated_header(self) -> None:
        """A shard cut inside a header says so."""
        data = build([("a.x", b"1" * 100)])
        with pytest.raises(TarFormatError, match="truncated header"):
            ours(data[: 1024 + 100])

    def test_bad_checksum(self) -> None:
        """A corrupted header is refused with its offset."""
        data = bytearray(build([("a.x", b"1"), ("b.x", b"2")]))
        second = 1024 if data[512] != 0 else 0
        data[second + 10] ^= 0xFF
        with pytest.raises(TarFormatError, match="checksum"):
            ours(bytes(data))

    def test_non_octal_size(self) -> None:
        """A size field that is not a number is refused."""
        data = bytearray(build([("a.x", b"1")], fmt=tarfile.USTAR_FORMAT))
        data[124:136] = b"zzzzzzzzzzz\0"
        with pytest.raises(TarFormatError, match="not octal"):
            ours(bytes(data))

    def test_cut_gzip(self) -> None:
        """A gzip stream cut short is a TarFormatError, not an EOFError from gzip."""
        blob = gzip.compress(build([(f"{i}.bin", bytes(5000)) for i in range(10)]))
        with pytest.raises(TarFormatError, match=r"mem://t\.tar"):
            ours(blob[: len(blob) // 2])

    def test_pax_record_longer_than_its_header(self) -> None:
        """Found by fuzzing: a pax record running past its header's data.

        It was an IndexError; it is a bad pax header, and skipping drops the member it named.
        """
        pax = bytearray(
            tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
                {"path": "xxxxx.txt"}, tarfile.XHDTYPE, "utf-8"
            )
        )
        at = pax.index(b" path=", 512)
        pax[at - 2 : at] = b"99"  # the record claims 99 bytes; the header holds 18
        data = bytes(pax) + build([("a.txt", b"1"), ("b.txt", b"2")])
        with pytest.raises(TarFormatError, match="bad pax header"):
            ours(data)
        errors: list[TarFormatError] = []
        got = ours(data, on_error=lambda exc, fatal: errors.append(exc))
        # a marker for the bad header, the member it named marked too (unread), then the rest
        assert got == [("", None), ("a.txt", None), ("b.txt", b"2")]
        assert len(errors) == 1

    def test_storage_error_mid_stream_is_not_a_tar_error(self) -> None:
        """A read failing for good (StorageError) stays one, not 'bad gzip data'."""
        data = build([(f"{i}.bin", bytes(3000)) for i in range(4)])

        class Failing(io.BytesIO):
            def read(self, n: int | None = -1) -> bytes:
                if self.tell() >= 4096:
                    msg = "reset, retries spent"
                    raise StorageError(msg, url="mem://t.tar", offset=4096)
                return super().read(min(n or 4096, 1024))

        with pytest.raises(StorageError, match="retries spent"):
            list(iter_members(Failing(data), url="mem://t.tar"))

    @pytest.mark.parametrize("kind", [b"Q", b"S"])  # an unknown type, a sparse file
    def test_skipped_member_with_an_absurd_size(self, kind: bytes) -> None:
        """A member skipped unread whose size no stream has: a TarFormatError, no overflow."""
        head = bytearray(build([("a.txt", b"1")])[:512])
        head[156:157] = kind
        head[124:136] = b"\x80" + (1 << 80).to_bytes(11, "big")
        head[148:156] = b" " * 8
        head[148:156] = b"%06o\0 " % sum(head)
        with pytest.raises(TarFormatError, match="no end-of-archive"):
            ours(bytes(head) + build([("b.txt", b"2")]))

    def test_garbage(self) -> None:
        """Random bytes are not a tar."""
        with pytest.raises(TarFormatError):
            ours(bytes(range(256)) * 8)

    def test_end_marker_only(self) -> None:
        """Only the end-of-archive marker: a valid archive of no members."""
        assert ours(bytes(1024)) == []

    def test_empty_file(self) -> None:
        """A 0-byte shard is an error (a writer that died), unlike tarfile's silence."""
        with pytest.raises(TarFormatError, match="empty file"):
            ours(b"")


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\."),
    min_size=1,
    max_size=60,
)
paths = st.builds(
    lambda parts, ext: "/".join(parts) + "." + ext,
    st.lists(names, min_size=1, max_size=4),
    st.sampled_from(["jpg", "cls", "seg.png", "txt"]),
)
sizes = st.one_of(st.integers(0, 2000), st.sampled_from([0, 511, 512, 513, 1024, 10240]))


@settings(max_examples=60, deadline=None)
@given(
    members=st.lists(st.tuples(paths, sizes), max_size=8),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    gz=st.booleans(),
)
def test_matches_tarfile(members: list[tuple[str, int]], fmt: int, gz: bool) -> None:
    """Random archives read exactly as tarfile reads them, member by member.

    Unicode and long names, edge sizes; ustar, GNU and pax; plain and gzip.
    """
    try:
        data = build([(name, bytes([len(name) % 256]) * size) for name, size in members], fmt)
    except ValueError:  # ustar cannot hold the name (too long, or not ASCII-encodable)
        assume(False)
    if gz:
        data = gzip.compress(data)
    assert ours(data) == reference(data)


def collect(data: bytes, **kwargs: Any) -> tuple[list[Member], list[tuple[TarFormatError, bool]]]:
    """The members of ``data`` read with an ``on_error`` that records and goes on."""
    errors: list[tuple[TarFormatError, bool]] = []
    got = list(
        iter_members(
            io.BytesIO(data), url="u", on_error=lambda e, fatal: errors.append((e, fatal)), **kwargs
        )
    )
    return got, errors


def check_placement(data: bytes, members: list[Member]) -> None:
    """Each member read whole lies where its offsets say: header at offset, data before end."""
    for m in members:
        if m.end < 0:
            assert m.data is None
            continue
        assert m.data is not None
        padded = len(m.data) + -len(m.data) % 512
        assert data[m.end - padded : m.end - padded + len(m.data)] == m.data
        assert data[m.offset : m.offset + len(m.name)] == m.name.encode()
        assert m.offset == m.end - padded - 512


CORPUS = sorted(TAR_CASES)


class TestCorpus:
    @pytest.mark.parametrize("name", CORPUS)
    def test_raising(self, name: str) -> None:
        """Each broken shard raises its error, naming the URL and the member, or reads fine."""
        case = TAR_CASES[name]

        def read() -> list[dict[str, Any]]:
            return list(group_samples(iter_members(io.BytesIO(case.data()), url="u"), url="u"))

        if case.error is None:
            assert read() == []
            return
        with pytest.raises(case.error) as info:
            read()
        error = info.value
        assert isinstance(error, TarFormatError)
        assert case.match.lower() in str(error).lower()
        assert error.url == "u" and str(error).startswith("u: ")
        if case.member is not None:
            assert error.member == case.member

    @pytest.mark.parametrize("name", CORPUS)
    def test_skipping(self, name: str) -> None:
        """Going on past each bad member keeps the case's samples, each where it lies."""
        case = TAR_CASES[name]
        data = case.data()
        members, errors = collect(data)
        keys = [s["__key__"] for s in group_samples(members, url="u", handler="ignore")]
        assert keys == case.kept
        reader_errors = case.error is not None and name != "duplicate_extension"
        assert bool(errors) == reader_errors
        for error, _ in errors:
            assert error.url == "u" and error.offset is not None
        if reader_errors:
            assert case.match.lower() in str(errors[0][0]).lower()
        if not case.gz:
            check_placement(data, members)


def plain(n: int, size: int = 100) -> bytes:
    """A ustar archive of ``n`` members m0.txt... of ``size`` bytes each."""
    return build([(f"m{i}.txt", bytes([65 + i]) * size) for i in range(n)], tarfile.USTAR_FORMAT)


def corrupt(data: bytes, at: int, field: slice, value: bytes, *, fix: bool = True) -> bytes:
    """Replace a field of the header at ``at``; recompute its checksum unless ``fix`` is off."""
    out = bytearray(data)
    header = out[at : at + 512]
    header[field] = value
    if fix:
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
    out[at : at + 512] = header
    return bytes(out)


class TestGoingOn:
    """What the reader yields and reports past a bad member (offsets: 1024 per member)."""

    @pytest.mark.parametrize(
        ("field", "value", "fix", "match", "marker"),
        [
            (slice(148, 156), b"0000000\0", False, "bad header checksum", ("m1.txt", 1024)),
            (slice(124, 136), b"zz\0" + bytes(9), True, "not octal", ("m1.txt", 1024)),
            (slice(0, 100), b"../m1.txt" + bytes(91), True, "unsafe member", ("../m1.txt", 1024)),
            (slice(0, 100), b"/m1.txt" + bytes(93), True, "unsafe member", ("/m1.txt", 1024)),
            (slice(0, 100), b"a\\..\\m1.txt" + bytes(89), True, "unsafe", ("a\\..\\m1.txt", 1024)),
            (slice(0, 100), b"\x01\x02" + bytes(98), False, "checksum", ("", 1024)),
        ],
    )
    def test_bad_second_member(
        self, field: slice, value: bytes, fix: bool, match: str, marker: tuple[str, int]
    ) -> None:
        """A bad member is reported (not fatal) and marked; the next ones are read."""
        data = corrupt(plain(3), 1024, field, value, fix=fix)
        members, errors = collect(data)
        assert [(m.name, m.offset, m.end) for m in members] == [
            ("m0.txt", 0, 1024),
            (*marker, -1),
            ("m2.txt", 2048, 3072),
        ]
        assert members[2].data == b"C" * 100
        [(error, fatal)] = errors
        assert match in str(error) and not fatal
        assert (error.url, error.offset) == ("u", 1024)
        assert error.member == (marker[0] or None)

    def test_oversized_member_is_skipped_unread(self) -> None:
        """A member over max_member_bytes is reported and its data skipped."""
        data = plain(3, size=3000)
        members, errors = collect(data, max_member_bytes=2999)
        assert members == [Member(f"m{i}.txt", None, 3584 * i, -1) for i in range(3)]
        assert str(errors[0][0]) == (
            "u: member of 3000 bytes is larger than max_member_bytes=2999 "
            "(member 'm0.txt' at byte 0)"
        )
        members, errors = collect(data, max_member_bytes=3000)
        assert [m.name for m in members if m.data is not None] == ["m0.txt", "m1.txt", "m2.txt"]
        assert errors == []

    def test_truncated_member_is_fatal(self) -> None:
        """A shard cut inside a member: reported as fatal, marked, and nothing after."""
        members, errors = collect(plain(3)[: 2560 + 52])
        assert [(m.name, m.offset, m.end) for m in members] == [
            ("m0.txt", 0, 1024),
            ("m1.txt", 1024, 2048),
            ("m2.txt", 2048, -1),
        ]
        [(error, fatal)] = errors
        assert fatal and error.member == "m2.txt" and error.offset == 2048
        assert "truncated member (52 of 100 bytes, padded to 512)" in str(error)

    @pytest.mark.parametrize(
        ("cut", "whole", "match"),
        [(2048 + 100, 2, "truncated header"), (3072, 3, "no end-of-archive blocks: truncated")],
    )
    def test_cut_between_members_is_fatal(self, cut: int, whole: int, match: str) -> None:
        """A shard cut in or after a header: fatal, marked where the cut header starts."""
        members, errors = collect(plain(3)[:cut])
        assert [m.name for m in members[:-1]] == [f"m{i}.txt" for i in range(whole)]
        assert members[-1] == Member("", None, 1024 * whole, -1)
        [(error, fatal)] = errors
        assert fatal and match in str(error) and error.offset == 1024 * whole

    def test_lone_zero_block_is_reported_and_passed(self) -> None:
        """An all-zero block between members: reported, no marker, the rest read."""
        data = plain(2)[:1024] + bytes(512) + plain(2)[1024:]
        members, errors = collect(data)
        assert [(m.name, m.offset) for m in members] == [("m0.txt", 0), ("m1.txt", 1536)]
        [(error, fatal)] = errors
        assert "all-zero block in the middle" in str(error) and not fatal
        assert error.offset == 1024

    def test_more_extended_headers_than_allowed(self) -> None:
        """Up to MAX_EXTENDED extended headers before a member are read; one more is fatal."""
        pax = tarfile.TarInfo._create_pax_generic_header(  # type: ignore[attr-defined]
            {"comment": "x"}, tarfile.XHDTYPE, "utf-8"
        )
        ok, errors = collect(pax * MAX_EXTENDED + plain(1))
        assert [m.name for m in ok] == ["m0.txt"] and errors == []
        assert ok[0].offset == 0  # a member starts at its first extended header
        bad, errors = collect(plain(1)[:1024] + pax * (MAX_EXTENDED + 1) + plain(1))
        [(error, fatal)] = errors
        assert fatal and error.offset == 1024
        assert f"more than {MAX_EXTENDED} extended headers before one member" in str(error)
        assert [(m.name, m.offset, m.end) for m in bad][1:] == [("", 1024, -1)]

    def test_gzip_cut_is_fatal_after_the_data_before_it(self) -> None:
        """A cut gzip stream: the members before the cut, then a fatal marker."""
        raw = plain(40, size=3000)
        blob = gzip.compress(raw)
        members, errors = collect(blob[: len(blob) // 2])
        assert members[-1].end == -1 and members[-1].name == ""
        good = members[:-1]
        assert len(good) > 5 and [m.name for m in good] == [f"m{i}.txt" for i in range(len(good))]
        check_placement(raw, good)
        [(error, fatal)] = errors
        assert fatal and "unreadable compressed stream" in str(error)
        assert error.__cause__ is not None and error.offset == members[-1].offset


class TestNumbers:
    @pytest.mark.parametrize(
        ("size_field", "data"),
        [
            (b"5" + bytes(11), b"12345"),  # NUL-padded, no leading zeros
            (b"     5\0     ", b"12345"),  # space-padded
            (bytes(12), b""),  # empty: zero
            (b"\x80" + (5).to_bytes(11, "big"), b"12345"),  # GNU base-256
        ],
    )
    def test_size_fields(self, size_field: bytes, data: bytes) -> None:
        """Size fields in the spellings tar writers use."""
        raw = build([("a.txt", data), ("b.txt", b"2")], tarfile.USTAR_FORMAT)
        raw = corrupt(raw, 0, slice(124, 136), size_field)
        assert ours(raw) == [("a.txt", data), ("b.txt", b"2")]

    @pytest.mark.parametrize(
        ("size_field", "size"),
        [(b"\xff" * 12, -1), (b"\xff\x80" + bytes(10), -(1 << 87))],
    )
    def test_negative_base_256_size(self, size_field: bytes, size: int) -> None:
        """A negative base-256 size is refused with its value."""
        raw = corrupt(plain(1), 0, slice(124, 136), size_field)
        with pytest.raises(TarFormatError, match=rf"bad header: negative size {size} \(member"):
            ours(raw)

    def test_checksum_over_32767(self) -> None:
        """A header of high bytes, whose checksum needs 6 octal digits from 1: read."""
        name = "é" * 70 + "/" + "ü" * 45 + ".txt"
        raw = build([(name, b"x")], tarfile.USTAR_FORMAT)
        assert raw[148:149] >= b"1"
        assert ours(raw) == [(name, b"x")]

    def test_checksum_without_nul(self) -> None:
        """A checksum field of 7 digits and a space (no NUL) is accepted."""
        raw = bytearray(plain(1))
        raw[148:156] = b" " * 8
        raw[148:156] = b"%07o " % sum(raw[:512])
        assert ours(bytes(raw)) == [("m0.txt", b"A" * 100)]


class OneWay(io.RawIOBase):
    """A stream that cannot seek, and gives at most ``piece`` bytes per read."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.data, self.pos, self.piece = data, 0, piece

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = len(self.data) if n < 0 else n
        out = self.data[self.pos : self.pos + min(n, self.piece)]
        self.pos += len(out)
        return out


class NoSeekable:
    """A bare object with ``read`` only (no ``seekable``)."""

    def __init__(self, data: bytes) -> None:
        self.stream = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self.stream.read(n)


class SeekableFails(io.BytesIO):
    def seekable(self) -> bool:
        raise OSError("closed")  # noqa: EM101


STREAMS: dict[str, Callable[[bytes], Any]] = {
    "seekable": io.BytesIO,
    "one-way": lambda data: OneWay(data, 1 << 20),
    "small-reads": lambda data: OneWay(data, 700),
    "no-seekable": NoSeekable,
    "seekable-fails": SeekableFails,
    "gzip": lambda data: io.BytesIO(gzip.compress(data)),
}


class TestStreams:
    BIG = 3 * CHUNK + 5

    def archive(self) -> tuple[bytes, list[Member]]:
        members = [("a.bin", b"a" * 700), ("big.bin", b"b" * self.BIG), ("c.bin", b"c" * 10)]
        members += [(f"d{i}.bin", bytes([i]) * (i * 300)) for i in range(8)]
        data = build(members, tarfile.USTAR_FORMAT)
        return data, list(iter_members(io.BytesIO(data), url="u"))

    @pytest.mark.parametrize("kind", sorted(STREAMS))
    def test_every_stream_reads_the_same(self, kind: str) -> None:
        """Seekable or not, whole or in small pieces, plain or gzip: the same members."""
        data, expected = self.archive()
        got = list(iter_members(STREAMS[kind](data), url="u"))
        assert got == expected
        check_placement(data, got)

    @pytest.mark.parametrize("kind", sorted(STREAMS))
    def test_declined_members_are_skipped_in_place(self, kind: str) -> None:
        """keep=False skips a member (seeking or reading past it); offsets stay exact."""
        data, expected = self.archive()

        def keep(name: str) -> bool:
            return name not in {"big.bin", "d3.bin"}

        got = list(iter_members(STREAMS[kind](data), url="u", keep=keep))
        assert [(m.name, m.offset, m.end) for m in got] == [
            (m.name, m.offset, m.end) for m in expected
        ]
        assert [m.data for m in got] == [m.data if keep(m.name) else None for m in expected]

    @pytest.mark.parametrize("kind", sorted(STREAMS))
    def test_resume_at_a_member(self, kind: str) -> None:
        """skip= starts at a header boundary; offsets stay those of the whole stream."""
        data, expected = self.archive()
        for i in (1, 2, 5):
            got = list(iter_members(STREAMS[kind](data), url="u", skip=expected[i].offset))
            assert got == expected[i:]

    @pytest.mark.parametrize("kind", sorted(STREAMS))
    def test_resume_past_the_end(self, kind: str) -> None:
        """skip= past the end is an error at that offset (a seek finds it at the next header)."""
        data, _ = self.archive()
        n = len(data) + 512
        if kind == "seekable":  # seeked past the end: found missing at the next header
            match = rf"^u: no end-of-archive blocks: truncated \(at byte {n}\)$"
        else:
            match = rf"^u: the stream ends before offset {n} \(at byte {len(data)}\)$"
        with pytest.raises(TarFormatError, match=match):
            list(iter_members(STREAMS[kind](data), url="u", skip=n))

    @pytest.mark.parametrize("kind", ["seekable", "small-reads"])
    def test_byte_range_with_a_declined_member(self, kind: str) -> None:
        """A range holding a declined member larger than a chunk: skipped, and the range kept."""
        data, expected = self.archive()
        start, end = expected[1].offset, expected[4].end
        stream = STREAMS[kind](data[start:] + b"\xff" * 4096)

        def keep(name: str) -> bool:
            return name != "big.bin"

        got = list(iter_members(stream, url="u", base=start, limit=end - start, keep=keep))
        assert [(m.name, m.offset, m.end) for m in got] == [
            (m.name, m.offset, m.end) for m in expected[1:5]
        ]
        assert [m.data for m in got] == [None, *(m.data for m in expected[2:5])]

    @pytest.mark.parametrize(("first", "last"), [(0, 1), (1, 2), (2, 6), (0, 11)])
    def test_byte_ranges(self, first: int, last: int) -> None:
        """A range [offset of member first, end of member last - 1) read from its bytes only."""
        data, expected = self.archive()
        start, end = expected[first].offset, expected[last - 1].end
        for kind in ("seekable", "small-reads"):
            stream = STREAMS[kind](data[start:] + b"\xff" * 4096)
            got = list(iter_members(stream, url="u", base=start, limit=end - start))
            assert got == expected[first:last]


def pax_header(records: dict[str, str], kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A pax extended header (local ``x`` or global ``g``) holding ``records``."""
    return tarfile.TarInfo._create_pax_generic_header(records, kind, "utf-8")  # type: ignore[attr-defined,no-any-return]


def raw_member(name: str, data: bytes, size: int | None = None) -> bytes:
    """A ustar member whose header says ``size`` (default: the data's length)."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    return info.tobuf(format=tarfile.USTAR_FORMAT) + data + bytes(-len(data) % 512)


class TestExtendedHeaders:
    def test_pax_size_and_path_override_the_header(self) -> None:
        """A pax size= and path= win over the ustar fields; the member starts at the pax header."""
        data = pax_header({"size": "5", "path": "p/q.txt"}) + raw_member("a.txt", b"12345", 0)
        data += plain(1)[:1024] + bytes(1024)
        assert [tuple(m) for m in iter_members(io.BytesIO(data), url="u")] == [
            ("p/q.txt", b"12345", 0, 2048),
            ("m0.txt", b"A" * 100, 2048, 3072),
        ]

    @pytest.mark.parametrize(
        ("size", "problem"), [("abc", "bad pax size 'abc'"), ("-1", "bad pax size -1")]
    )
    def test_bad_pax_size(self, size: str, problem: str) -> None:
        """A pax size that is not a size is refused; skipping goes on at the next header."""
        data = (
            pax_header({"size": size})
            + raw_member("a.txt", b"12345")
            + plain(1)[:1024]
            + bytes(1024)
        )
        with pytest.raises(
            TarFormatError, match=f"^u: {problem} \\(member 'a.txt' at byte 1024\\)$"
        ):
            list(iter_members(io.BytesIO(data), url="u"))
        members, errors = collect(data)
        assert members == [
            Member("a.txt", None, 1024, -1),
            Member("m0.txt", b"A" * 100, 2048, 3072),
        ]
        assert [fatal for _, fatal in errors] == [False]

    def test_global_pax_header_does_not_hide_members(self) -> None:
        """A pax global header (tarfile's pax_headers) is read; the members follow unchanged."""
        out = io.BytesIO()
        with tarfile.open(
            fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "c"}
        ) as tar:
            add_member(tar, "a.txt", b"1" * 600)
            add_member(tar, "b.txt", b"2")
        data = out.getvalue()
        got = list(iter_members(io.BytesIO(data), url="u"))
        assert [(m.name, m.data) for m in got] == [("a.txt", b"1" * 600), ("b.txt", b"2")]
        assert got[0].offset == 0 and got[1].offset == got[0].end

    def test_long_link_names_are_read_and_dropped(self) -> None:
        """A GNU long link name (K) before a symlink: the link is skipped, the rest read."""

        def extra(tar: tarfile.TarFile) -> None:
            info = tarfile.TarInfo("link.txt")
            info.type, info.linkname = tarfile.SYMTYPE, "t" * 150
            tar.addfile(info)
            add_member(tar, "z.txt", b"z")

        assert ours(build([("a.txt", b"a")], tarfile.GNU_FORMAT, extra)) == [
            ("a.txt", b"a"),
            ("z.txt", b"z"),
        ]

    def test_truncated_long_name(self) -> None:
        """A long name cut short: an error at its header, fatal when skipping."""
        data = build([(LONG, b"x")], tarfile.GNU_FORMAT)[: 512 + 100]
        with pytest.raises(TarFormatError, match=r"^u: truncated extended header \(at byte 0\)$"):
            list(iter_members(io.BytesIO(data), url="u"))
        members, errors = collect(data)
        assert members == [Member("", None, 0, -1)]
        assert [fatal for _, fatal in errors] == [True]

    def test_bad_last_header_is_fatal(self) -> None:
        """A bad checksum with no valid header after it: the scan ends the stream (fatal)."""
        data = corrupt(plain(2), 1024, slice(148, 156), b"0000000\0", fix=False)
        members, errors = collect(data)
        assert members == [Member("m0.txt", b"A" * 100, 0, 1024), Member("m1.txt", None, 1024, -1)]
        assert [fatal for _, fatal in errors] == [True]


def header_with(name: str, data: bytes, **fields: bytes) -> bytes:
    """A ustar member with header fields replaced (offsets as keys ``at<N>``), checksummed."""
    raw = raw_member(name, data)
    for key, value in fields.items():
        at = int(key[2:])
        raw = corrupt(raw, 0, slice(at, at + len(value)), value)
    return raw


class TestHeaders:
    @pytest.mark.parametrize(
        "name",
        ["n" * 100, "d/" + "n" * 96 + ".txt", "d" * 60 + "/" + "n" * 99 + "x", "a=b.txt", ""],
    )
    @pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
    def test_names_filling_their_fields(self, name: str, fmt: int) -> None:
        """A 100-byte name (no NUL), a 1-byte ustar prefix, an empty name: as tarfile reads them."""
        data = build([("a.txt", b"a"), (name, b"x"), ("z.txt", b"z")], fmt)
        assert ours(data) == reference(data)

    def test_size_field_of_twelve_digits(self) -> None:
        """A size field of 12 octal digits with no NUL is read whole."""
        data = plain(1)[:1024] + header_with("a.txt", b"x" * 800, at124=b"%012o" % 800)
        assert ours(data + bytes(1024)) == [("m0.txt", b"A" * 100), ("a.txt", b"x" * 800)]

    @pytest.mark.parametrize(
        ("kind", "size"),
        [
            (tarfile.FIFOTYPE, 0),
            (tarfile.CHRTYPE, 0),
            (tarfile.SYMTYPE, 0),
            (tarfile.DIRTYPE, 0),
            (b"Q", 600),  # unknown types: their data is skipped
            (b"X", 600),
        ],
    )
    def test_non_regular_members_without_a_link_name(self, kind: bytes, size: int) -> None:
        """Members that are not regular files are skipped, with no link name to tell them."""
        info = tarfile.TarInfo("other.txt")
        info.type, info.size = kind, size
        head = info.tobuf(format=tarfile.USTAR_FORMAT) + b"\x01" * size + bytes(-size % 512)
        data = plain(2)[:1024] + head + plain(2)[1024:]
        members = list(iter_members(io.BytesIO(data), url="u"))
        assert [(m.name, m.offset) for m in members] == [
            ("m0.txt", 0),
            ("m1.txt", 1024 + len(head)),
        ]

    @pytest.mark.parametrize(("name", "yielded"), [("v7.txt", True), ("v7dir/", False)])
    @pytest.mark.parametrize("first", [True, False])
    def test_old_v7_type_flag(self, name: str, yielded: bool, first: bool) -> None:
        """A NUL type flag is a regular file, or a directory when the name ends in '/'."""
        v7, m0 = header_with(name, b"", at156=b"\0"), plain(1)[:1024]
        data = (v7 + m0 if first else m0 + v7) + bytes(1024)
        expected = [(name, b"")] if yielded else []
        got = ours(data)
        assert got == (
            [*expected, ("m0.txt", b"A" * 100)] if first else [("m0.txt", b"A" * 100), *expected]
        )

    @pytest.mark.parametrize("first", [True, False])
    def test_name_that_is_not_utf8(self, first: bool) -> None:
        """A name in another encoding keeps its bytes as surrogates."""
        data = corrupt(plain(2), 0 if first else 1024, slice(0, 100), b"\xe9t\xe9.txt" + bytes(93))
        names = [n for n, _ in ours(data)]
        assert names == (
            ["\udce9t\udce9.txt", "m1.txt"] if first else ["m0.txt", "\udce9t\udce9.txt"]
        )

    def test_one_byte_after_the_last_member(self) -> None:
        """A stream ending in a piece of a header: truncated, at that header."""
        with pytest.raises(TarFormatError, match=r"^u: truncated header \(at byte 2048\)$"):
            list(iter_members(io.BytesIO(plain(2)[:2048] + b"x"), url="u"))

    def test_stream_ending_after_an_extended_header(self) -> None:
        """An extended header at the start and nothing after it: a truncated header."""
        with pytest.raises(TarFormatError, match=r"^u: truncated header \(at byte 1024\)$"):
            list(iter_members(io.BytesIO(pax_header({"comment": "c"})), url="u"))

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            (slice(148, 156), b"0000000\0", "bad header checksum (member 'm1.txt' at byte 1024)"),
            (
                slice(124, 136),
                b"zz\0" + bytes(9),
                "bad header: a numeric field is not octal (member 'm1.txt' at byte 1024)",
            ),
            (
                slice(0, 100),
                b"../m1.txt" + bytes(91),
                "unsafe member name (absolute, with a '..' component or a NUL byte) "
                "(member '../m1.txt' at byte 1024)",
            ),
        ],
    )
    def test_error_messages(self, field: slice, value: bytes, message: str) -> None:
        """Errors read '{url}: {problem} (member ... at byte N)'."""
        data = corrupt(plain(3), 1024, field, value, fix=field.start != 148)
        with pytest.raises(TarFormatError) as info:
            list(iter_members(io.BytesIO(data), url="u"))
        assert str(info.value) == f"u: {message}"

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (b"", "u: empty file (at byte 0)"),
            (plain(1)[:1024], "u: no end-of-archive blocks: truncated (at byte 1024)"),
        ],
    )
    def test_end_messages(self, data: bytes, message: str) -> None:
        """An empty stream and a stream without its end blocks: exact messages."""
        with pytest.raises(TarFormatError) as info:
            list(iter_members(io.BytesIO(data), url="u"))
        assert str(info.value) == message

    def test_zero_block_message(self) -> None:
        """A lone zero block: the message and its offset."""
        data = plain(2)[:1024] + bytes(512) + plain(2)[1024:]
        with pytest.raises(TarFormatError) as info:
            list(iter_members(io.BytesIO(data), url="u"))
        assert str(info.value) == "u: an all-zero block in the middle of the archive (at byte 1024)"

    def test_scan_passes_blocks_that_only_look_like_headers(self) -> None:
        """Going on past a bad header skips data blocks whose checksum field is not octal."""
        fake = bytearray(b"\x01" * 512)
        fake[148:156], fake[156] = b"zzzzzzzz", ord("0")
        data = corrupt(plain(1)[:1024], 0, slice(148, 156), b"0000000\0", fix=False)
        data += bytes(fake) + plain(2)[1024:]
        members, errors = collect(data)
        assert members == [Member("m0.txt", None, 0, -1), Member("m1.txt", b"B" * 100, 1536, 2560)]
        assert len(errors) == 1

    def test_extended_headers_count_per_member(self) -> None:
        """MAX_EXTENDED extended headers are allowed before each member, bad ones included."""
        long = tarfile.TarInfo._create_gnu_long_header(  # type: ignore[attr-defined]
            "m1.txt", tarfile.GNUTYPE_LONGNAME, "utf-8", "strict"
        )
        bad = corrupt(plain(1)[:1024], 0, slice(148, 156), b"0000000\0", fix=False)
        for head in (plain(1)[:1024], bad):
            data = head + long * MAX_EXTENDED + plain(2)[1024:2048] + bytes(1024)
            members, errors = collect(data)
            assert [m.name for m in members] == ["m0.txt", "m1.txt"]
            assert members[1] == Member("m1.txt", b"B" * 100, 1024, 2048 + 1024 * MAX_EXTENDED)
            assert len(errors) == (head is bad)

    def test_scan_keeps_the_pax_path_of_the_next_member(self) -> None:
        """After a bad header, the next member keeps its pax path and starts at its pax header."""
        data = build([("a.txt", b"1"), (LONG, b"2"), ("c.txt", b"3")], tarfile.PAX_FORMAT)
        members, _ = collect(corrupt(data, 0, slice(148, 156), b"0000000\0", fix=False))
        assert [(m.name, m.offset) for m in members] == [
            ("a.txt", 0),
            (LONG, 1024),
            ("c.txt", 3072),
        ]

    @pytest.mark.parametrize(("size", "errors"), [(1 << 62, 1), ((1 << 62) - 512, 2)])
    def test_skip_over_an_absurd_oversized_member(self, size: int, errors: int) -> None:
        """An oversized member too large for any stream ends the shard; a smaller one is seeked."""
        data = header_with("big.txt", b"", at124=b"\x80" + size.to_bytes(11, "big"))
        members, reported = collect(data + plain(1))
        assert members[0] == Member("big.txt", None, 0, -1)
        assert len(reported) == errors
        assert "larger than max_member_bytes" in str(reported[0][0])


class TestPax:
    def test_records_after_a_nul(self) -> None:
        """NUL bytes after the records, inside the header's size, end the records."""
        records = b"15 path=pq.txt\n" + bytes(10)
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = tarfile.XHDTYPE, len(records)
        head = info.tobuf(format=tarfile.USTAR_FORMAT) + records + bytes(512 - len(records))
        data = head + raw_member("a.txt", b"1") + bytes(1024)
        assert ours(data) == [("pq.txt", b"1")]

    def test_undecodable_path(self) -> None:
        """A pax path that is not UTF-8 keeps its bytes as surrogates."""
        records = b"15 path=\xffq.txt\n"
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = tarfile.XHDTYPE, len(records)
        head = info.tobuf(format=tarfile.USTAR_FORMAT) + records + bytes(512 - len(records))
        assert ours(head + raw_member("a.txt", b"1") + bytes(1024)) == [("\udcffq.txt", b"1")]

    def test_second_record_running_past_the_data(self) -> None:
        """A record past the header's data, after a good one: a bad pax header, not a crash."""
        pax = bytearray(pax_header({"comment": "c", "path": "xxxxx.txt"}))
        at = pax.index(b" path=", 512)
        pax[at - 2 : at] = b"20"  # 2 bytes more than there are
        data = bytes(pax) + plain(2)[:2048] + bytes(1024)
        with pytest.raises(TarFormatError) as info:
            list(iter_members(io.BytesIO(data), url="u"))
        assert str(info.value) == "u: bad pax header (at byte 0)"
        assert str(info.value.__cause__) == f"bad pax record at {at - 2 - 512}"
        members, errors = collect(data)
        assert members == [
            Member("", None, 0, -1),
            Member("m0.txt", None, 1024, -1),
            Member("m1.txt", b"B" * 100, 2048, 3072),
        ]
        assert errors[0][0].url == "u" and errors[0][0].offset == 0

    @pytest.mark.parametrize(
        ("records", "expected"),
        [({"size": "0"}, ("a.txt", b"")), ({"path": "x=y.txt"}, ("x=y.txt", b"12345"))],
    )
    def test_records(self, records: dict[str, str], expected: tuple[str, bytes]) -> None:
        """A pax size of 0 (an empty file) and a path holding '='."""
        data = plain(1)[:1024] + pax_header(records) + raw_member("a.txt", b"12345")
        if records.get("size") == "0":  # the header's 5 bytes are not the member's
            data = plain(1)[:1024] + pax_header(records) + raw_member("a.txt", b"", size=5)
        assert ours(data + bytes(1024)) == [("m0.txt", b"A" * 100), expected]

    def test_global_and_local_records(self) -> None:
        """Global pax records apply to every later member; a local one wins for its member."""
        out = io.BytesIO()
        with tarfile.open(
            fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"path": "g.txt"}
        ) as tar:
            add_member(tar, "a.txt", b"1")
            add_member(tar, LONG, b"2")  # a local path record
            add_member(tar, "c.txt", b"3")
        data = out.getvalue()
        assert ours(data) == reference(data) == [("g.txt", b"1"), (LONG, b"2"), ("g.txt", b"3")]

    def test_extended_header_size_limit(self) -> None:
        """A long name of exactly 1 MiB is read; one byte more is refused with its size."""
        name = "a" * ((1 << 20) - 5) + ".txt"
        data = build([(name, b"x")], tarfile.GNU_FORMAT)
        assert ours(data) == [(name, b"x")]
        data = build([(name + "x", b"x")], tarfile.GNU_FORMAT)
        with pytest.raises(TarFormatError) as info:
            ours(data)
        assert str(info.value) == (
            "mem://t.tar: extended header of 1048577 bytes (limit 1048576) (at byte 0)"
        )
