"""Reading a file: one ranged request, its size, or a whole stream read ahead.

Over ``s3://`` objects are read with presigned GETs by :mod:`shardpipes.fs.http_client`
where that reads the same bytes (:class:`Presigned`); over ``http(s)://`` with that
client, or fsspec's session where the options are aiohttp's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from shardpipes.errors import StorageError
from shardpipes.fs.backends import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    StorageOptions,
    T,
    _http_client,
    _protocol,
    _protocols,
    is_remote,
    log,
    url_to_fs,
)
from shardpipes.fs.cache import ShardCache
from shardpipes.fs.http_client import HttpClient, HttpStatusError, RangeIgnoredError
from shardpipes.fs.readahead import IO_CONCURRENCY, READAHEAD, Read, ReadAhead
from shardpipes.fs.resilient import READ_STATS, ResilientStream
from shardpipes.fs.retry import RetryPolicy


def read_ahead(
    storage_options: StorageOptions | None = None,
    retry: RetryPolicy | None = None,
    cache: ShardCache | None = None,
    *,
    readahead: int = READAHEAD,
    io_concurrency: int = IO_CONCURRENCY,
) -> ReadAhead:
    """A :class:`~shardpipes.fs.readahead.ReadAhead` for remote URLs with these options.

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
    """An s3fs filesystem whose objects are read with presigned GETs (:mod:`~.http_client`).

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
    try:
        if isinstance(filesystem, Presigned):
            got = filesystem.call(path, lambda http, signed: http.get_range(signed, start, end))
            if got is not None:
                return got
            filesystem = filesystem.fs
        if isinstance(filesystem, HttpClient):
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
    length; with shardpipes' own client (:mod:`shardpipes.fs.http_client`), a ``GET`` of one byte.

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
    and several at once (:mod:`shardpipes.fs.readahead`); a transient failure (see
    :mod:`shardpipes.fs.retry`) of a request is retried with backoff, so nothing is read
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
