"""Opening tar shards: a stream of shard URLs in, a stream of samples out."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterDataPipe

from shardpipes._core.policy import Stats
from shardpipes._core.run import Shuffling
from shardpipes._core.samples import Sample
from shardpipes._core.split import ShardPart
from shardpipes.pipes._epoch import ShardReading
from shardpipes.pipes._length import local_length
from shardpipes.pipes._stage import SampleStage, functional_form
from shardpipes.pipes.reader import ReadOptions, ShardReader, check_options
from shardpipes.pipes.shards import lister_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TarOpener"]


@functional_form("open_tar")
class TarOpener(SampleStage):
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
        index: For shards read in parts: ``False`` streams; ``True`` uses the ``URL.idx``
            sidecar or builds an index on the fly (a header-only scan); a mapping gives
            index URLs by shard URL.
        **options: The reading options (:class:`~shardpipes.ReadOptions`):
            ``storage_options`` (by default those given to ``list_shards`` upstream),
            ``handler``, ``max_errors``, ``retries``, ``cache_dir``, ``cache_size``,
            ``max_member_bytes``. :meth:`stats` reads the handler's counts.

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
        **options: Unpack[ReadOptions],
    ) -> None:
        check_options("open_tar", options, TarOpener)
        super().__init__()
        if "storage_options" not in options and (found := lister_options(source_datapipe)):
            options["storage_options"] = found  # those given to list_shards
        self.source_datapipe = source_datapipe
        self.reading = ShardReading(source_datapipe, ShardReader(index=index, **options))

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Sample]:
        return self.samples()

    def samples(self, shuffling: Shuffling = (0, 0)) -> Iterator[Sample]:
        """The epoch's samples, through a shuffle buffer if ``shuffling`` asks for one."""
        return map(operator.itemgetter(0), self.reading.begin(shuffling))

    def __len__(self) -> int:
        return local_length(self)

    def stats(self) -> Stats:
        """What the current (or last) epoch read and skipped, over all DataLoader workers.

        See :class:`~shardpipes.Stats`; counted by the pipe's
        :class:`~shardpipes.ErrorPolicy` (its ``handler``).
        """
        return self.reading.stats()

    def state_dict(self) -> dict[str, Any]:
        """Where this pipe is in its epoch: plain data for a checkpoint.

        Taken between two items it yields, it holds the epoch's shard order and split
        (the ``split_shards`` states, checked on restore), the number of parts read and the
        byte offset and index of the next sample, and — with ``shuffle_samples`` — the
        buffered samples as references ``(shard, start, end)`` with the buffer's random
        state (a full 5,000-sample buffer: about 120 KB of JSON). The plain
        ``StatefulDataLoader`` saves it, with any ``num_workers``.

        Raises:
            ValueError: Asked in the main process of a DataLoader that reads this pipe in
                worker processes (save the loader's state).
        """
        from shardpipes.pipes._loader import check_read_here

        check_read_here(self)
        return self.reading.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume, at the next iteration, from a :meth:`state_dict` of this pipeline.

        Raises:
            ValueError: If the state is not one of this kind and version, or its
                ``split_shards`` states do not fit this pipe; a state of another shard
                list, seed, split or worker raises when iteration starts, saying which.
        """
        self.reading.load_state_dict(state)
