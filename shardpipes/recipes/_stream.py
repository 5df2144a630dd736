"""What the streaming recipes share: the fields they pick, and one tar split by sample."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._retry import RetryPolicy
from shardpipes.pipes.collate import collate_samples
from shardpipes.pipes.fields import TupleMaker
from shardpipes.pipes.mix import Mixer
from shardpipes.pipes.shards import ShardLister, ShardSplitter
from shardpipes.pipes.stream import ShardStream

__all__ = ["IMAGE_FIELDS", "LABEL_FIELDS", "lister", "mixed_sources", "one_tar"]

IMAGE_FIELDS = "jpg;jpeg;png;webp;bmp;ppm;pgm;pbm;pnm;gif;tif;tiff"
LABEL_FIELDS = "cls;cls2;label;index"


def lister(
    urls: str | Sequence[str], options: Mapping[str, Any], *, check_exists: bool = True
) -> ShardLister:
    """The shard list of a recipe, with the storage options and retries of its reading options."""
    return ShardLister(
        urls,
        storage_options=options.get("storage_options"),
        check_exists=check_exists,
        retries=options.get("retries", RetryPolicy.retries),
    )


def one_tar(
    url: str | Mapping[str, str],
    *,
    index: bool | Mapping[str, str],
    even: bool = False,
    weights: Mapping[str, float] | None = None,
    **options: Any,
) -> IterDataPipe[Any]:
    """(image, label) pairs from one tar split across workers by sample (streamed or indexed).

    A dict of name → tar mixes them (see :func:`mixed_sources`). ``options`` go to
    :class:`~shardpipes.pipes.stream.ShardStream`.
    """
    if isinstance(url, Mapping):
        tail = {k: options.pop(k) for k in ("transform", "batch_size", "drop_last")}

        def source(i: int, one: Any) -> IterDataPipe[Any]:
            return one_tar(one, index=index, even=even, fields=(), **options)

        return mixed_sources(
            url, weights, source, seed=0, epochs=(None, False), fields=(IMAGE_FIELDS, LABEL_FIELDS),
            handler=options.get("handler", "raise"), **tail,
        )  # fmt: skip
    if not isinstance(url, str):
        msg = (
            f"url must be one URL string, or a dict of name -> URL to mix (got "
            f"{type(url).__name__}); use tar_shards for many shards"
        )
        raise TypeError(msg)
    if weights is not None:
        msg = "weights= is for a dict of tars to mix, e.g. {'a': 'a.tar', 'b': 'b.tar'}"
        raise TypeError(msg)
    storage_options = options.get("storage_options")
    shards = ShardSplitter(
        lister(url, options), even=even, storage_options=storage_options,
        index=index if isinstance(index, Mapping) else None,
    )  # fmt: skip
    options.setdefault("fields", (IMAGE_FIELDS, LABEL_FIELDS))
    return ShardStream(shards, index=index, **options)


def mixed_sources(
    sources: Mapping[str, Any],
    weights: Mapping[str, float] | None,
    source: Callable[[int, Any], IterDataPipe[Any]],
    *,
    seed: int | None,
    epochs: tuple[int | None, bool],
    fields: Sequence[str],
    transform: Callable[[Any], Any] | None,
    batch_size: int | None,
    drop_last: bool,
    handler: Any,
) -> IterDataPipe[Any]:
    """A recipe of a dict of sources: one stream of decoded dicts each, mixed by weight.

    ``source(i, urls)`` makes the ``i``-th source's stream (its fields: ``()``). Then the
    fields are picked, the transform applied and the batches collated by the chain's
    stages (``to_tuple``, ``map``, ``batch``, ``collate``).
    """
    streams = {name: source(i, urls) for i, (name, urls) in enumerate(sources.items())}
    epoch_size, resample = epochs
    pipe: IterDataPipe[Any] = Mixer(
        streams, weights, seed=seed or 0, epoch_size=epoch_size, resample=resample
    )
    if fields:
        pipe = TupleMaker(pipe, *fields, handler=handler)
    if transform is not None:
        pipe = pipe.map(_First(transform, tuples=bool(fields)))
    if batch_size is not None:
        pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_samples)
    return pipe


class _First:
    """Apply ``transform`` to a tuple's first field (or to a whole dict sample)."""

    def __init__(self, transform: Callable[[Any], Any], *, tuples: bool) -> None:
        self.transform, self.tuples = transform, tuples

    def __call__(self, sample: Any) -> Any:
        if not self.tuples:
            return self.transform(sample)
        return (self.transform(sample[0]), *sample[1:])
