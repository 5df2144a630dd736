"""The only module that talks to fsspec: opening (seekable streams), globbing, listing, writing.

Every function takes a URL in fsspec's grammar (a local path, ``file://``, ``memory://``,
``s3://``, ``gs://``, ``az://``, ``https://``, chained ``simplecache::s3://…``) and the
``storage_options`` given by the user, passed through unchanged to the filesystem.
Errors are translated into ones that name the URL: a missing file is a
:class:`~shardpipes.errors.ShardNotFoundError`, a missing backend an ``ImportError`` that
says which extra to install.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from fsspec.core import url_to_fs as _fsspec_url_to_fs

from shardpipes.errors import ShardNotFoundError

__all__ = [
    "READ_STATS",
    "ReadStats",
    "exists",
    "glob",
    "has_magic",
    "listdir",
    "open_input",
    "open_output",
    "size",
    "url_to_fs",
    "walk",
]

StorageOptions = Mapping[str, Any]

# protocol -> the shardpipes extra that installs its fsspec backend
_EXTRAS = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "adl": "azure",
    "http": "http",
    "https": "http",
}

_MAGIC = ("*", "?", "[")


def has_magic(url: str) -> bool:
    """Return whether ``url`` holds glob characters (``*``, ``?``, ``[``)."""
    return any(c in url.rsplit("::", 1)[-1] for c in _MAGIC)


def _protocol(url: str) -> str:
    last = url.rsplit("::", 1)[-1]
    return last.split("://", 1)[0] if "://" in last else "file"


def url_to_fs(url: str, storage_options: StorageOptions | None = None) -> tuple[Any, str]:
    """Resolve ``url`` to an fsspec filesystem instance and the path within it.

    Args:
        url: Any fsspec URL, chained URLs included.
        storage_options: Keyword arguments for the filesystem (credentials, endpoint…).

    Returns:
        ``(filesystem, path)``.

    Raises:
        ImportError: The backend for the URL's protocol is not installed; the message names
            the install command.
        ValueError: The protocol is unknown to fsspec.
    """
    try:
        fs, path = _fsspec_url_to_fs(url, **dict(storage_options or {}))
    except ImportError as exc:
        proto = _protocol(url)
        extra = _EXTRAS.get(proto)
        hint = (
            f"pip install 'shardpipes[{extra}]'"
            if extra
            else f"install the fsspec backend for {proto!r}"
        )
        msg = f"{url}: reading {proto}:// URLs needs an extra package: {hint}"
        raise ImportError(msg) from exc
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            msg = f"{url}: unknown protocol {_protocol(url)!r}"
            raise ValueError(msg) from exc
        raise
    return fs, str(path)


def _display(url: str, fs: Any, path: str) -> str:
    """Turn a path found by ``fs`` back into a URL in the same style as ``url``."""
    if "::" in url:
        return f"{url.rsplit('::', 1)[0]}::{fs.unstrip_protocol(path)}"
    if "://" in url:
        return str(fs.unstrip_protocol(path))
    # a plain local path: keep it plain (relative stays relative when the pattern was)
    if os.path.isabs(url):
        return path
    return os.path.relpath(path)


def glob(pattern: str, storage_options: StorageOptions | None = None) -> list[str]:
    """Expand one glob pattern (``*``, ``?``, ``[…]``, ``**``) to sorted URLs of files.

    Args:
        pattern: A URL with glob characters.
        storage_options: Passed to the filesystem.

    Returns:
        The matching files, sorted, as URLs in the pattern's own style.
    """
    fs, path = url_to_fs(pattern, storage_options)
    found = fs.glob(path, detail=True)
    files = sorted(p for p, info in found.items() if info.get("type") != "directory")
    return [_display(pattern, fs, p) for p in files]


def exists(url: str, storage_options: StorageOptions | None = None) -> bool:
    """Return whether ``url`` names an existing file or directory."""
    fs, path = url_to_fs(url, storage_options)
    return bool(fs.exists(path))


def size(url: str, storage_options: StorageOptions | None = None) -> int:
    """Return the size of the file at ``url`` in bytes.

    Raises:
        ShardNotFoundError: If it does not exist.
    """
    fs, path = url_to_fs(url, storage_options)
    with _not_found(url):
        return int(fs.size(path))


def listdir(url: str, storage_options: StorageOptions | None = None) -> list[tuple[str, bool]]:
    """List a directory: sorted ``(url, is_dir)`` pairs of its entries.

    Raises:
        ShardNotFoundError: If the directory does not exist.
    """
    fs, path = url_to_fs(url, storage_options)
    with _not_found(url):
        entries = fs.ls(path, detail=True)
    out = [
        (_display(url, fs, e["name"]), e.get("type") == "directory")
        for e in entries
        if e["name"].rstrip("/") != path.rstrip("/")
    ]
    return sorted(out)


Entry = tuple[tuple[str, ...], str, bool]


def walk(url: str, storage_options: StorageOptions | None = None) -> Iterator[Entry]:
    """Walk the folder ``url``: ``(parts, url, is_dir)`` of everything under it, sorted.

    ``parts`` is the entry's path relative to ``url``, split on ``/``; a folder comes before
    its contents, and the entries of one folder are in name order. On a local disk
    symbolic links never lead out: a link to a folder is not followed, and a link to a file
    outside ``url`` is left out.

    Raises:
        ShardNotFoundError: If ``url`` is not a folder.
    """
    filesystem, path = url_to_fs(url, storage_options)
    if not filesystem.isdir(path):
        msg = "no such folder"
        raise ShardNotFoundError(msg, url=url)
    local = "file" in _protocols(filesystem)
    real_root = os.path.realpath(path) if local else None
    yield from _walk(url.rstrip("/"), path, (), real_root, storage_options)


def _protocols(filesystem: Any) -> tuple[str, ...]:
    protocol = filesystem.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _walk(
    url: str,
    path: str,
    parts: tuple[str, ...],
    real_root: str | None,
    options: StorageOptions | None,
) -> Iterator[Entry]:
    for name, is_dir in _entries(url, path, real_root, options):
        child = (*parts, name)
        yield child, f"{url}/{name}", is_dir
        if is_dir:
            yield from _walk(f"{url}/{name}", os.path.join(path, name), child, real_root, options)


def _entries(
    url: str, path: str, real_root: str | None, options: StorageOptions | None
) -> list[tuple[str, bool]]:
    """Sorted ``(name, is_dir)`` of one folder, with the local symlink rule applied."""
    if real_root is None:
        return sorted((u.rstrip("/").rsplit("/", 1)[-1], d) for u, d in listdir(url, options))
    out = []
    for entry in os.scandir(path):
        if entry.is_symlink() and (
            entry.is_dir() or not os.path.realpath(entry.path).startswith(real_root + os.sep)
        ):
            continue  # never follow a link to a folder, nor one out of the walked folder
        out.append((entry.name, entry.is_dir(follow_symlinks=False)))
    return sorted(out)


@contextlib.contextmanager
def _not_found(url: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError as exc:
        if isinstance(exc, ShardNotFoundError):
            raise
        msg = "no such file"
        raise ShardNotFoundError(msg, url=url) from exc


class ReadStats:
    """Bytes read and files opened through :func:`open_input` in this process.

    ``shardpipes.fs.READ_STATS`` counts what the pipes consume (what a resumed epoch
    reads again, what each worker reads of an indexed shard); a backend's read-ahead may
    transfer more.
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.opens = 0

    def reset(self) -> None:
        """Start counting from zero."""
        self.bytes = self.opens = 0


READ_STATS = ReadStats()


class _Counted:
    """A read stream that adds the bytes it returns to :data:`READ_STATS`."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        READ_STATS.bytes += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stream)


def open_input(url: str, storage_options: StorageOptions | None = None) -> IO[bytes]:
    """Open ``url`` for binary reading, streaming (seekable where the backend allows).

    Reads are counted in :data:`READ_STATS`.

    Raises:
        ShardNotFoundError: If it does not exist.
    """
    fs, path = url_to_fs(url, storage_options)
    with _not_found(url):
        stream = fs.open(path, "rb")
    READ_STATS.opens += 1
    return _Counted(stream)  # type: ignore[return-value]


def open_output(url: str, storage_options: StorageOptions | None = None) -> IO[bytes]:
    """Open ``url`` for binary writing, creating parent directories where needed."""
    fs, path = url_to_fs(url, storage_options)
    parent = fs._parent(path)
    if parent:
        with contextlib.suppress(OSError):
            fs.makedirs(parent, exist_ok=True)
    return fs.open(path, "wb")  # type: ignore[no-any-return]
