"""Which fsspec filesystem serves a URL, made once per process with shardpipes' defaults.

The storage options given by the user are passed through unchanged, with shardpipes'
defaults where they set none: on every backend (s3fs and botocore, gcsfs, adlfs and
azure-core, aiohttp) the backend's own retries are turned down to one attempt
(shardpipes is the only retry layer), and every connection attempt gives up after
:data:`CONNECT_TIMEOUT` seconds (a response that stalls, after :data:`READ_TIMEOUT`
seconds without a byte). Listed ``http(s)://`` URLs whose options are at most
``headers`` are served by :mod:`shardpipes.fs.http_client` instead of fsspec.
"""

from __future__ import annotations

import inspect
import logging
import os
import types
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from shardpipes.fs.http_client import HttpClient

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
      chained URL's; shards are otherwise read in ranges by :mod:`shardpipes.fs.readahead`).
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


def _protocols(filesystem: Any) -> tuple[str, ...]:
    protocol = filesystem.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def is_remote(url: str) -> bool:
    """Whether ``url`` is read over a network (not a local path, ``file://`` or ``memory://``)."""
    return _protocol(url) not in _LOCAL


_HTTP = frozenset({"http", "https"})
_CLIENTS: dict[tuple[tuple[str, str], ...], HttpClient] = {}


def _http_client(url: str, storage_options: StorageOptions | None) -> HttpClient | None:
    """The client of :mod:`shardpipes.fs.http_client` for ``url``, if it serves it; else ``None``.

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


_LOCAL = frozenset({"file", "local", "memory"})
