"""Finding, looking up and writing files: globs, listings, sizes, existence, outputs.

Every metadata call is retried (:mod:`shardpipes.fs.retry`) and its errors name the URL.
"""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from shardpipes.errors import ShardNotFoundError
from shardpipes.fs.backends import (
    StorageOptions,
    T,
    _http_client,
    _protocol,
    _protocols,
    is_remote,
    url_to_fs,
)
from shardpipes.fs.http_client import HttpClient
from shardpipes.fs.reads import file_size
from shardpipes.fs.resilient import call_storage
from shardpipes.fs.retry import RetryPolicy

_MAGIC = ("*", "?", "[")


def has_magic(url: str) -> bool:
    """Return whether ``url`` holds glob characters (``*``, ``?``, ``[``)."""
    return any(c in url.rsplit("::", 1)[-1] for c in _MAGIC)


def is_folder(url: str) -> bool:
    """Whether ``url`` names a folder: it ends with ``/``, or is a local directory.

    Only local paths are looked up (a bucket's "folder" is a key prefix, not a file).
    """
    if url.endswith("/"):
        return True
    if _protocol(url) != "file" or "::" in url:
        return False
    return os.path.isdir(url.removeprefix("file://"))


def _display(url: str, fs: Any, path: str) -> str:
    """Turn a path found by ``fs`` back into a URL in the same style as ``url``."""
    if "://" in url:
        # the pattern's own scheme: adlfs would write az:// URLs back as abfs://
        scheme = url.rsplit("::", 1)[-1].split("://", 1)[0]
        found = f"{scheme}://{str(fs.unstrip_protocol(path)).split('://', 1)[-1]}"
        return f"{url.rsplit('::', 1)[0]}::{found}" if "::" in url else found
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
    found = _call(pattern, lambda: fs.glob(path, detail=True), what="listing")
    files = sorted(p for p, info in found.items() if info.get("type") != "directory")
    return [_display(pattern, fs, p) for p in files]


def exists(
    url: str, storage_options: StorageOptions | None = None, retry: RetryPolicy | None = None
) -> bool:
    """Return whether ``url`` names an existing file or directory."""
    client = _http_client(url, storage_options)
    if client is not None:
        return not _absent((url, client, url), retry)
    fs, path = url_to_fs(url, storage_options)
    return bool(_call(url, lambda: fs.exists(path), retry, what="looking it up"))


def size(
    url: str, storage_options: StorageOptions | None = None, retry: RetryPolicy | None = None
) -> int:
    """Return the size of the file at ``url`` in bytes.

    Raises:
        ShardNotFoundError: If it does not exist.
    """
    client = _http_client(url, storage_options)
    if client is not None:
        return _call(url, lambda: file_size(client, url), retry, what="looking it up")
    fs, path = url_to_fs(url, storage_options)
    return int(_call(url, lambda: fs.size(path), retry, what="looking it up"))


def listdir(url: str, storage_options: StorageOptions | None = None) -> list[tuple[str, bool]]:
    """List a directory: sorted ``(url, is_dir)`` pairs of its entries.

    Raises:
        ShardNotFoundError: If the directory does not exist.
    """
    fs, path = url_to_fs(url, storage_options)
    entries = _call(url, lambda: fs.ls(path, detail=True), what="listing")
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
    if not _call(url, lambda: filesystem.isdir(path), what="looking it up"):
        msg = "no such folder"
        raise ShardNotFoundError(msg, url=url)
    local = "file" in _protocols(filesystem)
    real_root = os.path.realpath(path) if local else None
    yield from _walk(url.rstrip("/"), path, (), real_root, storage_options)


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


def _call(url: str, fn: Callable[[], T], retry: RetryPolicy | None = None, *, what: str) -> T:
    """A metadata call (glob, size, listing) with retries and errors that name ``url``."""
    return call_storage(retry or RetryPolicy(), url, fn, what)


_LISTED = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})  # prefix listings
_LOOKUPS = 16  # concurrent lookups where files are looked up one by one


def slow_to_check(urls: Iterable[str]) -> bool:
    """Whether :func:`missing_files` asks about more of ``urls`` one by one than at once.

    Those are remote files outside a listing (HTTP, chained URLs): past one round of
    lookups, each round costs a round trip.
    """
    alone = sum(is_remote(url) and ("::" in url or _protocol(url) not in _LISTED) for url in urls)
    return alone > _LOOKUPS


def missing_files(
    urls: Iterable[str],
    storage_options: StorageOptions | None = None,
    retry: RetryPolicy | None = None,
) -> list[str]:
    """Those of ``urls`` that do not exist, in their order.

    On ``s3://``, ``gs://`` and ``az://`` one listing per folder finds them all (of the
    keys that begin with the names' common prefix); elsewhere (local, ``memory://``,
    ``http(s)://``, chained URLs) each URL is looked up (``HEAD`` over HTTP), 16 at a time.

    Raises:
        StorageAccessError: If access is refused.
        StorageError: If the storage cannot be reached (after the retries).
    """
    wanted = list(dict.fromkeys(urls))
    folders: dict[tuple[Any, str], list[tuple[str, str]]] = defaultdict(list)
    lookups: list[tuple[str, Any, str]] = []
    for url in wanted:
        client = _http_client(url, storage_options)
        if client is not None:
            lookups.append((url, client, url))
            continue
        filesystem, path = url_to_fs(url, storage_options)
        if "::" not in url and _protocol(url) in _LISTED:
            folders[filesystem, filesystem._parent(path)].append((url, path))
        else:
            lookups.append((url, filesystem, path))
    absent = {u for (f, folder), e in folders.items() for u in _unlisted(f, folder, e, retry)}
    with ThreadPoolExecutor(min(_LOOKUPS, len(lookups) or 1)) as pool:
        gone = pool.map(lambda lookup: _absent(lookup, retry), lookups)
        absent.update(url for (url, _, _), no in zip(lookups, gone, strict=True) if no)
    return [url for url in wanted if url in absent]


def _unlisted(
    filesystem: Any, folder: str, entries: list[tuple[str, str]], retry: RetryPolicy | None
) -> list[str]:
    """The URLs of ``entries`` (``(url, path)`` in ``folder``) that one listing lacks."""
    names = [path[len(folder) :].lstrip("/") for _, path in entries]
    prefix = os.path.commonprefix(names)  # noqa: RUF071 (a key prefix, not a folder)
    try:
        found = _call(
            entries[0][0], lambda: filesystem.find(folder, prefix=prefix), retry, what="listing"
        )
    except ShardNotFoundError:
        found = []  # no such bucket or folder
    listed = {str(p).rstrip("/") for p in found}
    return [url for url, path in entries if path.rstrip("/") not in listed]


def _absent(lookup: tuple[str, Any, str], retry: RetryPolicy | None) -> bool:
    url, filesystem, path = lookup
    if isinstance(filesystem, HttpClient):
        found = lambda: filesystem.size(path) or True  # noqa: E731 (a 404 raises)
    elif "http" in _protocols(filesystem):  # one GET (info tries HEAD, then GET: 2 timeouts)
        found = lambda: filesystem.exists(path, strict=True)  # noqa: E731 (strict: errors raise)
    else:
        found = lambda: filesystem.info(path)  # noqa: E731
    try:
        return not _call(url, found, retry, what="looking it up")
    except ShardNotFoundError:
        return True


def remove_file(url: str, storage_options: StorageOptions | None = None) -> None:
    """Delete the file at ``url``, if it is there."""
    fs, path = url_to_fs(url, storage_options)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(path)


def open_output(url: str, storage_options: StorageOptions | None = None) -> IO[bytes]:
    """Open ``url`` for binary writing, creating parent directories where needed."""
    fs, path = url_to_fs(url, storage_options)
    parent = fs._parent(path)
    if parent:
        with contextlib.suppress(OSError):
            fs.makedirs(parent, exist_ok=True)
    return fs.open(path, "wb")  # type: ignore[no-any-return]
