"""The streaming tar reader, against Python's tarfile and GNU tar."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardpipes._core.tar import CHUNK, iter_members
from shardpipes.errors import StorageError, TarFormatError
from tests.conftest import add_member


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
