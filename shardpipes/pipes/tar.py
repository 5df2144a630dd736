"""The ``open_tar`` stage: shard URLs or parts in, sample dicts out, resumably."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe, get_worker_info
from typing_extensions import override

from shardpipes._core.reading import PartsReading, reference
from shardpipes._core.samples import Located, Sample
from shardpipes._core.split import ShardPart, part_indices
from shardpipes._core.stage import loaded_state
from shardpipes.errors import ShardNotFoundError
from shardpipes.pipes._stage import Pipe, functional_form
from shardpipes.pipes.index import Ranges, shard_ranges
from shardpipes.pipes.reader import ReadOptions, ShardReader, check_options

__all__ = ["TarOpener", "as_part"]

FETCHED = 64  #: references fetched at once (by shard, by byte range) when restoring


@functional_form("open_tar")
class TarOpener(Pipe):
    """Stream the samples of tar shards (functional name: ``open_tar``).

    Each shard is streamed through ``shardpipes.fs``, its headers parsed as they come
    (ustar, GNU long names, pax; ``.tar.gz`` read as gzip), and consecutive members with
    the same key grouped into one sample dict: ``__key__``, ``__url__`` and one ``bytes``
    entry per extension. Nothing is extracted; a shard is never held in memory whole.

    Input items are shard URLs, or :class:`~shardpipes._core.split.ShardPart` items from
    ``split_shards`` when several workers share one shard. A part is read by streaming
    the shard and skipping (seeking over) the other parts' members, or, with ``index``,
    by reading only the part's byte range.

    Its state is where it is in the epoch: the parts read and the byte offset and index of
    the next sample, with the ``split_shards`` state below it.

    Args:
        source_datapipe: A pipe of shard URLs or ``ShardPart`` items.
        index: For shards read in parts: ``False`` streams; ``True`` uses the ``URL.idx``
            sidecar or builds an index on the fly (a header-only scan); a mapping gives
            index URLs by shard URL.
        **options: The reading options (:class:`~shardpipes.ReadOptions`); the
            ``storage_options`` are by default those given to ``list_shards`` upstream.

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
        index: bool | Mapping[str, str] = False,
        **options: Any,
    ) -> None:
        check_options("open_tar", options, TarOpener)
        super().__init__()
        self.source_datapipe = source_datapipe
        if "storage_options" not in options:
            options["storage_options"] = self.sources()[0].listed_options() or None
        self.reader = ShardReader(index=index, options=ReadOptions(**options))
        self._run: PartsReading | None = None  # the current epoch's
        self._position: Mapping[str, Any] | None = None  # where the next epoch starts
        self._ranges: dict[str, tuple[Ranges, bool]] = {}  # for references (no byte read)

    # -- state ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The ``split_shards`` state and where the reading is (see the module docs)."""
        position = self._run.position() if self._run is not None else self._position
        return {"source": self.sources()[0].state(), "position": position}

    @override
    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        state = loaded_state(state, "open_tar", "position")
        self._fresh, self._run = True, None
        self._position = None if state is None else state["position"]
        self.sources()[0].reset(None if state is None else state["source"])

    @override
    def next_pass(self) -> None:
        self._run, self._position = None, None
        super().next_pass()

    @override
    def policies(self) -> dict[int, Any]:
        return {id(self.reader.policy): self.reader.policy}

    def want(self, fields: frozenset[str] | None) -> None:
        """Members are read whole: nothing to leave out here."""

    # -- iteration ----------------------------------------------------------------------------

    def _iterate(self) -> Iterator[Sample]:
        info = get_worker_info()
        source = self.sources()[0]
        if info is not None and info.num_workers > 1 and not source.split:
            _no_split(info.num_workers)
        source.defer_check()  # checked while the first shard is fetched
        policy = self.reader.policy
        policy.begin(*((info.id, info.num_workers) if info is not None else (0, 1)))
        position, self._position = self._position, None
        run = self._run = PartsReading(self.reader, map(as_part, self.source_datapipe), position)
        located = run.located()
        try:
            first = next(located, None)
            source.checked(first=True)  # every shard exists, before the epoch's first sample
            if first is not None:
                yield first.sample
                yield from (loc.sample for loc in located)
            source.checked()  # (a long check, not waited for before the first sample)
        except ShardNotFoundError:
            source.checked()  # the check's error names and counts every missing shard
            raise
        policy.end()

    def _references(self) -> Iterator[Sample]:
        position, self._position = self._position, None
        run = self._run = PartsReading(
            _References(self), map(as_part, self.source_datapipe), position
        )
        return (loc.sample for loc in run.located())

    def fetch(self, refs: Iterable[Any]) -> Iterator[Sample]:
        """The samples at these references, in their order, by byte range."""
        refs = iter(refs)
        while window := list(itertools.islice(refs, FETCHED)):
            wanted: dict[str, list[tuple[int, int]]] = {}
            for ref in window:
                wanted.setdefault(ref["__url__"], []).append((ref.offset, ref.end))
            found = {url: self.reader.fetch(url, spans) for url, spans in wanted.items()}
            for ref in window:
                yield found[ref["__url__"]][ref.offset]

    # -- lengths and sample ranges ----------------------------------------------------------

    @override
    def length(self, total: int, worker: int | None) -> int:
        if worker is None:  # every worker: any shard order gives this sum
            return sum(self._samples(total, w, any_order=True) for w in range(total))
        return self._samples(total, worker)

    def _samples(self, total: int, worker: int, *, any_order: bool = False) -> int:
        parts, counts = self.sources()[0].parts(total, worker, any_order=any_order)
        return sum(
            len(part_indices(part, counts[part.url], streamed=self.streamed(part.url)))
            for part in parts
        )

    @override
    def regroup(self, refs: Iterable[Any]) -> Iterator[Any]:
        return iter(refs)

    yields = "samples"

    def ranges(self, url: str) -> Ranges:
        """A shard's sample ranges (uncompressed offsets), from its index or a scan, once."""
        if url not in self._ranges:
            self._ranges[url] = shard_ranges(url, self.reader.storage_options)
        return self._ranges[url][0]

    def streamed(self, url: str) -> bool:
        """Whether the reader streams the shard (its parts are every ``m``-th sample)."""
        if self.reader.index is False or url.endswith((".gz", ".tgz")):
            return True
        return url in self._ranges and self._ranges[url][1]


class _References:
    """A reader of sample references only: a shard's samples from its ranges, no byte read."""

    def __init__(self, stage: TarOpener) -> None:
        self.stage = stage

    def samples(
        self, item: str | ShardPart, *, spans: bool = False, at: tuple[int, int] | None = None
    ) -> Iterator[Located]:
        part = as_part(item)
        ranges = self.stage.ranges(part.url)
        mine = part_indices(part, len(ranges), streamed=self.stage.streamed(part.url))
        if at is not None:  # resumed: from the sample at the cursor
            mine = mine[bisect.bisect_left(mine, at[1]) :]
        for i in mine:
            start, end = ranges[i]
            yield Located(reference(part.url, start, end), start, end, i)

    def upcoming(self, parts: Any) -> None:
        """Nothing is fetched ahead: no byte is read."""


def _no_split(workers: int) -> None:
    msg = (
        f"the shards are read in {workers} DataLoader workers, but nothing splits them "
        "between the workers: each worker would read every shard, and every sample "
        "would come once per worker. Split the list of shards before open_tar: "
        ".split_shards() after list_shards(), or torch's .sharding_filter() on the file "
        "list (before FileOpener); one after open_tar would come too late"
    )
    raise ValueError(msg)


def as_part(item: Any) -> ShardPart:
    """What a reading stage reads, from an item of its source.

    A :class:`ShardPart` (``split_shards``), a URL (``list_shards``, ``IterableWrapper``),
    or a ``(URL, stream)`` pair, as torch's ``FileOpener`` and torchdata's
    ``FSSpecFileOpener`` give: its stream is closed, the shard is opened by URL (so that it
    can be read by range, resumed and retried).

    Raises:
        TypeError: Anything else, naming what it got.
    """
    if isinstance(item, ShardPart):
        return item
    if isinstance(item, str):
        return ShardPart(item)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        getattr(item[1], "close", lambda: None)()
        return ShardPart(item[0])
    msg = (
        "open_tar reads shard URLs (list_shards, split_shards) or (URL, stream) pairs "
        f"(FileOpener); got a {type(item).__name__}: {str(item)[:100]}"
    )
    raise TypeError(msg)
