"""The 512-byte tar header, parsed: names, sizes, checksums, pax records, and the refusals.

:mod:`shardpipes._core.tar` reads the stream; this module reads one header at a time and
says what is wrong with it. Each refusal is a :class:`BadMember`, which carries the
:class:`~shardpipes.errors.TarFormatError` to report and how the reader can go on past it
(:class:`Then`, or a count of bytes to skip).
"""

from __future__ import annotations

import enum
import struct
import zlib

from shardpipes.errors import TarFormatError

BLOCK = 512
_SIGNED = struct.Struct("148b8x356b")
_TAR_NAMES = (".tar", ".tar.gz", ".tgz")
_NO_HEADER = frozenset(
    ("truncated header", "bad header checksum", "bad header: a numeric field is not octal")
)


class Then(enum.Enum):
    """How the reader goes on after a bad member whose data it cannot simply skip."""

    STOP = "the stream cannot be followed further"
    SCAN = "look for the next block that is a valid header"
    DROP = "drop the next member (its pax header was bad), then go on"
    GO_ON = "nothing was lost (a lone zero block): read the next header"


class BadMember(Exception):  # noqa: N818 - internal control flow, never escapes
    """A bad member, and how to go on past it: a :class:`Then`, or skip that many bytes."""

    def __init__(self, error: TarFormatError, then: Then | int) -> None:
        super().__init__(error)
        self.error, self.then = error, then


def nts(field: bytes) -> str:
    """A NUL-terminated text field."""
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def number(field: bytes) -> int:
    """Parse a numeric header field: octal text, or GNU base-256."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0]
    return int(text, 8) if text.strip() else 0  # int() itself allows surrounding spaces


def _sum(data: bytes) -> int:
    """The byte sum of at most 256 bytes, in C: adler32's low half is 1 + the sum mod 65521."""
    return (zlib.adler32(data) & 0xFFFF) - 1


def checksum_ok(header: bytes) -> bool:
    """Whether the header's checksum is right (unsigned, or the signed form old tars wrote)."""
    stored = number(header[148:156])
    # the checksum field counts as 8 spaces (256); three pieces of <= 256 bytes each
    unsigned = 256 + _sum(header[:148]) + _sum(header[156:356]) + _sum(header[356:])
    return stored == unsigned or stored == 256 + sum(_SIGNED.unpack_from(header))


def parse(header: bytes, url: str, pos: int) -> tuple[str, int, int]:
    """Return ``(name, size, typeflag)`` of one header block."""
    name = nts(header[0:100])
    # a damaged header's name is reported (and marks the sample) only if it reads as text
    shown = name if name and name.isprintable() else None
    try:
        ok = checksum_ok(header)
        size = number(header[124:136])
    except ValueError as exc:
        msg = "bad header: a numeric field is not octal"
        raise TarFormatError(msg, url=url, member=shown, offset=pos) from exc
    if not ok:
        msg = "bad header checksum"
        raise TarFormatError(msg, url=url, member=shown, offset=pos)
    if size < 0:
        msg = f"bad header: negative size {size}"
        raise TarFormatError(msg, url=url, member=shown, offset=pos)
    kind = header[156]
    if header[345] and kind not in b"LKS":  # a ustar prefix (GNU uses the bytes otherwise)
        name = f"{nts(header[345:500])}/{name}"
    return name, size, kind


def pax_records(meta: bytes, url: str, pos: int) -> dict[str, str]:
    r"""The records (``"%d %s=%s\\n"``) of a pax header; a bad one drops the member it describes."""
    out, at = {}, 0
    try:
        while at < len(meta) and meta[at] != 0:
            space = meta.index(b" ", at)
            length = int(meta[at:space])
            record = meta[space + 1 : at + length - 1]
            if not space - at < length <= len(meta) - at or meta[at + length - 1] != 0x0A:
                raise ValueError(f"bad pax record at {at}")  # noqa: EM102 - rewrapped below
            key, _, value = record.partition(b"=")
            out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
            at += length
    except (ValueError, UnicodeDecodeError) as exc:
        error = TarFormatError("bad pax header", url=url, offset=pos)
        error.__cause__ = exc
        raise BadMember(error, Then.DROP) from exc
    return out


def apply_pax(
    records: dict[str, str], name: str, size: int, padded: int, url: str, pos: int
) -> tuple[str, int, int]:
    """The member's ``(name, size, padded size)`` once its pax records are applied."""
    name = records.get("path", name)
    if "size" in records:
        try:
            size = int(records["size"])
        except ValueError as exc:
            msg = f"bad pax size {records['size']!r}"
            raise TarFormatError(msg, url=url, member=name, offset=pos) from exc
        if size < 0:
            msg = f"bad pax size {size}"
            raise TarFormatError(msg, url=url, member=name, offset=pos)
        padded = size + (-size) % BLOCK
    return name, size, padded


def check(name: str, size: int, padded: int, max_size: int, url: str, offset: int) -> None:
    """Refuse an unsafe name or an oversized member (its data is then skipped)."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or "\0" in name or ".." in parts:
        msg = "unsafe member name (absolute, with a '..' component or a NUL byte)"
        raise BadMember(TarFormatError(msg, url=url, member=name, offset=offset), padded)
    if size > max_size:
        msg = f"member of {size} bytes is larger than max_member_bytes={max_size}"
        raise BadMember(TarFormatError(msg, url=url, member=name, offset=offset), padded)


def not_a_tar(error: TarFormatError, url: str) -> TarFormatError:
    """The error of a stream's very first header: if it is no tar header, likely no tar at all.

    An error that is a tar's own fault (not that a block is no header) is returned as it is.
    """
    if error.problem not in _NO_HEADER:
        return error
    name = url.rstrip("/").rpartition("/")[2]
    hint = ""
    if not name.lower().endswith(_TAR_NAMES):
        hint = f"; is {name!r} a shard? A glob such as 'train-*.tar' matches tar files only"
    msg = f"not a tar archive: no tar header at its start ({error.problem}){hint}"
    found = TarFormatError(msg, url=url, member=error.member, offset=0)
    found.__cause__ = error.__cause__
    return found
