"""``ShardWriter`` and ``TarWriter``: writing WebDataset-format shards from Python.

The shape webdataset's writers have: a context manager whose ``write(sample)`` takes a dict
with ``"__key__"`` and one value per extension, encoded by its extension
(:mod:`shardpipes._core.encoders`), onto any fsspec URL. The tar bytes are
:class:`~shardpipes._core.writer.TarShardWriter`'s: fixed metadata, so the same samples
always give the same bytes, and keys checked to be safe file names. A URL ending in
``.gz`` or ``.tgz`` is gzip-compressed, as webdataset's writers do (and has no sidecar).
"""

from __future__ import annotations

import functools
import gzip
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any, cast

from typing_extensions import Self

from shardpipes import fs
from shardpipes._core.encoders import encode_value
from shardpipes._core.stage import checked_int
from shardpipes._core.writer import ShardInfo, TarShardWriter, check_key, size_option

__all__ = ["ShardInfo", "ShardWriter", "TarWriter", "encode"]

_GZIP = (".gz", ".tgz")


class _Gzipped(gzip.GzipFile):
    """A gzip stream onto an output file, which its ``close`` closes too."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="wb", mtime=0)  # the same bytes every time
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _open_output(options: Mapping[str, Any], url: str) -> IO[bytes]:
    """Open a shard (or sidecar) for writing; gzip-compressed if its name says so."""
    raw = fs.open_output(url, options)
    return cast("IO[bytes]", _Gzipped(raw)) if url.endswith(_GZIP) else raw


def encode(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A sample with every value encoded to bytes by its extension (``__…`` fields kept).

    Raises:
        TypeError: A value cannot be stored under its extension (the message names the
            sample's key and the field).
        ValueError: The key is missing or unsafe.
    """
    key = check_key(sample.get("__key__"))
    return {
        field: value if field.startswith("__") else encode_value(key, field, value)
        for field, value in sample.items()
    }


class _Writer:
    """What both writers share: encoding, the tar writer, and leaving nothing half-written."""

    def __init__(
        self, url: str, storage_options: Mapping[str, Any] | None, index: bool, **limits: Any
    ) -> None:
        options = dict(storage_options or {})
        self._writer = TarShardWriter(
            url,
            opener=functools.partial(_open_output, options),
            remove=lambda url: fs.remove_file(url, options),
            index=index and not url.endswith(_GZIP),
            **limits,
        )

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encode ``sample`` by its extensions and append it.

        Raises:
            TypeError: A value cannot be stored under its extension.
            ValueError: The key is missing, unsafe, or repeats the previous one.
        """
        if not isinstance(sample, Mapping):
            msg = f"write takes a sample dict with '__key__' (got {type(sample).__name__})"
            raise TypeError(msg)
        self._writer.write(encode(sample))

    @property
    def shards(self) -> list[ShardInfo]:
        """The archives finished so far: URL, samples, bytes."""
        return list(self._writer.shards)

    @property
    def count(self) -> int:
        """Samples written so far."""
        return self._writer.samples

    def close(self) -> list[ShardInfo]:
        """Finish the archive being written; every archive written."""
        return self._writer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._writer.__exit__(*exc_info)  # on an error, the unfinished archive is removed


class ShardWriter(_Writer):
    """Write samples to numbered shards, as webdataset's ``ShardWriter`` does.

    Its ``maxcount``, ``maxsize``, ``start_shard``, ``post`` and ``verbose``; not its
    ``opener`` (give ``storage_options`` for any fsspec URL).

    A new shard starts when the current one holds ``maxcount`` samples or would pass
    ``maxsize`` bytes (a sample larger than that gets a shard of its own). If the ``with``
    block raises, the shard being written is removed; the finished ones stay.

    Args:
        pattern: Shard URL with one printf integer field: ``"out/train-%06d.tar"``,
            ``"s3://bucket/train-%06d.tar"``.
        maxcount: Samples per shard at most.
        maxsize: Bytes per shard at most: a number (``3e9``) or a text such as
            ``"256MB"`` (as ``shardpipes write --shard-size`` takes).
        start_shard: The number of the first shard.
        post: Called with each shard's URL once it is finished (to upload it, say).
        verbose: Print each finished shard on stderr.
        storage_options: Passed to the fsspec filesystem.
        index: Write each shard's ``URL.idx`` sidecar, the byte range of every sample:
            ``len()`` is then exact without reading the shards, and a shard can be split
            between workers by byte range (``False``: none, as webdataset writes). A
            ``.tar.gz`` shard has none: ranged reads need an uncompressed tar.

    Example:
        >>> import shardpipes as sp
        >>> with sp.ShardWriter("memory://doc/w-%03d.tar", maxcount=2) as sink:
        ...     for i in range(3):
        ...         sink.write({"__key__": f"s{i}", "txt": f"sample {i}", "cls": i})
        >>> [(s.url, s.samples) for s in sink.shards]
        [('memory://doc/w-000.tar', 2), ('memory://doc/w-001.tar', 1)]
    """

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100_000,
        maxsize: float | str = 3e9,
        *,
        start_shard: int = 0,
        post: Callable[[str], object] | None = None,
        verbose: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        index: bool = True,
    ) -> None:
        super().__init__(
            pattern,
            storage_options,
            index,
            max_samples=_positive("maxcount", maxcount),
            max_bytes=(
                size_option("maxsize", maxsize, 1, "256MB")
                if isinstance(maxsize, str)
                else _positive("maxsize", maxsize)
            ),
        )
        checked_int(start_shard, "start_shard", 0)
        self._writer.first = start_shard
        self._writer.post = functools.partial(_finished, post, verbose)


class TarWriter(_Writer):
    """Write samples to one tar archive, as webdataset's ``TarWriter`` does.

    Args:
        url: The archive's URL (any fsspec filesystem).
        storage_options: Passed to the fsspec filesystem.
        index: Write the archive's ``URL.idx`` sidecar (see :class:`ShardWriter`).

    Example:
        >>> import shardpipes as sp
        >>> with sp.TarWriter("memory://doc/one.tar") as sink:
        ...     sink.write({"__key__": "a", "json": {"caption": "a cat"}})
        >>> sink.shards[0].samples
        1
    """

    def __init__(
        self, url: str, *, storage_options: Mapping[str, Any] | None = None, index: bool = True
    ) -> None:
        if not isinstance(url, str):
            msg = f"url must be a string (got {type(url).__name__})"
            raise TypeError(msg)
        super().__init__(url, storage_options, index, single=True)


def _finished(post: Callable[[str], object] | None, verbose: int, shard: ShardInfo) -> None:
    if verbose:
        print(f"# wrote {shard.url}: {shard.samples} samples, {shard.size} bytes", file=sys.stderr)
    if post is not None:
        post(shard.url)


def _positive(name: str, value: float) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        msg = f"{name} must be a positive number (got {value!r})"
        raise ValueError(msg)
    return int(value)
