"""What the streaming recipes share: their options, the fields they pick, the chain they build."""

from __future__ import annotations

import dataclasses
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


def lister(urls: str | Sequence[str], options: Options) -> ShardLister:
    """The shard list of a recipe, with the storage options and retries of its reading."""
    return ShardLister(
        urls,
        storage_options=options.read.get("storage_options"),
        check_exists=options.check_exists,
        retries=options.read.get("retries", RetryPolicy.retries),
    )


def chain(
    shards: IterDataPipe[Any],
    options: Options,
    *,
    index: bool | Mapping[str, str] = False,
    buffer_size: int = 0,
    shuffle: bool = True,
    fields: Sequence[str] = (),
) -> IterDataPipe[Any]:
    """``open_tar`` → ``shuffle_samples`` → ``decode`` → ``to_tuple``, one handler for all."""
    pipe: IterDataPipe[Any] = TarOpener(shards, index=index, **options.read)
    if buffer_size >= 2:
        pipe = SampleShuffler(pipe, buffer_size).set_shuffle(shuffle)
    handler = options.read["handler"]
    pipe = SampleDecoder(pipe, options.decode, handler=handler)
    return TupleMaker(pipe, *fields, handler=handler) if fields else pipe


def finish(
    pipe: IterDataPipe[Any],
    *,
    fields: Sequence[str],
    transform: Callable[[Any], Any] | None,
    batch_size: int | None,
    drop_last: bool,
) -> Resumable:
    """The recipe's end: its transform, batches (torch's ``batch`` + ``collate``), a root."""
    checked_int(batch_size, "batch_size", optional=True)
    if transform is not None:
        pipe = pipe.map(_First(transform, tuples=bool(fields)))
    if batch_size is not None:
        pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_samples)
    return Resumable(pipe)


def mixed(
    sources: Mapping[str, IterDataPipe[Any]],
    weights: Mapping[str, float] | None,
    options: Options,
    *,
    seed: int | None,
    epoch_size: int | None,
    resample: bool,
    fields: Sequence[str],
) -> IterDataPipe[Any]:
    """Sources of decoded dicts mixed by weight, then their fields picked."""
    pipe: IterDataPipe[Any] = Mixer(
        sources, weights, seed=seed or 0, epoch_size=epoch_size, resample=resample
    )
    if fields:
        pipe = TupleMaker(pipe, *fields, handler=options.read["handler"])
    return pipe


class _First:
    """Apply ``transform`` to a tuple's first field (or to a whole dict sample)."""

    def __init__(self, transform: Callable[[Any], Any], *, tuples: bool) -> None:
        self.transform, self.tuples = transform, tuples

    def __call__(self, sample: Any) -> Any:
        if not self.tuples:
            return self.transform(sample)
        return type(sample)((self.transform(sample[0]), *sample[1:]))


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
    from shardpipes.pipes.split import ShardSplitter

    fields = (IMAGE_FIELDS, LABEL_FIELDS)

    def source(one: str, picked: Sequence[str]) -> IterDataPipe[Any]:
        shards = ShardSplitter(
            lister(one, given), shuffle=False, even=even,
            storage_options=given.read.get("storage_options"),
            index=index if isinstance(index, Mapping) else None,
        )  # fmt: skip
        return chain(shards, given, index=index, fields=picked)

    if isinstance(url, Mapping):
        sources = {name: source(one, ()) for name, one in url.items()}
        pipe = mixed(
            sources, weights, given, seed=0, epoch_size=None, resample=False, fields=fields
        )
    elif isinstance(url, str):
        if weights is not None:
            msg = "weights= is for a dict of tars to mix, e.g. {'a': 'a.tar', 'b': 'b.tar'}"
            raise TypeError(msg)
        pipe = source(url, fields)
    else:
        msg = (
            f"url must be one URL string, or a dict of name -> URL to mix (got "
            f"{type(url).__name__}); use tar_shards for many shards"
        )
        raise TypeError(msg)
    return finish(
        pipe, fields=fields, transform=transform, batch_size=batch_size, drop_last=drop_last
    )
