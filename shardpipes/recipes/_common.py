"""What the streaming recipes share: their options, the fields they pick, the chain they build."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.policy import as_policy
from shardpipes._core.stage import checked_int
from shardpipes.fs.retry import RetryPolicy
from shardpipes.pipes.collate import collate_samples
from shardpipes.pipes.decode import DecodeOptions, SampleDecoder
from shardpipes.pipes.fields import TupleMaker
from shardpipes.pipes.mix import Mixer
from shardpipes.pipes.reader import READ_KEYS, check_options
from shardpipes.pipes.resumable import Resumable
from shardpipes.pipes.shards import ShardLister
from shardpipes.pipes.shuffle import SampleShuffler
from shardpipes.pipes.split import ShardSplitter
from shardpipes.pipes.tar import TarOpener

IMAGE_FIELDS = "jpg;jpeg;png;webp;bmp;ppm;pgm;pbm;pnm;gif;tif;tiff"
LABEL_FIELDS = "cls;cls2;label;index"

DECODE_KEYS = frozenset(field.name for field in dataclasses.fields(DecodeOptions))
LIST_KEYS = frozenset({"check_exists"})


@dataclasses.dataclass(frozen=True)
class Options:
    """A recipe's ``**options``, sorted: the reading's, the decoding's, the listing's."""

    read: dict[str, Any]
    decode: DecodeOptions
    check_exists: bool

    @classmethod
    def of(cls, where: str, taker: Callable[..., Any], options: Mapping[str, Any]) -> Options:
        """The options a recipe was given, checked (a typo gets the closest name)."""
        check_options(where, options, taker, READ_KEYS | DECODE_KEYS | LIST_KEYS)
        read = {k: v for k, v in options.items() if k in READ_KEYS}
        read["handler"] = as_policy(read.get("handler", "raise"), read.pop("max_errors", None))
        decode = DecodeOptions(**{k: v for k, v in options.items() if k in DECODE_KEYS})
        return cls(read, decode, bool(options.get("check_exists", True)))


def splitter(urls: str | Sequence[str], options: Options, **split: Any) -> ShardSplitter:
    """A recipe's shard list and split, with the storage options and retries of its reading."""
    storage_options = options.read.get("storage_options")
    shards = ShardLister(
        urls,
        storage_options=storage_options,
        check_exists=options.check_exists,
        retries=options.read.get("retries", RetryPolicy.retries),
    )
    return ShardSplitter(shards, storage_options=storage_options, **split)


def chain(
    shards: IterDataPipe[Any],
    options: Options,
    *,
    index: bool | Mapping[str, str] = False,
    buffer_size: int = 0,
    shuffle: bool = True,
) -> IterDataPipe[Any]:
    """``open_tar`` → ``shuffle_samples`` → ``decode``, one handler for all."""
    pipe: IterDataPipe[Any] = TarOpener(shards, index=index, **options.read)
    if buffer_size >= 2:
        pipe = SampleShuffler(pipe, buffer_size).set_shuffle(shuffle)
    return SampleDecoder(pipe, options.decode, handler=options.read["handler"])


def finish(
    pipe: IterDataPipe[Any],
    options: Options,
    *,
    fields: Sequence[str],
    transform: Callable[[Any], Any] | None,
    batch_size: int | None,
    drop_last: bool,
) -> Resumable:
    """The recipe's end: its fields, transform, batches (``batch`` + ``collate``), a root."""
    if fields:
        pipe = TupleMaker(pipe, *fields, handler=options.read["handler"])
    checked_int(batch_size, "batch_size", optional=True)
    if transform is not None:
        pipe = pipe.map(functools.partial(_transformed, transform, bool(fields)))
    if batch_size is not None:
        pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_samples)
    return Resumable(pipe)


def _transformed(transform: Callable[[Any], Any], tuples: bool, sample: Any) -> Any:
    """Apply ``transform`` to a tuple's first field (or to a whole dict sample)."""
    if not tuples:
        return transform(sample)
    return type(sample)((transform(sample[0]), *sample[1:]))


def one_tar(
    url: str | Mapping[str, str],
    given: Options,
    *,
    index: bool | Mapping[str, str],
    even: bool,
    weights: Mapping[str, float] | None,
    transform: Callable[[Any], Any] | None,
    batch_size: int | None,
    drop_last: bool,
) -> Resumable:
    """(image, label) pairs from one tar split across workers by sample (streamed or indexed).

    A dict of name → tar mixes them, each split on its own.
    """
    fields = (IMAGE_FIELDS, LABEL_FIELDS)

    def source(one: str) -> IterDataPipe[Any]:
        shards = splitter(
            one,
            given,
            shuffle=False,
            even=even,
            index=index if isinstance(index, Mapping) else None,
        )
        return chain(shards, given, index=index)

    if isinstance(url, Mapping):
        pipe: IterDataPipe[Any] = Mixer({name: source(one) for name, one in url.items()}, weights)
    elif isinstance(url, str):
        if weights is not None:
            msg = "weights= is for a dict of tars to mix, e.g. {'a': 'a.tar', 'b': 'b.tar'}"
            raise TypeError(msg)
        pipe = source(url)
    else:
        msg = (
            f"url must be one URL string, or a dict of name -> URL to mix (got "
            f"{type(url).__name__}); use tar_shards for many shards"
        )
        raise TypeError(msg)
    return finish(
        pipe, given, fields=fields, transform=transform, batch_size=batch_size, drop_last=drop_last
    )
