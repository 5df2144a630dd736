"""The recipes' engine: shard parts in, finished samples or batches out, in one pipe stage.

Every torch ``IterDataPipe`` stage pays its iterator hook (validity check, counter) on every
item: about 1.3 µs per stage per sample with torch 2.13, more than our tar reader spends
parsing a small member. :class:`ShardStream` does what the chain ``open_tar`` →
``shuffle`` → ``decode`` → ``to_tuple`` → ``map`` → ``batch`` → ``collate`` does, with the
same code for each step (:class:`~shardpipes.pipes.tar.ShardReader`,
:func:`~shardpipes.pipes.decode.decoder_table`, :func:`~shardpipes.pipes.fields.pick`,
:func:`~shardpipes.pipes.collate.collate_samples`), in one generator: one hook per batch.
It also decodes only the fields it keeps.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.decoders import (
    Decoder,
    check_image_mode,
    decode_sample,
    decoder_for,
    located,
)
from shardpipes._core.handlers import Handler, handle
from shardpipes._core.policy import as_policy
from shardpipes._core.samples import Located, SampleTuple
from shardpipes._core.split import ShardPart
from shardpipes._core.tar import MAX_MEMBER_BYTES
from shardpipes.errors import DecodeError, MissingFieldError
from shardpipes.pipes._epoch import ResumableReading, ShuffleBuffer
from shardpipes.pipes._length import no_length
from shardpipes.pipes.collate import collate_samples
from shardpipes.pipes.decode import decoder_table
from shardpipes.pipes.fields import parse_fields, pick
from shardpipes.pipes.shards import set_epoch
from shardpipes.pipes.tar import ShardReader

__all__ = ["ShardStream"]

_SKIPPED = object()  # what _finish returns for a sample the handler skipped


class ShardStream(ResumableReading, IterDataPipe[Any]):
    """Read, shuffle, decode, pick fields, transform and batch, in one stage.

    Equivalent to ``source.open_tar(...)``, then ``.shuffle(buffer_size=...)``,
    ``.decode(image, resize=..., crop=...)``, ``.to_tuple(*fields)``, a ``map`` of
    ``transform`` over the first field, and ``.batch(batch_size).collate(collate_samples)``,
    with the handler of each stage. The recipes build on it; use it directly for a
    pipeline that is all of those steps and needs to be fast on small samples.

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
        storage_options: Passed to the fsspec filesystem.
        handler: Error policy of every step (see ``open_tar``).
        index: As for ``open_tar``.
        allow_pickle: As for ``decode``.
        decoders: Extension to decoder (or ``None``), over the defaults.
        threads: Decode (and transform) on a pool of this many threads, in order; Pillow
            releases the GIL while it decodes and resizes, so this uses idle cores when
            there are fewer DataLoader workers than cores (``num_workers=0`` above all).
            Below 2: no pool.
        retries: As for ``open_tar``.
        cache_dir: As for ``open_tar``.
        cache_size: As for ``open_tar``.
        max_member_bytes: As for ``open_tar``.
        max_errors: As for ``open_tar``.
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
        storage_options: Mapping[str, Any] | None = None,
        handler: Handler = "raise",
        index: bool | Mapping[str, str] = False,
        allow_pickle: bool | Iterable[str] = False,
        decoders: Mapping[str, Decoder | None] | None = None,
        threads: int = 0,
        retries: int = 5,
        cache_dir: str | None = None,
        cache_size: int | str | None = None,
        max_member_bytes: int = MAX_MEMBER_BYTES,
        max_errors: int | float | None = None,
    ) -> None:
        super().__init__()
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            msg = f"batch_size must be a positive int or None (got {batch_size!r})"
            raise ValueError(msg)
        self.source_datapipe = source_datapipe
        self.fields = tuple(fields)
        self.image = check_image_mode(image)
        self.transform = transform
        self.batch_size, self.drop_last = batch_size, drop_last
        if not isinstance(threads, int) or threads < 0:
            msg = f"threads must be a non-negative int (got {threads!r})"
            raise ValueError(msg)
        self.threads = threads
        self.buffer = ShuffleBuffer(buffer_size, seed)
        self.handler = as_policy(handler, max_errors)  # ErrorPolicy checks the handler
        self.reader = ShardReader(
            storage_options=storage_options, handler=self.handler, index=index,
            retries=retries, cache_dir=cache_dir, cache_size=cache_size,
            max_member_bytes=max_member_bytes,
        )  # fmt: skip
        self._alternatives = parse_fields(self.fields) if self.fields else ()
        self._table = decoder_table(
            image, resize=resize, crop=crop, allow_pickle=allow_pickle, overrides=decoders
        )
        self._decoders: dict[str, Decoder | None] = {}

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
        # not a generator function: the epoch begins (and state_dict sees it) at iter()
        return self._batches(self._begin(self.buffer.shuffling(self.source_datapipe)))

    def __len__(self) -> int:
        no_length(self)

    def _batches(self, located: Iterator[Located]) -> Iterator[Any]:
        finished = self._finished(located)
        if self.batch_size is None:
            yield from finished
        else:
            batch: list[Any] = []
            for sample in finished:
                batch.append(sample)
                if len(batch) == self.batch_size:
                    yield collate_samples(batch)
                    batch = []
            if batch and not self.drop_last:
                yield collate_samples(batch)
        self._ended()

    def _finish(self, sample: dict[str, Any]) -> Any:
        """Decode, pick and transform one sample; ``_SKIPPED`` when the handler skips it."""
        try:
            if not self._alternatives:
                out: Any = decode_sample(sample, self._table)
                return out if self.transform is None else self.transform(out)
            values = []
            for names in self._alternatives:
                field = names[0] if names[0] in sample else pick(sample, names)
                value = sample[field]
                if field in self._decoders:  # decoder_for() of each field seen, cached
                    decoder = self._decoders[field]
                else:
                    decoder = self._decoders[field] = decoder_for(self._table, field)
                if decoder is not None and isinstance(value, bytes):
                    try:
                        value = decoder(value)
                    except Exception as exc:
                        raise located(exc, sample, field) from exc
                values.append(value)
            if self.transform is not None:
                values[0] = self.transform(values[0])
            return SampleTuple(values)
        except MissingFieldError as exc:
            handle(self.handler, exc, stage="to_tuple", url=exc.url, key=exc.key)
        except DecodeError as exc:
            context = {"url": exc.url, "member": exc.member, "key": exc.key}
            handle(self.handler, exc, stage="decode", **context)
        return _SKIPPED

    def _finished(self, located: Iterator[Located]) -> Iterator[Any]:
        if self.threads < 2:
            finished: Iterator[Any] = map(self._finish, map(_sample, located))
        else:
            finished = self._threaded(located)
        return (out for out in finished if out is not _SKIPPED)

    def _threaded(self, located: Iterator[Located]) -> Iterator[Any]:
        """``_finish`` on a thread pool, in order, a few batches' worth at a time."""
        size = max(self.threads, self.batch_size or 1) * 2
        with ThreadPoolExecutor(self.threads, thread_name_prefix="shardpipes-decode") as pool:
            while chunk := list(itertools.islice(located, size)):
                epoch = self._epoch
                assert epoch is not None  # located() has begun
                epoch.chunk, epoch.chunk_done = chunk, 0  # in flight, for state_dict
                for out in pool.map(self._finish, map(_sample, chunk)):
                    epoch.chunk_done += 1
                    yield out
                epoch.chunk = []


_sample = operator.itemgetter(0)  # Located -> its sample
