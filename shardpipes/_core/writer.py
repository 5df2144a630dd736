"""Writing WebDataset-compatible tar shards, split by size or by sample count.

Each sample is a dict with ``"__key__"`` and one entry per extension; it becomes the
consecutive members ``{key}.{ext}`` of one shard, so shardpipes and WebDataset read it
back as the same sample. Shards are numbered printf-style (``out/train-%06d.tar``), as
WebDataset's ``ShardWriter`` does, and opened through a caller-given ``opener`` (the CLI
passes ``shardpipes.fs.open_output``), so this module never touches a filesystem itself.

Member headers come from Python's :mod:`tarfile` in pax format (long and non-ASCII names
work) with fixed metadata: mtime 0, mode ``0o644``, uid/gid 0, empty user and group names,
so the same samples always give the same bytes. A shard ends with the two zero blocks of
the tar format and no record padding, so its size is exactly what ``max_bytes`` counts.
"""

from __future__ import annotations

import contextlib
import re
import tarfile
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import IO, Any, NamedTuple

from shardpipes._core.index import dump_index

BLOCK = 512
_TRAILER = bytes(2 * BLOCK)
_FIELD = re.compile(r"%(%|[-+ #0]*\d*(?:\.\d+)?([a-zA-Z]))")
_DRIVE = re.compile(r"^[A-Za-z]:")
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*", re.IGNORECASE)


class ShardInfo(NamedTuple):
    """A shard written by :class:`TarShardWriter`: its URL, sample count and tar size in bytes.

    The size is the tar's, before any compression (a ``.tar.gz`` is smaller on disk).
    """

    url: str
    samples: int
    size: int


def check_pattern(pattern: str) -> str:
    """Validate a printf-style shard pattern with exactly one integer field.

    Example:
        >>> check_pattern("out/train-%06d.tar") % 7
        'out/train-000007.tar'
        >>> check_pattern("out/train.tar")
        Traceback (most recent call last):
        ...
        ValueError: pattern must hold exactly one integer field such as %06d (got 'out/train.tar')
    """
    ok = isinstance(pattern, str)
    if ok:
        fields = [m.group(2) for m in _FIELD.finditer(pattern) if m.group(1) != "%"]
        ok = fields in (["d"], ["i"], ["u"]) and "%" not in _FIELD.sub("", pattern)
    if not ok:
        msg = f"pattern must hold exactly one integer field such as %06d (got {pattern!r})"
        raise ValueError(msg)
    return pattern


def pattern_parts(pattern: str) -> tuple[str, str]:
    """The text before and after a shard pattern's integer field (``%%`` as ``%``).

    Example:
        >>> pattern_parts("out/100%%/train-%06d.tar")
        ('out/100%/train-', '.tar')
    """
    field = next(m for m in _FIELD.finditer(check_pattern(pattern)) if m.group(1) != "%")
    head, tail = pattern[: field.start()], pattern[field.end() :]
    return head.replace("%%", "%"), tail.replace("%%", "%")


def size_option(name: str, size: int | str, minimum: int, example: str) -> int:
    """An option given in bytes: an int, or a text such as ``example`` (see :func:`parse_size`).

    Raises:
        TypeError: If it is neither.
        ValueError: If it is below ``minimum`` or the text is no size.
    """
    if isinstance(size, bool) or not isinstance(size, int | str):
        msg = f"{name} must be bytes or a text such as {example!r} (got {size!r})"
        raise TypeError(msg)
    try:
        value = parse_size(size) if isinstance(size, str) else size
    except ValueError as exc:
        msg = f"{name}: {exc}"
        raise ValueError(msg) from exc
    if value < minimum:
        msg = f"{name} must be at least {minimum} byte{'' if minimum == 1 else 's'} (got {size!r})"
        raise ValueError(msg)
    return value


def parse_size(text: str) -> int:
    """Parse a size such as ``256MB``, ``1GiB``, ``500k`` or ``4096`` into bytes.

    Raises:
        ValueError: ``text`` is not such a size, or is below 1 byte.

    Example:
        >>> parse_size("256MB"), parse_size("1GiB"), parse_size("500k"), parse_size("4096")
        (256000000, 1073741824, 500000, 4096)
    """
    match = _SIZE.fullmatch(text)
    if not match or (match.group(3) and not match.group(2)):
        msg = f"size must look like 256MB, 1GiB, 500k or 4096 (got {text!r})"
        raise ValueError(msg)
    unit = match.group(2).lower()
    scale = 1024 ** "kmgt".index(unit) * 1024 if match.group(3) else _UNITS[unit]
    value = int(float(match.group(1)) * scale)
    if value < 1:
        msg = f"size must be at least 1 byte (got {text!r})"
        raise ValueError(msg)
    return value


def check_key(key: object) -> str:
    """Return ``key`` if it is safe as a member path, else raise ``ValueError`` naming it.

    Refused: non-strings, empty keys or components (``a//b``, a trailing ``/``), ``.`` and
    ``..`` components, absolute paths, drive letters, backslashes, NUL bytes, and a dot in
    the last component (it would move the key/extension split on reading).

    Example:
        >>> check_key("train/n01440764_10026")
        'train/n01440764_10026'
        >>> check_key("../etc/passwd")
        Traceback (most recent call last):
        ...
        ValueError: key '../etc/passwd' is unsafe: it has a '..' component
    """
    if not isinstance(key, str):
        msg = f"__key__ must be a string (got {key!r})"
        raise TypeError(msg)
    problem = _key_problem(key)
    if problem:
        msg = f"key {key!r} is unsafe: {problem}"
        raise ValueError(msg)
    return key


def _key_problem(key: str) -> str | None:
    if "\0" in key:
        return "it holds a NUL byte"
    if "\\" in key:
        return "it holds a backslash"
    if key.startswith("/") or _DRIVE.match(key):
        return "it is an absolute path"
    parts = key.split("/")
    if ".." in parts:
        return "it has a '..' component"
    if "." in parts or "" in parts:
        return "it has an empty or '.' component"
    if "." in parts[-1]:
        stem = parts[-1].split(".", 1)[0]
        return (
            f"its last component holds a dot: readers split a member name at that dot, so "
            f"the key would come back as {stem!r}; replace the dots (e.g. "
            f"{parts[-1].replace('.', '_')!r})"
        )
    return None


def _extension(key: str, ext: object) -> str:
    if not isinstance(ext, str) or not ext or any(c in ext for c in "/\\\0") or ext[0] == ".":
        msg = f"extension of sample {key!r} must be a non-empty name without slashes (got {ext!r})"
        raise ValueError(msg)
    return ext


def _payload(key: str, ext: str, value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    msg = f"sample {key!r} field {ext!r} must be bytes or str (got {type(value).__name__})"
    raise TypeError(msg)


def _member(name: str, data: bytes) -> bytes:
    """One member: its header block(s), its data, padding to a block boundary."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    return header + data + bytes(-len(data) % BLOCK)


def encode_sample(sample: Mapping[str, Any]) -> tuple[str, bytes]:
    """Return a sample's key and its members as tar bytes (fields named ``__…`` are left out).

    Example:
        >>> key, data = encode_sample({"__key__": "a", "__url__": "x.tar", "cls": b"1"})
        >>> key, len(data)
        ('a', 1024)
    """
    key = check_key(sample.get("__key__"))
    parts = [
        _member(f"{key}.{_extension(key, ext)}", _payload(key, ext, value))
        for ext, value in sample.items()
        if not (isinstance(ext, str) and ext.startswith("__"))
    ]
    if not parts:
        msg = f"sample {key!r} has no fields to write"
        raise ValueError(msg)
    return key, b"".join(parts)


class TarShardWriter:
    """Write samples to numbered tar shards, starting a new one when a limit would be passed.

    A shard never holds more than ``max_samples`` samples, and its file is never larger
    than ``max_bytes`` (headers, padded data and the end-of-archive blocks counted) unless
    one sample alone is larger, in which case that sample gets a shard of its own.

    Args:
        pattern: Shard URL with one printf integer field, e.g. ``"s3://b/train-%06d.tar"``.
        opener: Called with a shard URL; returns a binary stream to write it to (closed
            by the writer).
        max_bytes: Size limit of a shard in bytes, or ``None``.
        max_samples: Sample limit of a shard, or ``None``.
        remove: Called with a shard's URL to delete it: the shard being written when the
            ``with`` block raises (``None``: its stream is closed and left).
        single: ``pattern`` is one archive's URL, with no limits.
        index: Write each shard's ``URL.idx`` sidecar (its samples' byte ranges, see
            :mod:`shardpipes._core.index`) through ``opener`` once the shard is finished.

    Attributes:
        shards: A :class:`ShardInfo` for every shard finished so far, in order.

    Example:
        >>> import fsspec
        >>> def opener(url):
        ...     return fsspec.open(url, "wb").open()
        >>> with TarShardWriter("memory://doc/w-%03d.tar", opener=opener, max_samples=2) as w:
        ...     for i in range(3):
        ...         w.write({"__key__": f"s{i}", "txt": f"sample {i}", "cls": b"0"})
        >>> [(s.url, s.samples) for s in w.shards]
        [('memory://doc/w-000.tar', 2), ('memory://doc/w-001.tar', 1)]
    """

    def __init__(
        self,
        pattern: str,
        *,
        opener: Callable[[str], IO[bytes]],
        max_bytes: int | None = None,
        max_samples: int | None = None,
        remove: Callable[[str], object] | None = None,
        single: bool = False,
        index: bool = False,
    ) -> None:
        self.pattern = pattern if single else check_pattern(pattern)
        self.single = single
        self.index = bool(index)
        self.remove = remove
        self.first = 0  # the number of the first shard
        self.post: Callable[[ShardInfo], object] | None = None  # called as each one is finished
        self.closed = False
        if not callable(opener):
            msg = f"opener must be callable (got {opener!r})"
            raise TypeError(msg)
        for name, value in (("max_bytes", max_bytes), ("max_samples", max_samples)):
            if value is not None and (type(value) is not int or value < 1):
                msg = f"{name} must be a positive integer or None (got {value!r})"
                raise ValueError(msg)
        self.opener = opener
        self.max_bytes = max_bytes
        self.max_samples = max_samples
        self.shards: list[ShardInfo] = []
        self._stream: IO[bytes] | None = None
        self._url = ""
        self._count = 0
        self._size = 0
        self._ranges: list[tuple[int, int]] = []  # each sample's bytes in the shard
        self._last_key: str | None = None

    @property
    def samples(self) -> int:
        """The number of samples written so far, over all shards."""
        return sum(s.samples for s in self.shards) + self._count

    def write(self, sample: Mapping[str, Any]) -> None:
        """Append one sample, first starting a new shard if it would pass a limit.

        Raises:
            ValueError: The key is unsafe (see :func:`check_key`), an extension is bad,
                the sample has no fields, or its key repeats the previous sample's key.
            TypeError: A field is neither bytes nor str.
        """
        if self.closed:
            msg = f"{self.pattern}: the writer is closed"
            raise ValueError(msg)
        key, data = encode_sample(sample)
        if self._stream is not None and self._full(len(data)):
            self._finish()
        if key == self._last_key:
            msg = f"key {key!r} repeats the previous sample's key (it would merge with it)"
            raise ValueError(msg)
        if self._stream is None:
            number = self.first + len(self.shards)
            self._url = self.pattern if self.single else self.pattern % number
            self._stream = self.opener(self._url)
        self._stream.write(data)
        self._ranges.append((self._size, self._size + len(data)))
        self._count += 1
        self._size += len(data)
        self._last_key = key

    def _full(self, size: int) -> bool:
        if self.max_samples is not None and self._count >= self.max_samples:
            return True
        return self.max_bytes is not None and self._size + size + len(_TRAILER) > self.max_bytes

    def _finish(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            stream.write(_TRAILER)
        finally:
            stream.close()
        finished = ShardInfo(self._url, self._count, self._size + len(_TRAILER))
        if self.index:
            with contextlib.closing(self.opener(self._url + ".idx")) as sidecar:
                sidecar.write(dump_index(self._ranges, finished.size))
        self.shards.append(finished)
        self._count, self._size, self._last_key, self._ranges = 0, 0, None, []
        if self.post is not None:
            self.post(finished)

    def close(self) -> list[ShardInfo]:
        """Finish the current shard; return every shard written.

        One archive (``single``) with no sample is written all the same: an empty tar.
        """
        if self.single and not self.shards and self._stream is None and not self.closed:
            self._url, self._stream = self.pattern, self.opener(self.pattern)
        self._finish()
        self.closed = True
        return list(self.shards)

    def abort(self) -> None:
        """Drop the shard being written (``remove`` deletes its file); keep the finished ones."""
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
            if self.remove is not None:
                self.remove(self._url)
        self._count, self._size, self._last_key, self._ranges = 0, 0, None, []
        self.closed = True

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # nothing half-written is left: the shard being written goes
            self.abort()
