"""The ``tar_shards`` recipe: many tar shards, split by shard across workers and ranks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.pipes.mix import Mixer
from shardpipes.pipes.resumable import Resumable
from shardpipes.recipes._common import IMAGE_FIELDS, LABEL_FIELDS, Options, chain, finish, splitter

__all__ = ["tar_shards"]


def tar_shards(
    urls: str | Sequence[str] | Mapping[str, str | Sequence[str]],
    *,
    weights: Mapping[str, float] | None = None,
    epoch_size: int | None = None,
    resample: bool = False,
    shuffle: bool = True,
    seed: int | None = None,
    even: bool = False,
    buffer_size: int = 1000,
    block_shuffle: int | None = None,
    fields: Sequence[str] = (IMAGE_FIELDS, LABEL_FIELDS),
    transform: Callable[[Any], Any] | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    **options: Any,
) -> Resumable:
    """Stream (image, label) pairs from many tar shards: the notebook's one-tar-per-worker loader.

    Works with any number of shards, DataLoader workers and distributed ranks: each
    worker reads whole shards when there are enough, and a part of a shard's samples when
    there are fewer shards than workers, so every sample comes exactly once per epoch.
    It is the chain ``list_shards`` → ``split_shards`` → ``open_tar`` →
    ``shuffle_samples`` → ``decode`` → ``to_tuple`` (→ ``map`` → ``batch`` → ``collate``)
    in a :class:`~shardpipes.Resumable` root.

    Args:
        urls: Shard URLs, brace patterns or globs (``"s3://b/train-{000..099}.tar"``); or
            a dict of name → those, to mix several sources (see :func:`shardpipes.mix`).
        weights: With a dict of sources: name → weight (default 1 each). Each source is
            read, shuffled and decoded on its own, and the samples are drawn from them in
            proportion to their weights before the fields are picked and batched; every
            sample of every source comes once per epoch. ``"__source__"`` in ``fields``
            picks the name of a sample's source.
        epoch_size: Exactly this many samples per epoch over all workers and ranks (in the
            weights' proportions, with several sources); a source that runs out starts
            another pass, in a new order. See :class:`shardpipes.Mixer`. With one list of
            shards, this replaces webdataset's ``with_epoch``.
        resample: An endless epoch: sources start another pass whenever they run out
            (webdataset's ``ResampledShards``, without replacement within a pass).
        shuffle: Shuffle the shard order and, through a buffer, the samples
            (``DataLoader(pipe, shuffle=...)`` overrides it, as for torch's pipes).
        seed: Fixed seed of the shard order and the shuffle buffer: the epoch's whole
            order is then a function of ``(seed, epoch, workers × ranks)``, the same on
            every run. By default the DataLoader's seed (broadcast from rank 0 under
            ``torch.distributed``) decides.
        even: Every worker (hence every distributed rank) yields the same number of
            samples, for DDP: up to ``total workers - 1`` samples are dropped per epoch (see
            :class:`~shardpipes.ShardSplitter`; it reads each shard's sample count from its
            ``.idx`` sidecar or a header scan).
        buffer_size: Samples held (undecoded) in the shuffle buffer, per worker;
            a size below 2 turns it off.
        block_shuffle: Cut each worker's shards into blocks of this many samples and read
            the blocks in a random order (interleaving its shards), one ranged read each:
            with shards written in class order, a buffer holding about 30 blocks then
            shuffles about as well as an iid draw (``benchmarks/shuffle_quality.py``): take
            ``block_shuffle`` near ``buffer_size / 30``.
            Needs uncompressed shards, and their sample counts (``.idx`` sidecars, else a
            header scan). With ``shuffle``; by default off.
        transform: Applied to each decoded image (the first field; the whole sample dict
            with ``fields=()``).
        batch_size: Collate batches of this many samples in the worker
            (:func:`~shardpipes.collate_samples`: a uint8 ``(B, C, H, W)`` tensor and an
            int64 label tensor); hand the pipe to ``DataLoader(pipe, batch_size=None)``.
            Default: single samples.
        drop_last: Drop each worker's last, shorter batch.
        fields: The fields of each sample, in order, each maybe with ``;``-separated
            alternatives; the default is (image, label). ``("bin", "cls")`` reads other
            data; only the named fields are decoded.
        **options: The reading options (:class:`~shardpipes.ReadOptions`: one ``handler``
            for every stage, ``storage_options``, ``retries``, ``cache_dir``…), the
            decoding options (:class:`~shardpipes.DecodeOptions`: ``image``, ``resize``,
            ``crop``, ``threads``…), and ``check_exists`` (see
            :class:`~shardpipes.ShardLister`).

    Returns:
        A pipe to hand to ``torch.utils.data.DataLoader(pipe, batch_size=…, num_workers=…)``.

    Example:
        >>> from shardpipes.recipes import tar_shards
        >>> pipe = tar_shards("data/train-{000..099}.tar", image="torch", resize=256,
        ...                   crop=224, batch_size=64)
    """
    given = Options.of("tar_shards", tar_shards, options)
    if not isinstance(shuffle, bool):
        msg = (
            f"shuffle must be True or False (got {shuffle!r}); the shuffle buffer's size is "
            "buffer_size="
        )
        raise TypeError(msg)
    if not isinstance(urls, Mapping) and weights is not None:
        msg = (
            "weights= is for a dict of sources, e.g. tar_shards("
            '{"web": urls_a, "books": urls_b}, weights={"web": 3, "books": 1})'
        )
        raise TypeError(msg)
    if not isinstance(urls, Mapping) and (epoch_size is not None or resample):
        urls = {"shards": urls}  # one source, read in passes
    read: dict[str, Any] = {
        "shuffle": shuffle, "even": even, "buffer_size": buffer_size, "block_shuffle": block_shuffle
    }  # fmt: skip
    if isinstance(urls, Mapping):
        sources = {
            name: _source(one, given, seed=None if seed is None else seed + i, **read)
            for i, (name, one) in enumerate(urls.items())
        }
        pipe: IterDataPipe[Any] = Mixer(
            sources, weights, seed=seed or 0, epoch_size=epoch_size, resample=resample
        )
    else:
        pipe = _source(urls, given, seed=seed, **read)
    return finish(
        pipe, given, fields=fields, transform=transform, batch_size=batch_size, drop_last=drop_last
    )


def _source(
    urls: str | Sequence[str],
    given: Options,
    *,
    shuffle: bool,
    buffer_size: int,
    **split: Any,
) -> IterDataPipe[Any]:
    shards = splitter(urls, given, shuffle=shuffle, **split)
    return chain(shards, given, buffer_size=buffer_size, shuffle=shuffle)
