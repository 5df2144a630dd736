"""The ``tar_shards`` recipe: many tar shards, split by shard across workers and ranks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterDataPipe

from shardpipes.pipes.reader import ReadOptions, check_options
from shardpipes.pipes.shards import ShardSplitter
from shardpipes.pipes.stream import ShardStream
from shardpipes.recipes._stream import IMAGE_FIELDS, LABEL_FIELDS, lister, mixed_sources

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["tar_shards"]


def tar_shards(
    urls: str | Sequence[str] | Mapping[str, str | Sequence[str]],
    *,
    weights: Mapping[str, float] | None = None,
    epoch_size: int | None = None,
    resample: bool = False,
    shuffle: bool = True,
    seed: int | None = None,
    epoch: int = 0,
    even: bool = False,
    buffer_size: int = 1000,
    block_shuffle: int | None = None,
    transform: Callable[[Any], Any] | None = None,
    image: str = "pil",
    resize: int | None = None,
    crop: int | None = None,
    batch_size: int | None = None,
    drop_last: bool = False,
    threads: int = 0,
    fields: Sequence[str] = (IMAGE_FIELDS, LABEL_FIELDS),
    check_exists: bool = True,
    **options: Unpack[ReadOptions],
) -> IterDataPipe[Any]:
    """Stream (image, label) pairs from many tar shards: the notebook's one-tar-per-worker loader.

    Works with any number of shards, DataLoader workers and distributed ranks: each
    worker reads whole shards when there are enough, and a part of a shard's samples when
    there are fewer shards than workers, so every sample comes exactly once per epoch.
    Reading, shuffling, decoding and batching run in one pipe stage
    (:class:`~shardpipes.pipes.stream.ShardStream`), which is what makes it fast on
    small samples; the chained pipes do the same work one stage at a time.

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
        epoch: The first epoch. Each new iteration is the next epoch; ``pipe.set_epoch(e)``
            chooses one (as with ``DistributedSampler``).
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
        transform: Applied to each decoded image (the first field).
        image: ``"pil"``, ``"numpy"``, ``"torch"`` or ``"bytes"`` (see ``decode``).
        resize: Scale each image so that its shorter side is this long; JPEGs are
            decoded at a reduced scale where that is enough.
        crop: Then cut the central ``crop`` x ``crop`` square; only that region is
            resampled. ``resize=256, crop=224`` gives what torchvision's ``Resize(256)``
            and ``CenterCrop(224)`` give, faster.
        batch_size: Collate batches of this many samples in the worker
            (:func:`~shardpipes.collate_samples`: a uint8 ``(B, C, H, W)`` tensor and an
            int64 label tensor); hand the pipe to ``DataLoader(pipe, batch_size=None)``.
            Default: single samples.
        drop_last: Drop each worker's last, shorter batch.
        threads: Decode on this many threads per worker (Pillow releases the GIL while
            decoding): for cores that DataLoader workers leave idle, e.g. with
            ``num_workers=0``. Default: no threads.
        fields: The fields of each sample, in order, each maybe with ``;``-separated
            alternatives; the default is (image, label). ``("bin", "cls")`` reads other
            data; only the named fields are decoded.
        check_exists: Check that every shard exists when an epoch starts, before reading
            any (one listing per folder; see :class:`~shardpipes.ShardLister`).
        **options: The reading options (:class:`~shardpipes.ReadOptions`):
            ``storage_options`` (passed to the fsspec filesystem); ``handler``, what every
            stage does with a bad member, sample or shard (``"raise"``, ``"warn"`` to skip
            and warn naming it, ``"ignore"``, a callable, or an ``ErrorPolicy``: the pipe's
            ``stats()`` counts what it skipped); ``max_errors``, the epoch's budget of
            skipped errors; ``retries`` after a transient storage failure (resuming the
            shard at the byte reached); ``cache_dir`` and ``cache_size``, a local cache of
            remote shards (least recently used evicted); ``max_member_bytes`` (1 GiB);
            ``readahead`` (``"64MiB"``), the bytes of remote shards each worker fetches
            ahead, and ``io_concurrency`` (4), its ranged requests in flight.

    Returns:
        A pipe to hand to ``torch.utils.data.DataLoader(pipe, batch_size=…, num_workers=…)``.

    Example:
        >>> from shardpipes.recipes import tar_shards
        >>> pipe = tar_shards("data/train-{000..099}.tar", image="torch", resize=256,
        ...                   crop=224, batch_size=64)
    """
    check_options("tar_shards", options, tar_shards)
    if not isinstance(shuffle, bool):
        msg = (
            f"shuffle must be True or False (got {shuffle!r}); the shuffle buffer's size is "
            "buffer_size="
        )
        raise TypeError(msg)
    if not isinstance(urls, Mapping) and (epoch_size is not None or resample):
        if weights is not None:
            msg = "weights= is for a dict of sources, e.g. tar_shards({'web': urls_a, ...})"
            raise TypeError(msg)
        urls = {"shards": urls}  # one source, read in passes
    if isinstance(urls, Mapping):
        stage: dict[str, Any] = dict(
            shuffle=shuffle, epoch=epoch, even=even, buffer_size=buffer_size,
            block_shuffle=block_shuffle, image=image, resize=resize, crop=crop, threads=threads,
            check_exists=check_exists, **options,
        )  # fmt: skip

        def source(i: int, urls: Any) -> IterDataPipe[Any]:
            return tar_shards(urls, fields=(), seed=None if seed is None else seed + i, **stage)

        return mixed_sources(
            urls, weights, source, seed=seed, epochs=(epoch_size, resample), fields=fields,
            transform=transform, batch_size=batch_size, drop_last=drop_last,
            handler=options.get("handler", "raise"),
        )  # fmt: skip
    if weights is not None:
        msg = (
            "weights= is for a dict of sources, e.g. tar_shards("
            '{"web": urls_a, "books": urls_b}, weights={"web": 3, "books": 1})'
        )
        raise TypeError(msg)
    storage_options = options.get("storage_options")
    shards = ShardSplitter(
        lister(urls, options, check_exists=check_exists),
        shuffle=shuffle, seed=seed, even=even, storage_options=storage_options,
        block_shuffle=block_shuffle,
    )  # fmt: skip
    if epoch != 0:  # set_epoch: a loaded state must then be of that epoch
        shards.set_epoch(epoch)
    stream = ShardStream(
        shards,
        fields=fields,
        image=image,
        resize=resize,
        crop=crop,
        transform=transform,
        batch_size=batch_size,
        drop_last=drop_last,
        threads=threads,
        buffer_size=buffer_size,
        **options,
    )
    return stream.set_shuffle(shuffle)
