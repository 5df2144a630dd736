"""The only module that talks to fsspec: opening (seekable streams), globbing, listing, writing.

Every function takes a URL in fsspec's grammar (a local path, ``file://``, ``memory://``,
``s3://``, ``gs://``, ``az://``, ``https://``, chained ``simplecache::s3://…``) and the
``storage_options`` given by the user, passed through unchanged to the filesystem.
Errors are translated into ones that name the URL: a missing file is a
:class:`~shardpipes.errors.ShardNotFoundError`, refused or missing credentials a
:class:`~shardpipes.errors.StorageAccessError`, a failure that outlasts the retries a
:class:`~shardpipes.errors.StorageError`, a missing backend an ``ImportError`` that says
which extra to install.

shardpipes is the only retry layer: on every backend (s3fs and botocore, gcsfs, adlfs and
azure-core, aiohttp) the backend's own retries are turned down to one attempt, and every
connection attempt gives up after :data:`CONNECT_TIMEOUT` seconds (a response that stalls,
after :data:`READ_TIMEOUT` seconds without a byte), unless ``storage_options`` say otherwise.

Listed ``http(s)://`` URLs whose options are at most ``headers`` are read, sized and
looked up with :mod:`shardpipes._http` (the standard library's client) instead of fsspec's
aiohttp backend, which still serves globs over HTTP listings, chained URLs and any other
HTTP option.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar

from shardpipes import _fork
from shardpipes._cache import ShardCache
from shardpipes._http import HttpClient, HttpStatusError, RangeIgnoredError
from shardpipes._readahead import IO_CONCURRENCY, READAHEAD, Read, ReadAhead
from shardpipes._retry import RetryPolicy, gave_up, transient
from shardpipes._streams import READ_STATS, ReadStats, ResilientStream, raise_permanent
from shardpipes.errors import ShardNotFoundError, ShardpipesError, StorageError

__all__ = [
    "CONNECT_TIMEOUT",
    "READ_STATS",
    "READ_TIMEOUT",
    "ReadStats",
    "RetryPolicy",
    "check_chained",
    "exists",
    "glob",
    "has_magic",
    "is_remote",
    "listdir",
    "load_backend",
    "missing_files",
    "open_input",
    "open_output",
    "read_ahead",
    "remove_file",
    "size",
    "url_to_fs",
    "walk",
]

StorageOptions = Mapping[str, Any]
T = TypeVar("T")
log = logging.getLogger("shardpipes")

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

_fork.install()


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


def _protocol(url: str) -> str:
    last = url.rsplit("::", 1)[-1]
    return last.split("://", 1)[0] if "://" in last else "file"


def load_backend(url: str) -> None:
    """Import the fsspec backend of ``url``'s storage (a chained URL's last link).

    Raises:
        ImportError: It is not installed; the message names the install command.
        ValueError: The protocol is unknown to fsspec, or the URL is webdataset's
            ``pipe:`` command.
    """
    if url.startswith("pipe:"):
        msg = (
            f"{url}: webdataset's pipe: URLs (a shell command's output) are not read here: "
            "shardpipes reads shards by byte range and resumes inside them, which a pipe "
            "cannot give. Give the storage URL the command reads (a path, s3://, gs://, "
            "az://, https://; credentials in storage_options=)"
        )
        raise ValueError(msg)
    protocol = _protocol(url)
    if protocol in _HTTP and "::" not in url:
        return  # read with the standard library (fsspec's backend only for a glob: its error)
    from fsspec.registry import get_filesystem_class  # imported here: not for plain HTTP

    try:
        get_filesystem_class(protocol)
    except ImportError as exc:
        raise _missing_backend(url, protocol) from exc
    except ValueError as exc:
        raise _unknown_protocol(url, protocol) from exc
    if protocol in ("s3", "s3a"):
        _botocore_models()


_LOADER: list[Any] = []


def _botocore_models() -> Any:
    """Botocore's data loader with what an S3 client is made of already parsed (once).

    Each s3fs filesystem makes its own botocore session, whose loader parses S3's models
    anew (~0.1–0.25 s of CPU in every DataLoader worker); this one is parsed where the
    backend is loaded — the main process, whose forked workers inherit it — and handed to
    the sessions shardpipes makes for s3fs (:func:`_s3_session`).
    """
    if not _LOADER:
        import botocore.session
        from botocore.loaders import create_loader

        loader = create_loader()
        session = botocore.session.Session()
        session.register_component("data_loader", loader)
        session.create_client(  # made and dropped: it parses what every client needs
            "s3",
            region_name="us-east-1",
            endpoint_url="http://127.0.0.1:1",
            aws_access_key_id="-",
            aws_secret_access_key="-",
        )
        _LOADER.append(loader)
    return _LOADER[0]


_SESSIONS: dict[int, Any] = {}


def _s3_session(options: StorageOptions) -> Any | None:
    """An aiobotocore session for s3fs with the shared parsed models, one per process.

    ``None`` where s3fs makes its own with options of the user's (``profile``…): those are
    keyword arguments s3fs does not name itself, which it gives to its session.
    """
    from s3fs import S3FileSystem

    named = inspect.signature(S3FileSystem.__init__).parameters
    if "session" in options or any(k not in named and k not in _GENERIC for k in options):
        return None
    session = _SESSIONS.get(os.getpid())
    if session is None:
        from aiobotocore.session import AioSession

        session = AioSession()
        session.register_component("data_loader", _botocore_models())
        _SESSIONS[os.getpid()] = session
    return session


def _unknown_protocol(url: str, protocol: str) -> ValueError:
    return ValueError(f"{url}: unknown protocol {protocol!r}")


def _missing_backend(url: str, protocol: str) -> ImportError:
    extra = _EXTRAS.get(protocol)
    hint = (
        f"pip install 'shardpipes[{extra}]'"
        if extra
        else f"install the fsspec backend for {protocol!r}"
    )
    return ImportError(f"{url}: reading {protocol}:// URLs needs an extra package: {hint}")


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
    if "::" in url:
        check_chained(url, storage_options or {})
    options = backend_options(url, storage_options)
    from fsspec.core import url_to_fs
    from fsspec.utils import tokenize

    key = (os.getpid(), _protocol(url), tokenize(options)) if "::" not in url else None
    made = _MADE.get(key) if key is not None else None
    if made is not None:
        return made, str(made._strip_protocol(url))
    try:
        fs, path = url_to_fs(url, **options)
    except ImportError as exc:
        raise _missing_backend(url, _protocol(url)) from exc
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise _unknown_protocol(url, _protocol(url)) from exc
        raise
    for layer in _layers(fs):
        _own_retries_off(layer)
    if key is not None:
        _MADE[key] = fs
    return fs, str(path)


# One filesystem per process, protocol and options, even with skip_instance_cache (which
# would make one per shard, each with a session to set up: 0.2 s of CPU for s3fs): the
# listing, the existence check and the reads share it. Per process: fsspec's I/O loop is.
_MADE: dict[tuple[int, str, str], Any] = {}


S3_BLOCK_SIZE = 16 * 2**20  # measured on loopback: 340-412 MB/s at 55 MB per open file
CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a connection to the storage, on every backend (a documented default)."""
READ_TIMEOUT = 60.0
"""Seconds to wait for the next byte of a response (not for the whole of it)."""


def backend_options(url: str, storage_options: StorageOptions | None) -> dict[str, Any]:
    """The storage options for ``url``, with shardpipes' defaults where the user set none.

    For each backend in ``url`` (the options of an inner link of a chained URL are those
    under its protocol's name, as fsspec takes them):

    - ``s3://``: botocore's retries off (``config_kwargs={"retries": {"total_max_attempts":
      1}}``; s3fs retries a call 5 times and botocore each of those 5 times, 37 s on a
      persistent 503), its ``connect_timeout`` and ``read_timeout``; 16 MiB blocks
      (``default_block_size``) instead of s3fs's 50 MiB for files s3fs opens itself (a
      chained URL's; shards are otherwise read in ranges by :mod:`shardpipes._readahead`).
    - ``gs://``: ``requests_timeout`` (gcsfs sets no timeout at all by default).
    - ``az://``, ``abfs://``: ``connection_timeout`` and ``read_timeout``.
    - ``http(s)://``: ``client_kwargs={"timeout": aiohttp.ClientTimeout(...)}`` (aiohttp's
      default gives a whole response 5 minutes, and a connection 30 s).

    The timeouts are :data:`CONNECT_TIMEOUT` and :data:`READ_TIMEOUT`.
    """
    options = dict(storage_options or {})
    for i, protocol in enumerate(_chain_protocols(url)):
        if i == 0:  # the outer link takes the top-level options
            options = _defaults(protocol, options)
        elif protocol in _EXTRAS:
            options[protocol] = _defaults(protocol, options.get(protocol) or {})
    return options


_GENERIC = frozenset(
    {"skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths"}
)


def check_chained(url: str, storage_options: StorageOptions) -> None:
    """Refuse top-level options that a chained URL's outer layer would silently ignore.

    fsspec gives a chained URL's top-level options to its outer layer (``simplecache``…),
    which drops what it does not know: credentials and an endpoint given there would be
    lost, and the reads go to the default endpoint.
    """
    from fsspec.registry import get_filesystem_class

    protocols = _chain_protocols(url)
    try:
        outer = get_filesystem_class(protocols[0])
    except (ImportError, ValueError):
        return  # url_to_fs says so
    named = {
        name
        for name, p in inspect.signature(outer.__init__).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    stray = sorted(k for k in storage_options if k not in {*protocols, *named, *_GENERIC})
    if stray:
        msg = (
            f"{url}: a chained URL takes its storage options per protocol, e.g. "
            f"storage_options={{{protocols[-1]!r}: {{...}}, {protocols[0]!r}: {{...}}}}; "
            f"{', '.join(map(repr, stray))} would go to {protocols[0]}:// and be ignored"
        )
        raise ValueError(msg)


def _chain_protocols(url: str) -> list[str]:
    return [bit.split("://", 1)[0] if "://" in bit else bit for bit in url.split("::")]


def _defaults(protocol: str, given: StorageOptions) -> dict[str, Any]:
    options = dict(given)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # a new dict: botocore edits it
        config.setdefault("connect_timeout", CONNECT_TIMEOUT)
        config.setdefault("read_timeout", READ_TIMEOUT)
        config.setdefault("signature_version", "s3v4")  # presigned URLs too (see Presigned)
        session = _s3_session(options)
        options["config_kwargs"] = config
        options.setdefault("default_block_size", S3_BLOCK_SIZE)
        if session is not None:
            options["session"] = session
    elif protocol in ("az", "abfs", "abfss"):
        options.setdefault("connection_timeout", CONNECT_TIMEOUT)
        options.setdefault("read_timeout", READ_TIMEOUT)
    elif protocol in ("gs", "gcs", "http", "https"):
        timeout = _client_timeout()
        if timeout is None:
            pass  # no aiohttp: fsspec's ImportError follows, made clear by url_to_fs
        elif protocol.startswith("http"):
            client = dict(options.get("client_kwargs") or {})
            client.setdefault("timeout", timeout)
            options["client_kwargs"] = client
        else:
            options.setdefault("requests_timeout", timeout)
    return options


def _client_timeout() -> Any:
    """The aiohttp timeouts of a request: connecting, and each read; none for the whole."""
    try:
        import aiohttp
    except ImportError:
        return None
    return aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)


def _layers(filesystem: Any) -> Iterator[Any]:
    """``filesystem`` and, for a chained one (``simplecache::s3://…``), the ones it wraps."""
    seen: set[int] = set()
    while filesystem is not None and id(filesystem) not in seen:
        seen.add(id(filesystem))
        yield filesystem
        filesystem = getattr(filesystem, "fs", None)


def _own_retries_off(filesystem: Any) -> None:
    """Turn a backend's own retry loop down to one attempt (shardpipes retries instead).

    The options cannot reach these loops: s3fs's attempts are an attribute; gcsfs wraps
    its requests in a decorator with 6 tries and backoff up to 32 s (logging a traceback
    for each); adlfs builds its azure-core clients itself, with azure-storage's default
    policy (3 retries after 15, 18 and 24 s) and a 20 s connection timeout.
    """
    protocols = _protocols(filesystem)
    if "s3" in protocols:
        retries = (getattr(filesystem, "config_kwargs", None) or {}).get("retries") or {}
        if retries.get("total_max_attempts") == 1:  # ours (or the user's: one attempt too)
            filesystem.retries = 1
    elif "gs" in protocols:
        request = getattr(type(filesystem)._request, "__wrapped__", None)
        if request is not None and "_request" not in vars(filesystem):
            filesystem._request = types.MethodType(request, filesystem)
    elif "abfs" in protocols:
        _azure_retries_off(filesystem)


def _azure_retries_off(filesystem: Any) -> None:
    config = getattr(getattr(filesystem, "service_client", None), "_config", None)
    policy = getattr(config, "retry_policy", None)
    if policy is not None and hasattr(policy, "total_retries"):
        policy.total_retries = 0
    connection = getattr(getattr(config, "transport", None), "connection_config", None)
    timeouts = getattr(filesystem, "_timeout_kwargs", {})
    if connection is not None:
        connection.timeout = timeouts.get("connection_timeout", CONNECT_TIMEOUT)
        connection.read_timeout = timeouts.get("read_timeout", READ_TIMEOUT)


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


def is_remote(url: str) -> bool:
    """Whether ``url`` is read over a network (not a local path, ``file://`` or ``memory://``)."""
    return _protocol(url) not in _LOCAL


_HTTP = frozenset({"http", "https"})
_CLIENTS: dict[tuple[tuple[str, str], ...], HttpClient] = {}


def _http_client(url: str, storage_options: StorageOptions | None) -> HttpClient | None:
    """The HTTP client of :mod:`shardpipes._http` for ``url``, if it serves it; else ``None``.

    It serves plain ``http(s)://`` URLs whose storage options are at most ``headers``
    (other options are aiohttp's, for fsspec's backend).
    """
    options = storage_options or {}
    if "::" in url or _protocol(url) not in _HTTP or set(options) - {"headers"}:
        return None
    headers = tuple(sorted((str(k), str(v)) for k, v in (options.get("headers") or {}).items()))
    client = _CLIENTS.get(headers)
    if client is None:
        client = _CLIENTS.setdefault(
            headers, HttpClient(dict(headers), CONNECT_TIMEOUT, READ_TIMEOUT)
        )
    return client


def read_ahead(
    storage_options: StorageOptions | None = None,
    retry: RetryPolicy | None = None,
    cache: ShardCache | None = None,
    *,
    readahead: int = READAHEAD,
    io_concurrency: int = IO_CONCURRENCY,
) -> ReadAhead:
    """A :class:`~shardpipes._readahead.ReadAhead` for remote URLs with these options.

    Args:
        storage_options: Passed to the filesystems.
        retry: The retry policy of every request; default ``RetryPolicy()``.
        cache: A local shard cache to fill and serve blocks from.
        readahead: Bytes fetched ahead at most.
        io_concurrency: Ranged requests in flight at once.
    """
    options = dict(storage_options or {})

    def resolve(url: str) -> tuple[Any, str]:
        client = _http_client(url, options)
        if client is not None:
            return client, url
        filesystem, path = url_to_fs(url, options)
        return _presigned(url, filesystem, options) or filesystem, path

    return ReadAhead(
        resolve, fetch_range, file_size, retry or RetryPolicy(), cache,
        budget=readahead, concurrency=io_concurrency,
    )  # fmt: skip


class Presigned:
    """An s3fs filesystem whose objects are read by :mod:`shardpipes._http` with presigned GETs.

    s3fs reads through aiobotocore on fsspec's event loop thread: 318 MB per CPU-second
    on loopback, where ``http.client`` reads 924. The URL is signed locally by botocore
    (with the filesystem's credentials, endpoint and addressing), for an hour, and signed
    anew every :attr:`REFRESH` seconds; the ``Range`` header is not part of the signature.
    """

    REFRESH = 600.0
    #: answers to a presigned GET that mean "sign it otherwise" (a bucket in another
    #: region than the one signed for, an endpoint that takes no query signatures): the
    #: filesystem's reads go back to s3fs, which follows region redirects
    REFUSED = frozenset({301, 307, 400})

    def __init__(self, filesystem: Any) -> None:
        self.fs = filesystem
        self.http = HttpClient({}, CONNECT_TIMEOUT, READ_TIMEOUT)
        self.works = True
        self._signed: dict[str, tuple[float, str]] = {}
        self._params = dict(getattr(filesystem, "req_kw", {}))  # RequestPayer

    def call(self, path: str, fn: Callable[[HttpClient, str], T]) -> T | None:
        """``fn(client, presigned URL)``; ``None`` once presigned GETs were refused."""
        if not self.works:
            return None
        try:
            return fn(self.http, self.url(path))
        except HttpStatusError as exc:
            if exc.status not in self.REFUSED:
                raise
            log.info("s3://%s: presigned GET refused (%s); reading with s3fs", path, exc)
            self.works = False
            return None

    def url(self, path: str) -> str:
        """A presigned ``GET`` URL of ``path``."""
        now = time.monotonic()
        signed = self._signed.get(path)
        if signed is None or now - signed[0] > self.REFRESH:
            signed = (now, str(self.fs.url(path, expires=3600, **self._params)))
            self._signed[path] = signed
        return signed[1]


_PRESIGNED: dict[int, Presigned] = {}
_S3_CLIENT_KWARGS = frozenset({"endpoint_url", "region_name"})


def _presigned(url: str, filesystem: Any, options: StorageOptions) -> Presigned | None:
    """A :class:`Presigned` for an ``s3://`` URL's filesystem, where it reads the same bytes.

    Not for a chained URL, nor where the options change the requests themselves
    (``s3_additional_kwargs``: server-side encryption keys…; ``client_kwargs`` other than
    the endpoint and region: a CA bundle, proxies…), which s3fs then reads.
    """
    if "::" in url or _protocol(url) not in ("s3", "s3a"):
        return None
    if options.get("s3_additional_kwargs") or set(options.get("client_kwargs") or {}) - (
        _S3_CLIENT_KWARGS
    ):
        return None
    made = _PRESIGNED.get(id(filesystem))
    if made is None or made.fs is not filesystem:
        made = _PRESIGNED[id(filesystem)] = Presigned(filesystem)
    return made


def fetch_range(filesystem: Any, url: str, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a file, in one ranged request (fewer at the file's end).

    Raises:
        StorageError: If the server answered with more than the range (it ignores ranges).
    """
    if isinstance(filesystem, Presigned):
        try:
            got = filesystem.call(path, lambda http, signed: http.get_range(signed, start, end))
        except RangeIgnoredError:
            raise _no_ranges(url) from None
        if got is not None:
            return got
        filesystem = filesystem.fs
    if isinstance(filesystem, HttpClient):
        try:
            return filesystem.get_range(path, start, end)
        except RangeIgnoredError:
            raise _no_ranges(url) from None
    if "http" in _protocols(filesystem):
        return _http_range(filesystem, path, start, end)
    data = filesystem.cat_file(path, start=start, end=end)
    if len(data) > end - start:
        raise _no_ranges(url)
    return bytes(data)


def file_size(filesystem: Any, path: str) -> int:
    """The size of a file in bytes, in one request.

    Over HTTP one ``HEAD`` (fsspec's ``size`` follows a failed one with a ``GET``, which
    doubles the wait for an unreachable server), its ``size`` where the answer has no
    length; with shardpipes' own client (:mod:`shardpipes._http`), a ``GET`` of one byte.

    Raises:
        StorageError: The server does not say the size.
    """
    if isinstance(filesystem, Presigned):
        found = filesystem.call(path, lambda http, signed: http.size(signed))
        if found is not None:
            return found
        filesystem = filesystem.fs
    if isinstance(filesystem, HttpClient):
        found = filesystem.size(path)
        if found is None:
            msg = "the server does not say the file's size (no Content-Range nor Content-Length)"
            raise StorageError(msg, url=path)
        return found
    if "http" in _protocols(filesystem):

        async def length(r: Any) -> int | None:
            found: int | None = r.content_length
            return found

        head = {"Accept-Encoding": "identity"}
        size = _http(filesystem, "head", path, head, length, allow_redirects=True)
        if isinstance(size, int):
            return size
    return int(filesystem.size(path))


def _http_range(filesystem: Any, url: str, start: int, end: int) -> bytes:
    """A ranged GET with fsspec's HTTP session that refuses a whole-file answer unread."""

    async def body(r: Any) -> bytes:
        whole = r.content_length
        if r.status != 206 and not (start == 0 and whole is not None and whole <= end):
            raise _no_ranges(url)  # a whole file larger than the range: refused unread
        return bytes(await r.read())

    data: bytes = _http(filesystem, "get", url, {"Range": f"bytes={start}-{end - 1}"}, body)
    return data


def _http(
    filesystem: Any,
    method: str,
    url: str,
    headers: Mapping[str, str],
    answer: Callable[[Any], Any],
    **request: Any,
) -> Any:
    """One request with fsspec's HTTP session and options; ``await answer(response)``.

    A 404 is fsspec's ``FileNotFoundError``, other errors as fsspec raises them.
    """
    from fsspec.asyn import sync

    async def run() -> Any:
        session = await filesystem.set_session()
        kwargs = {**filesystem.kwargs, **request}
        sent = {**kwargs.pop("headers", {}), **headers}
        async with getattr(session, method)(
            filesystem.encode_url(url), headers=sent, **kwargs
        ) as r:
            filesystem._raise_not_found_for_status(r, url)
            return await answer(r)

    return sync(filesystem.loop, run)


def _no_ranges(url: str) -> StorageError:
    msg = (
        "the server ignores HTTP Range requests (it sent more than the byte range asked "
        "for); shardpipes reads shards in ranges: serve them with a server that supports "
        "Range, as nginx, caddy or any bucket does (python -m http.server does not)"
    )
    return StorageError(msg, url=url)


def open_input(
    url: str,
    storage_options: StorageOptions | None = None,
    retry: RetryPolicy | None = None,
    *,
    cache: ShardCache | None = None,
    ahead: ReadAhead | None = None,
    read: Read | None = None,
) -> IO[bytes]:
    """Open ``url`` for binary reading, streaming, and resilient to a flaky network.

    A local file is opened as it is. A remote one is read in ranged requests, ahead of use
    and several at once (:mod:`shardpipes._readahead`); a transient failure (see
    :mod:`shardpipes._retry`) of a request is retried with backoff, so nothing is read
    twice or skipped. Reads are counted in :data:`READ_STATS`.

    Args:
        url: The file's URL.
        storage_options: Passed to the filesystem.
        retry: The retry policy; default ``RetryPolicy()`` (5 retries).
        cache: A local shard cache: a remote ``url`` cached whole is read from local disk;
            otherwise the blocks read fill it.
        ahead: The read-ahead to read a remote ``url`` with (a reader's, which knows what
            comes next); by default one for this file alone.
        read: What to read of ``url`` (the byte ranges planned); by default all of it.

    Raises:
        ShardNotFoundError: If it does not exist (not retried).
        StorageAccessError: If access is refused (not retried).
        StorageError: If a transient failure outlasts the retries; it names the offset.
    """
    if not is_remote(url):
        filesystem, path = url_to_fs(url, storage_options)
        return ResilientStream(url, filesystem, path, retry or RetryPolicy())  # type: ignore[return-value]
    if cache is not None:
        hit = cache.lookup(url)
        if hit is not None:
            with contextlib.suppress(FileNotFoundError):  # unless evicted since
                local = open(hit, "rb")  # noqa: SIM115 (the caller closes it)
                READ_STATS.count(cache_hits=1)
                return local
    if ahead is None:
        ahead = read_ahead(storage_options, retry, cache)
    return ahead.open(read or Read(url, url, _whole))  # type: ignore[return-value]


def _whole() -> tuple[tuple[int, int | None], ...]:
    return ((0, None),)


_LOCAL = frozenset({"file", "local", "memory"})


def _call(url: str, fn: Callable[[], T], retry: RetryPolicy | None = None, *, what: str) -> T:
    """A metadata call (glob, size, listing) with retries and errors that name ``url``."""
    policy = retry or RetryPolicy()
    try:
        return policy.call(url, fn)
    except Exception as exc:
        if transient(exc) and not isinstance(exc, ShardpipesError):
            raise gave_up(exc, url, what, policy.retries) from exc
        raise_permanent(exc, url)
        raise


_LISTED = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})  # prefix listings
_LOOKUPS = 16  # concurrent lookups where files are looked up one by one


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
