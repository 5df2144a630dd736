"""Opening tar shards: a stream of shard URLs in, a stream of samples out."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import IO, Any

from torch.utils.data import IterDataPipe, functional_datapipe

from shardpipes import fs
from shardpipes._core.handlers import Handler, check_handler, handle
from shardpipes._core.samples import PartFilter, Sample, group_samples
from shardpipes._core.split import ShardPart, block
from shardpipes._core.tar import Member, iter_members
from shardpipes.errors import ShardIndexError, ShardpipesError
from shardpipes.pipes._length import no_length
from shardpipes.pipes.index import Ranges, build_index, read_index

__all__ = ["ShardReader", "TarOpener"]


@functional_datapipe("open_tar")
class TarOpener(IterDataPipe[Sample]):
    """Stream the samples of tar shards (functional name: ``open_tar``).

    Each shard is streamed through ``shardpipes.fs``, its headers parsed as they come
    (ustar, GNU long names, pax; ``.tar.gz`` read as gzip), and consecutive members with
    the same key grouped into one sample dict: ``__key__``, ``__url__`` and one ``bytes``
    entry per extension. Nothing is extracted; a shard is never held in memory whole.

    Input items are shard URLs, or :class:`~shardpipes._core.split.ShardPart` items from
    ``split_shards`` when several workers share one shard. A part is read by streaming
    the shard and skipping (seeking over) the other parts' members, or, with ``index``,
    by reading only the part's byte range.

    Args:
        source_datapipe: A pipe of shard URLs or ``ShardPart`` items.
        storage_options: Passed to the fsspec filesystem.
        handler: What to do with a bad shard: ``"raise"``, ``"warn"`` (skip the rest of the
            shard, warn), ``"ignore"``, or a callable ``(exc, context) -> bool``.
        index: For shards read in parts: ``False`` streams; ``True`` uses the ``URL.idx``
            sidecar or builds an index on the fly (a header-only scan); a mapping gives
            index URLs by shard URL.

    Example:
        >>> import io, tarfile, fsspec
        >>> members = [("a.txt", b"hi"), ("a.cls", b"1"), ("b.txt", b"yo"), ("b.cls", b"0")]
        >>> with fsspec.open("memory://doc/shard-0.tar", "wb") as f:
        ...     tar = tarfile.open(fileobj=f, mode="w")
        ...     for name, data in members:
        ...         info = tarfile.TarInfo(name); info.size = len(data)
        ...         tar.addfile(info, io.BytesIO(data))
        ...     tar.close()
        >>> from shardpipes import list_shards
        >>> [s["__key__"] for s in list_shards("memory://doc/shard-0.tar").open_tar()]
        ['a', 'b']
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str | ShardPart],
        *,
        storage_options: Mapping[str, Any] | None = None,
        handler: Handler = "raise",
        index: bool | Mapping[str, str] = False,
    ) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.reader = ShardReader(storage_options=storage_options, handler=handler, index=index)

    def __iter__(self) -> Iterator[Sample]:
        for item in self.source_datapipe:
            yield from self.reader.samples(item)

    def __len__(self) -> int:
        no_length(self)


class ShardReader:
    """Reads the samples of one shard or shard part; the engine of ``open_tar``.

    A plain object (not a pipe) so that fused pipelines (the recipes' ``ShardStream``)
    read shards exactly as ``open_tar`` does without paying a pipe stage per sample.
    Arguments as for :class:`TarOpener`.
    """

    def __init__(
        self,
        *,
        storage_options: Mapping[str, Any] | None = None,
        handler: Handler = "raise",
        index: bool | Mapping[str, str] = False,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.handler = check_handler(handler)
        if not isinstance(index, bool | Mapping):
            msg = f"index must be a bool or a mapping of shard URL to index URL (got {index!r})"
            raise TypeError(msg)
        self.index = index
        self._indexes: dict[str, Ranges | None] = {}

    def samples(self, item: str | ShardPart) -> Iterator[Sample]:
        """Yield the samples of a shard URL or part, giving errors to the handler."""
        part = item if isinstance(item, ShardPart) else ShardPart(item)
        try:
            yield from self._samples(part)
        except (ShardpipesError, OSError) as exc:
            handle(self.handler, exc, stage="open_tar", url=part.url)

    def _samples(self, part: ShardPart) -> Iterator[Sample]:
        with fs.open_input(part.url, self.storage_options) as stream:
            members = self._members(stream, part)
            yield from group_samples(members, url=part.url, handler=self.handler)

    def _members(self, stream: IO[bytes], part: ShardPart) -> Iterator[Member]:
        if part.parts == 1:
            return iter_members(stream, url=part.url)
        ranges = self._ranges(part.url) if self.index is not False else None
        if ranges is None:
            return iter_members(stream, url=part.url, keep=PartFilter(part.part, part.parts))
        mine = block(len(ranges), part.part, part.parts)
        if not mine:
            return iter(())
        start, end = ranges[mine.start][0], ranges[mine.stop - 1][1]
        stream.seek(start)
        return iter_members(stream, url=part.url, base=start, limit=end - start)

    def _ranges(self, url: str) -> Ranges | None:
        """The shard's sample ranges, or ``None`` when it cannot be indexed (gzip)."""
        if url not in self._indexes:
            given = self.index.get(url) if isinstance(self.index, Mapping) else None
            ranges = read_index(url, storage_options=self.storage_options, index=given)
            if ranges is None:
                try:
                    ranges = build_index(url, storage_options=self.storage_options)
                except ShardIndexError:
                    ranges = None  # compressed: fall back to streaming the part
            self._indexes[url] = ranges
        return self._indexes[url]
