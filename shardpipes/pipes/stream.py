"""The recipes' engine: shard parts in, finished samples or batches out, in one pipe stage.

:class:`ShardStream` does what the chain ``open_tar`` → ``shuffle_samples`` → ``decode``
→ ``to_tuple`` → ``map`` → ``batch`` → ``collate`` does, composed of the same pieces
(:class:`~shardpipes.pipes.reader.ShardReader` and the epoch's reading, then
:class:`~shardpipes._core.steps.Finisher`'s decode, pick and transform through
:func:`~shardpipes._core.steps.guarded`, then :func:`~shardpipes._core.steps.batches` of
:func:`~shardpipes.collate_samples`) in one generator. It adds decode threads.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterDataPipe

from shardpipes._core.decoders import Decoder, Decoding, check_image_mode
from shardpipes._core.fields import parse_fields
from shardpipes._core.policy import Stats
from shardpipes._core.split import ShardPart
from shardpipes._core.steps import Finisher, batches, guard, guarded, threaded
from shardpipes.pipes._epoch import ShardReading, ShuffleBuffer
from shardpipes.pipes._length import local_length
from shardpipes.pipes.collate import collate_samples
from shardpipes.pipes.decode import decoder_table
from shardpipes.pipes.reader import ReadOptions, ShardReader, check_options
from shardpipes.pipes.shards import set_epoch

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ShardStream"]


class ShardStream(IterDataPipe[Any]):
    """Read, shuffle, decode, pick fields, transform and batch, in one stage.

    Equivalent to ``source.open_tar(...)``, then ``.shuffle_samples(buffer_size=...)``,
    ``.decode(image, resize=..., crop=...)``, ``.to_tuple(*fields)``, a ``map`` of
    ``transform`` over the first field, and ``.batch(batch_size).collate()``, with one
    error policy for every step, and made of the same pieces. The recipes build on it.

    Args:
        source_datapipe: Shard URLs or :class:`~shardpipes._core.split.ShardPart` items
            (from ``split_shards``).
        fields: Fields to pick into a tuple, each maybe with ``;``-separated
            alternatives; only these are decoded. Empty: yield the decoded sample dicts.
        image: How to decode images (see ``decode``).
        resize: Shorter image side after decoding (see ``decode``).
        crop: Center-crop size after ``resize`` (see ``decode``).
        transform: Applied to the first field of each tuple (or to each dict).
        batch_size: Yield :func:`collate_samples` batches of this many samples (the last
            one shorter unless ``drop_last``); ``None`` yields single samples.
        drop_last: Drop a last batch shorter than ``batch_size``.
        buffer_size: Shuffle samples through a buffer of this many (undecoded) samples,
            as torch's ``shuffle`` does; below 2, no shuffling. ``DataLoader(pipe,
            shuffle=False)`` turns it off (``set_shuffle``).
        seed: The buffer's seed; by default the fixed ``seed`` of the ``split_shards``
            stage upstream, else the DataLoader's. With a seed the buffer's order is a
            function of ``(seed, epoch, worker)``: the same on every run.
        index: As for ``open_tar``.
        allow_pickle: As for ``decode``.
        decoders: Extension to decoder (or ``None``), over the defaults.
        threads: Decode (and transform) on a pool of this many threads, in order; Pillow
            releases the GIL while it decodes and resizes, so this uses idle cores when
            there are fewer DataLoader workers than cores (``num_workers=0`` above all).
            Below 2: no pool.
        **options: The reading options (:class:`~shardpipes.ReadOptions`), the
            ``handler`` (and ``max_errors``) serving every step.
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str | ShardPart],
        *,
        fields: Sequence[str] = (),
        image: str = "pil",
        resize: int | None = None,
        crop: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        drop_last: bool = False,
        buffer_size: int = 0,
        seed: int | None = None,
        index: bool | Mapping[str, str] = False,
        allow_pickle: bool | Iterable[str] = False,
        decoders: Mapping[str, Decoder | None] | None = None,
        threads: int = 0,
        **options: Unpack[ReadOptions],
    ) -> None:
        check_options("ShardStream", options, ShardStream)
        super().__init__()
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            msg = f"batch_size must be a positive int or None (got {batch_size!r})"
            raise ValueError(msg)
        if not isinstance(threads, int) or threads < 0:
            msg = f"threads must be a non-negative int (got {threads!r})"
            raise ValueError(msg)
        self.source_datapipe = source_datapipe
        self.fields = tuple(fields)
        self.image = check_image_mode(image)
        self.transform = transform
        self.batch_size, self.drop_last, self.threads = batch_size, drop_last, threads
        self.buffer = ShuffleBuffer(buffer_size, seed)
        self.reading = ShardReading(source_datapipe, ShardReader(index=index, **options))
        table = decoder_table(
            image, resize=resize, crop=crop, allow_pickle=allow_pickle, overrides=decoders
        )
        alternatives = parse_fields(self.fields) if self.fields else ()
        self._finish = Finisher(Decoding(table), alternatives, transform)

    def set_seed(self, seed: int) -> ShardStream:
        """Seed the shuffle buffer for the next epoch (the DataLoader calls this).

        Ignored where a fixed ``seed`` (this stage's or the ``split_shards`` stage's) rules.
        """
        self.buffer.shared = seed
        return self

    def set_shuffle(self, shuffle: bool = True) -> ShardStream:
        """Turn the shuffle buffer on or off.

        ``DataLoader(pipe, shuffle=...)`` calls this on every shuffling stage (the
        ``split_shards`` stage upstream too).
        """
        self.buffer.enabled = bool(shuffle)
        return self

    def set_epoch(self, epoch: int) -> ShardStream:
        """Set the epoch of the ``split_shards`` stages upstream (the seeded shard order)."""
        set_epoch(self.source_datapipe, epoch)
        return self

    def __iter__(self) -> Iterator[Any]:
        # a generator: torch's hook names this stage in the errors raised in it
        policy = self.reading.reader.policy
        located = self.reading.begin(self.buffer.shuffling(self.source_datapipe))
        finish = compose(self._finish, _sample)
        if self.threads < 2:
            finished = guarded(located, finish, policy)
        else:
            size = max(self.threads, self.batch_size or 1) * 2
            finish = guard(finish, policy)
            finished = threaded(located, finish, self.threads, size, self.reading.flight)
        if self.batch_size is None:
            yield from finished
        else:
            yield from batches(finished, self.batch_size, collate_samples, drop_last=self.drop_last)

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

        As for ``open_tar``'s (the shard order and split, the cursor, the shuffle buffer
        as byte ranges), plus the samples taken by decode threads but not yet yielded.
        The plain ``StatefulDataLoader`` saves it, with any ``num_workers``.

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
            ValueError: If the state does not fit this pipe (see ``open_tar``'s).
        """
        self.reading.load_state_dict(state)


def compose(outer: Callable[[Any], Any], inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``outer(inner(x))``."""
    return lambda x: outer(inner(x))


_sample = operator.itemgetter(0)  # Located -> its sample
