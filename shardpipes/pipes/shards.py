"""Shard lists: listing shard URLs, and splitting them across workers and ranks."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch
from torch.utils.data import IterDataPipe, get_worker_info
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe

from shardpipes import fs
from shardpipes._core.braces import expand_braces
from shardpipes._core.elastic import share, unit_from_list
from shardpipes._core.epochs import EpochCounter
from shardpipes._core.split import ShardPart, SplitPlanner, global_worker, split_blocks
from shardpipes._retry import RetryPolicy
from shardpipes.errors import NoShardsError, ShardNotFoundError
from shardpipes.pipes._stage import functional_form, graph_pipes
from shardpipes.pipes.index import Ranges, shard_ranges

__all__ = [
    "ShardLister",
    "ShardSplitter",
    "distributed",
    "placement_of",
    "set_epoch",
    "splitters",
    "worker_placement",
]


class ShardLister(IterDataPipe[str]):
    """Yield shard URLs from brace patterns and globs (source: ``shardpipes.list_shards``).

    Each pattern has its braces expanded first (``{000..127}`` keeps zero padding,
    ``{a,b}``, several groups), then each expansion holding ``*``, ``?`` or ``[…]`` is globbed
    through fsspec (``**`` recurses). The given order is kept; the files of one glob are
    sorted. URLs are resolved when iterated (in the worker), not at construction.

    Every URL is checked to exist, so a missing shard fails the epoch at its start, not
    when a worker reaches it: a glob's files exist; the others are found with one listing
    per folder on ``s3://``, ``gs://`` and ``az://``, one lookup each elsewhere (see
    :func:`shardpipes.fs.missing_files`). Iterated alone, the lister checks before it
    yields the first URL; under a reading stage (``open_tar``, the recipes) the check runs
    while the first shards are fetched, and its error comes before the first sample.

    Args:
        urls: One pattern or a list of patterns: local paths, ``file://``, ``memory://``,
            ``s3://``… any fsspec URL.
        storage_options: Passed unchanged to the fsspec filesystem (credentials, endpoint).
        check_exists: Check that the shards exist before yielding any (one listing per
            folder); ``False`` leaves a missing one to fail when it is opened.
        retries: Tries again after a transient failure of a listing or lookup.

    Raises:
        NoShardsError: When iterated, if a glob matches no file; the message quotes it.
        ShardNotFoundError: When iterated, if a shard does not exist; the message names
            the first missing one and counts them.
        StorageError: When iterated, if the storage cannot be reached (after the retries).
        StorageAccessError: When iterated, if the storage refuses the credentials.

    Example:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> for i in range(3):
        ...     fs.pipe(f"/doc/train-{i:03d}.tar", b"")
        >>> list(ShardLister("memory://doc/train-{000..001}.tar"))
        ['memory://doc/train-000.tar', 'memory://doc/train-001.tar']
        >>> len(ShardLister(["memory://doc/train-*.tar"]))
        3
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        storage_options: Mapping[str, Any] | None = None,
        check_exists: bool = True,
        retries: int = RetryPolicy.retries,
    ) -> None:
        super().__init__()
        given = [urls] if isinstance(urls, str | os.PathLike) else urls
        if isinstance(given, Sequence):  # paths are taken as their strings
            given = [os.fspath(p) if isinstance(p, os.PathLike) else p for p in given]
        if not isinstance(given, list) or not given or not all(isinstance(p, str) for p in given):
            msg = f"urls must be a string or a non-empty list of strings (got {urls!r})"
            raise TypeError(msg)
        patterns: list[str] = given
        for pattern in patterns:
            expand_braces(pattern)  # fail early on unbalanced braces
        for pattern in patterns:
            # imported here, once: forked DataLoader workers inherit it, ready to read
            fs.load_backend(pattern)
        self.urls = list(patterns)
        self.storage_options = dict(storage_options or {})
        for pattern in patterns:
            if "::" in pattern:
                fs.check_chained(pattern, self.storage_options)
        self.check_exists = bool(check_exists)
        self.retries = RetryPolicy(retries).retries  # validated
        self._defer = False  # check in the background; the reading stage waits (checked())
        self._checking: Future[None] | None = None

    def defer_check(self) -> None:
        """Let the next iteration check in the background, while the first shard is read.

        The reading stage downstream (``open_tar``, ``ShardStream``) calls this as an epoch
        begins, and :meth:`checked` before it yields the epoch's first sample.
        """
        self._defer = True

    def checked(self) -> None:
        """Wait for a check begun in the background; raise what it found."""
        checking, self._checking = self._checking, None
        if checking is not None:
            checking.result()

    def __iter__(self) -> Iterator[str]:
        urls, named = [], []  # named: not from a glob, so not known to exist
        for pattern in self.urls:
            for url in expand_braces(pattern):
                found = self._glob(url) if fs.has_magic(url) else [_not_a_folder(url)]
                urls += found
                named += [] if fs.has_magic(url) else found
        defer, self._defer = self._defer, False
        if self.check_exists and named and defer:
            self._checking = _in_thread(functools.partial(self._check, named, len(urls)))
        elif self.check_exists and named:
            self._check(named, len(urls))
        yield from urls

    def _glob(self, url: str) -> list[str]:
        found = [name for name in fs.glob(url, self.storage_options) if not _sidecar(name)]
        if not found:
            msg = "no shard matches the pattern"
            raise NoShardsError(msg, url=url)
        return found

    def _check(self, urls: list[str], total: int) -> None:
        absent = fs.missing_files(urls, self.storage_options, RetryPolicy(self.retries))
        if not absent:
            return
        msg = "no such file"
        if total > 1:
            shown = ", ".join(absent[:3]) + (", …" if len(absent) > 3 else "")
            msg += f" ({len(absent)} of {total} shards missing"
            msg += f": {shown})" if len(absent) > 1 else ")"
        raise ShardNotFoundError(msg, url=absent[0])

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: what shardpipes writes beside shards: a glob over the shards' names leaves them out
SIDECARS = (".idx", "classes.json")


def _sidecar(url: str) -> bool:
    """Whether ``url`` is a sidecar shardpipes writes (an index, a class list), not a shard."""
    return url.endswith(SIDECARS)


def _not_a_folder(url: str) -> str:
    """``url``, unless it names a folder (its shards were meant): then an error saying so."""
    if fs.is_folder(url):
        msg = f"a folder, not a shard: give the shards in it, e.g. {url.rstrip('/') + '/*.tar'!r}"
        raise NoShardsError(msg, url=url)
    return url


def _in_thread(fn: Callable[[], None]) -> Future[None]:
    """Run ``fn`` in a daemon thread; its future."""
    future: Future[None] = Future()

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to whoever waits
            future.set_exception(exc)
        else:
            future.set_result(None)

    threading.Thread(target=run, daemon=True, name="shardpipes-check").start()
    return future


@functional_form("split_shards")
class ShardSplitter(ShardingFilterIterDataPipe):
    """Split shard URLs across workers × ranks, exactly once (functional name: ``split_shards``).

    Takes the place of ``sharding_filter``: torch's DataLoader calls its
    ``apply_sharding`` with the total number of workers (DataLoader workers × distributed
    ranks) and this worker's index. Iterated any other way (directly, in a training loop
    without a DataLoader, or under a loader that does not know DataPipes), it finds them
    itself from ``torch.utils.data.get_worker_info()`` and ``torch.distributed``. With at
    least as many shards as workers each worker gets whole shards; with fewer, the workers
    that share a shard each read one part of its samples, so 4 workers on 1 shard still
    see every sample exactly once. The split is :func:`~shardpipes._core.split.split_plan`
    (see :mod:`shardpipes._core.split`). Yields
    :class:`~shardpipes._core.split.ShardPart` items for ``open_tar``.

    Shard order: with ``shuffle=True`` the list is permuted before splitting, the same way
    on every worker and rank. With ``seed`` given the order is a function of
    ``(seed, epoch)`` only. Without, the DataLoader's seed (shared by its workers and,
    broadcast from rank 0, by all ranks) picks it; with no DataLoader, seed 0.
    ``DataLoader(pipe, shuffle=False)`` turns the shuffling off (``set_shuffle``).

    Epochs: each time iteration starts again (a new ``iter()`` of the pipe, or of a
    DataLoader over it) the epoch advances by one, so a second epoch never repeats the
    first one's order; :meth:`set_epoch` sets it (as with ``DistributedSampler``), and the
    next iteration uses exactly that epoch. Every rank counts the same iterations, so
    ranks agree without talking.

    Even split (``even=True``): every worker, hence every rank, reads the same number of
    samples, so DDP never waits on a rank that ran out. The shards' samples, end to end,
    are cut into equal blocks of ``N // total`` and the last ``N % total`` samples (fewer
    than the number of workers) are dropped for the epoch. It needs each shard's sample
    count: from its ``URL.idx`` sidecar (``shardpipes index``), else from a scan of its
    headers, done once per shard by each worker process (seeking over member data: about
    one read per member on a bucket; a ``.tar.gz`` is decompressed whole). Blocks are then
    read by byte range. A handler that skips bad samples breaks the equality.

    Args:
        source_datapipe: A pipe of shard URLs, e.g. :class:`ShardLister`.
        shuffle: Permute the shard order (by default, as the recipes do; ``False``, or
            ``DataLoader(pipe, shuffle=False)``, keeps the listed order).
        seed: Fixed seed for the permutation.
        even: Split so that every worker reads the same number of samples.
        storage_options: Passed to the filesystem when reading indexes (``even``).
        index: Index URLs by shard URL, where not the ``URL.idx`` sidecar (``even``,
            ``block_shuffle``).
        block_shuffle: With ``shuffle``, cut every shard into blocks of this many samples,
            permute the blocks of all shards by ``(seed, epoch)`` and deal them to the
            workers (:func:`~shardpipes._core.split.split_blocks`): every worker reads from
            every shard, so a small shuffle buffer mixes shards written in class order.
            Needs each shard's sample count, like ``even``, and uncompressed shards.

    Raises:
        ValueError: When iterated with ``even=True``, if there are fewer samples than
            workers.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> parts = IterableWrapper(["a.tar", "b.tar"]).split_shards(shuffle=False)
        >>> parts.apply_sharding(3, 2)
        >>> list(parts)
        [ShardPart(url='a.tar', part=1, parts=2, start=0, stop=None, span=None)]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        *,
        shuffle: bool = True,
        seed: int | None = None,
        even: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        index: Mapping[str, str] | None = None,
        block_shuffle: int | None = None,
    ) -> None:
        if seed is not None and not isinstance(seed, int):
            msg = f"seed must be an integer or None (got {seed!r})"
            raise TypeError(msg)
        super().__init__(source_datapipe)
        if storage_options is None:
            storage_options = lister_options(source_datapipe)
        # not `self.shuffle`: an attribute of that name would hide torch's `.shuffle()` form
        self.shuffle_shards = shuffle
        self.seed = seed
        self.even = bool(even)
        if block_shuffle is not None and (
            isinstance(block_shuffle, bool)
            or not isinstance(block_shuffle, int)
            or block_shuffle < 1
        ):
            msg = f"block_shuffle must be None or an int of at least 1 (got {block_shuffle!r})"
            raise ValueError(msg)
        self.block_shuffle = block_shuffle
        self.storage_options = dict(storage_options or {})
        self.index = dict(index or {})
        self._epochs = EpochCounter()  # shared with this pipe's DataLoader workers
        self._shared_seed: int | None = None
        self._begun = 0  # iterations this copy of the pipe has begun
        # each shard's sample ranges (uncompressed offsets) and whether it is compressed, by
        # URL: for the even and block splits, and resume_from
        self._ranges: dict[str, tuple[Ranges, bool]] = {}
        self._lengths: dict[str, int | None] = {}  # len(): sample counts from .idx sidecars
        self._used: dict[str, Any] | None = None  # what the last plan was made of
        self._pinned: dict[str, Any] | None = None  # a loaded state, for the next plan
        self._pass_epoch: int | None = None  # next_pass()
        self._elastic: dict[str, Any] | None = None  # resume_from(): the epoch's rest

    def set_seed(self, seed: int) -> ShardSplitter:
        """Take the DataLoader's seed (shared by all workers and ranks) for the shard order.

        The DataLoader calls this each time it starts iterating (in its own process, and
        with the same seed in each worker), so an iteration under a new seed is the next
        epoch (see :class:`~shardpipes._core.epochs.EpochCounter`).
        """
        self._shared_seed = seed
        return self

    def set_shuffle(self, shuffle: bool = True) -> ShardSplitter:
        """Turn the shard-order shuffle on or off (``DataLoader(shuffle=...)`` calls this)."""
        self.shuffle_shards = bool(shuffle)
        return self

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (later ones count on from it).

        The shard order (with a fixed ``seed``) and seeded shuffle buffers downstream are
        functions of it.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            msg = f"epoch must be a non-negative int (got {epoch!r})"
            raise ValueError(msg)
        self._epochs.set(epoch)
        if self._elastic is not None and self._elastic["epoch"] != epoch:
            self._elastic = None  # another epoch: the resumed one is over

    @property
    def epoch(self) -> int:
        """The epoch of the current iteration (or of the next, if none has begun)."""
        return self._epochs.current()

    def placement(self) -> tuple[int, int]:
        """Return ``(total workers, this worker's global index)`` for the next iteration."""
        if self.groups:  # apply_sharding was called: the DataLoader counted workers and ranks
            return self.num_of_instances, self.instance_id
        return worker_placement()

    def order_seed(self) -> int:
        """The seed of the shard order: ``seed``, else the DataLoader's, else 0."""
        if self.seed is not None:
            return self.seed
        return self._shared_seed if self._shared_seed is not None else 0

    def plan(self) -> list[ShardPart]:
        """This worker's parts for the current epoch, in reading order."""
        return self._plan(self.epoch, pinned=None)

    def _plan(self, epoch: int, pinned: Mapping[str, Any] | None) -> list[ShardPart]:
        # iter(): list() would ask the lister's len() first, listing (and checking) twice
        urls = list(iter(self.source_datapipe))
        total, worker = self.placement()
        check_process_group(total)
        seed = self.order_seed()
        used = {
            "seed": seed, "epoch": epoch, "shards": len(urls), "digest": _digest(urls),
            "workers": total, "worker": worker, "even": self.even,
            "shuffle": self.shuffle_shards, "seeded": self.seed is not None,
        }  # fmt: skip
        if self._blocks(self.shuffle_shards):
            used["blocks"] = self.block_shuffle
        elastic: Mapping[str, Any] | None = None
        if self._elastic is not None and self._elastic["epoch"] == epoch:
            elastic = self._elastic
        if pinned is not None:
            _check_state(pinned, used, fixed_seed=self.seed)
            seed, epoch = used["seed"], used["epoch"] = pinned["seed"], pinned["epoch"]
            self._count_pinned(pinned)  # later ones count on from it
            elastic = pinned if "elastic" in pinned else None
        if elastic is not None:  # the rest of an epoch begun on another topology
            _check_state(elastic, used, fixed_seed=self.seed)
            seed, epoch = used["seed"], used["epoch"] = elastic["seed"], elastic["epoch"]
            used["elastic"] = elastic["elastic"]
        self._used = used
        units = None if elastic is None else elastic["elastic"]["units"]
        return self.parts_for(urls, seed=seed, epoch=epoch, total=total, worker=worker,
                              units=units)  # fmt: skip

    def parts_for(
        self,
        urls: list[str],
        *,
        seed: int,
        epoch: int,
        total: int,
        worker: int,
        shuffle: bool | None = None,
        units: Sequence[Sequence[Any]] | None = None,
    ) -> list[ShardPart]:
        """Worker ``worker`` of ``total``'s parts in an epoch, as this stage splits it.

        The split plan, the block split, or, given the ``units`` an epoch resumed on another
        topology left (``resume_from``), this worker's share of them; with their byte spans
        where the split counted the samples. ``shuffle``: as the epoch was read (default
        this stage's).
        """
        shuffle = self.shuffle_shards if shuffle is None else shuffle
        if units is not None:
            left = [unit_from_list(unit, urls) for unit in units]
            parts = share(left, total, worker, even=self.even)
        else:
            counted = self.even or self._blocks(shuffle)
            counts = [self._count(url) for url in urls] if counted else None
            if self._blocks(shuffle):
                self._check_ranged(urls)
            parts = self.split(urls, counts, seed=seed, epoch=epoch, total=total, worker=worker,
                               shuffle=shuffle)  # fmt: skip
        if self.even or self._blocks(shuffle):
            return [self._span(part) for part in parts]
        return parts

    def split(
        self,
        urls: list[str],
        counts: list[int] | None,
        *,
        seed: int,
        epoch: int,
        total: int,
        worker: int,
        shuffle: bool | None = None,
    ) -> list[ShardPart]:
        """Worker ``worker`` of ``total``'s parts, the split this stage makes (no byte spans).

        ``counts`` (the shards' sample counts) are needed with ``even`` or ``block_shuffle``.
        ``shuffle``: as the epoch was read (default this stage's).
        """
        shuffle = self.shuffle_shards if shuffle is None else shuffle
        size = self._blocks(shuffle)
        if size:
            assert counts is not None
            return split_blocks(
                urls, counts, size, seed=seed, epoch=epoch, total=total,
                worker=worker, even=self.even,
            )  # fmt: skip
        # one planner per shard list, seed and epoch: its order is computed once for every
        # worker asked (resume_from replays them all)
        key = (shuffle, seed, epoch, self.even)
        cached = _PLANNERS.get(self)
        if cached is None or cached[0] is not urls or cached[1] != key:
            planner = SplitPlanner(
                urls, shuffle=shuffle, seed=seed, epoch=epoch,
                counts=counts if self.even else None,
            )  # fmt: skip
            cached = _PLANNERS[self] = (urls, key, planner)
        return cached[2].plan(1, 0, total, worker)

    def _blocks(self, shuffle: bool) -> int:
        """The block size of the block split (0: not split by block)."""
        return self.block_shuffle if self.block_shuffle is not None and shuffle else 0

    def shard_ranges(self, url: str) -> tuple[Ranges, bool]:
        """A shard's sample ranges (uncompressed offsets), and whether it is compressed.

        From its index, else a scan of its headers; once per shard and process.
        """
        if url not in self._ranges:
            self._ranges[url] = shard_ranges(url, self.storage_options, self.index.get(url))
        return self._ranges[url]

    def _check_ranged(self, urls: list[str]) -> None:
        for url in urls:
            if self.shard_ranges(url)[1]:
                msg = (
                    f"{url}: block_shuffle reads blocks by byte range, which a compressed "
                    "shard cannot give: use uncompressed .tar shards, or block_shuffle=None"
                )
                raise ValueError(msg)

    def resumed_units(self) -> list[Any] | None:
        """The units left of the epoch ``len()`` counts, if ``resume_from`` resumed it here."""
        found = self._pinned if self._pinned is not None else self._elastic
        if found is None or "elastic" not in found or found["epoch"] != self.epoch:
            return None
        units: list[Any] = found["elastic"]["units"]
        return units

    def resume_elastic(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration the rest of an epoch (see ``shardpipes.resume_from``).

        ``state`` is a split state (seed, epoch, shards, digest) with the units left, under
        ``"elastic"``; it applies to its epoch, the next one begun.
        """
        self._elastic = dict(state)
        self._pinned = None
        self._epochs.set(state["epoch"])

    def _iteration_key(self) -> int | None:
        """What the workers of one iteration share, and the next iteration's do not.

        The DataLoader's shared seed (new for every ``iter()`` of an ``IterDataPipe``
        DataLoader), else the worker's base seed (new for every ``iter()`` unless the
        workers persist), with the number of iterations this copy of the pipe has begun
        (the same in all workers of one iteration, new for the next with persistent
        workers). ``None`` (every iteration new) in the main process without a loader.
        """
        self._begun += 1
        return iteration_key(self._shared_seed, self._begun)

    def next_pass(self, epoch: int) -> None:
        """Make this process's next iteration ``epoch``, leaving the shared count alone.

        For a source that ``mix(epoch_size=...)`` reads more than once in an epoch: each
        worker starts its passes when its own share runs out, so the pass's epoch must not
        go through the counter the workers share.
        """
        self._pass_epoch = epoch

    def begin_now(self) -> None:
        """Count the next iteration's epoch now, not when it is first read from.

        A ``mix`` begins its sources' epochs together when its own begins: it reads from
        each only when drawn, and an iteration cut short (a loader resuming at the end of
        an epoch) must leave every source's count where the others' are.
        """
        if self._pinned is not None:  # a loaded state's epoch: counted as begun now
            self._count_pinned(self._pinned)
        elif self._pass_epoch is None:
            self._pass_epoch = self._epochs.begin(self._iteration_key())

    def _count_pinned(self, pinned: Mapping[str, Any]) -> None:
        """Count a loaded state's epoch as this iteration's (after checking ``set_epoch``'s).

        A pass's epoch (``mix(epoch_size=)``, ``cycle_epochs``) counts as the epoch it is a
        pass of: the next iteration is the one after that.

        Raises:
            ValueError: ``set_epoch`` chose another epoch for this iteration.
        """
        chosen, epoch = self._epochs.chosen(), pinned["epoch"] % PASS_STRIDE
        if chosen is not None and chosen != epoch:
            msg = (
                f"the state was saved in epoch {epoch}; this pipe was set to epoch {chosen} "
                "(set_epoch): set the epoch the checkpoint was taken in"
            )
            raise ValueError(msg)
        self._epochs.resumed(epoch)

    def __iter__(self) -> Iterator[ShardPart]:
        local, self._pass_epoch = self._pass_epoch, None
        pinned, self._pinned = self._pinned, None
        if local is not None:
            epoch = local
        elif pinned is not None:  # its epoch is counted from the state, not as a new one
            epoch = self._epochs.peek(self._iteration_key())
        else:
            epoch = self._epochs.begin(self._iteration_key())
        yield from self._plan(epoch, pinned)

    def __len__(self) -> int:
        return len(self.plan())

    def used(self) -> dict[str, Any] | None:
        """What the last plan was made of (seed, epoch, shards, workers, worker), if any."""
        return self._used

    def state_dict(self) -> dict[str, Any]:
        """The shard order and split of the current epoch: seed, epoch, shards, workers."""
        if self._pinned is not None:
            return dict(self._pinned)
        if self._used is not None:
            return dict(self._used)
        if self._elastic is not None and self._elastic["epoch"] == self.epoch:
            return dict(self._elastic)
        return {"seed": self.order_seed(), "epoch": self.epoch}

    def upcoming_state(self) -> dict[str, Any]:
        """The state of the iteration about to begin here, before it reads anything.

        A loaded state, else the next epoch's start: the one :meth:`state_dict` gives only
        once the iteration has begun (a DataLoader worker's state is taken when its
        iterator is made, before the epoch is counted).
        """
        if self._pinned is not None:
            return dict(self._pinned)
        if self._pass_epoch is not None:
            epoch = self._pass_epoch
        else:
            epoch = self._epochs.peek(iteration_key(self._shared_seed, self._begun + 1))
        if self._elastic is not None and self._elastic["epoch"] == epoch:
            return dict(self._elastic)
        return {"seed": self.order_seed(), "epoch": epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration use a saved epoch's shard order, after checking it.

        Raises:
            ValueError: Here if the state is malformed; when iterated, if the shard list,
                the number of workers × ranks, this worker's index, ``even`` or a fixed
                ``seed`` differ from the saved ones.
        """
        if not isinstance(state, Mapping) or not all(
            isinstance(state.get(k), int) for k in ("seed", "epoch")
        ):
            msg = f"not a split_shards state (needs int 'seed' and 'epoch'): {state!r:.200}"
            raise ValueError(msg)
        self._pinned = dict(state)

    def drop_pinned(self) -> None:
        """Drop a loaded state that no iteration used; its epoch counts as done."""
        if self._pinned is not None:
            if self._epochs.chosen() is None:  # else set_epoch chose the next one
                self._epochs.resumed(self._pinned["epoch"] % PASS_STRIDE)
            self._pinned = None

    def _count(self, url: str) -> int:
        return len(self.shard_ranges(url)[0])

    def _span(self, part: ShardPart) -> ShardPart:
        """``part`` with the byte span of its samples, where it is a range of a plain tar."""
        if part.span is not None or part.stop is None or part.parts != 1:
            return part
        ranges, compressed = self.shard_ranges(part.url)
        if compressed:  # read from its start, not by range
            return part
        return part._replace(span=(ranges[part.start][0], ranges[part.stop - 1][1]))


#: each splitter's last SplitPlanner: (its shard list, (shuffle, seed, epoch, even), it);
#: held beside the splitter, not in it, so that it is never pickled to the workers
_PLANNERS: weakref.WeakKeyDictionary[ShardSplitter, tuple[list[str], Any, SplitPlanner]] = (
    weakref.WeakKeyDictionary()
)


def _digest(urls: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(urls).encode(), usedforsecurity=False).hexdigest()[:16]


def _check_state(
    saved: Mapping[str, Any], now: Mapping[str, Any], *, fixed_seed: int | None
) -> None:
    """Raise ``ValueError`` naming the first way a saved split state differs from now.

    Not its epoch: see ``ShardSplitter._count_pinned``.
    """
    if "digest" in saved and (saved["shards"], saved["digest"]) != (now["shards"], now["digest"]):
        msg = (
            f"the state was saved for another shard list ({saved['shards']} shards, digest "
            f"{saved['digest']}; now {now['shards']} shards, digest {now['digest']})"
        )
        raise ValueError(msg)
    if "workers" in saved and (saved["workers"], saved["worker"]) != (
        now["workers"],
        now["worker"],
    ):
        msg = (
            f"the state was saved by worker {saved['worker']} of {saved['workers']} (DataLoader "
            f"workers × ranks); this is worker {now['worker']} of {now['workers']}. To resume "
            "on another number of workers or ranks: pipe = sp.resume_from(pipe, state)"
        )
        raise ValueError(msg)
    if fixed_seed is not None and saved["seed"] != fixed_seed:
        msg = f"the state was saved with seed {saved['seed']}; this pipe has seed={fixed_seed}"
        raise ValueError(msg)
    if saved.get("blocks") != now.get("blocks") and "workers" in saved:
        msg = (
            f"the state was saved with block_shuffle={saved.get('blocks')}; this pipe reads "
            f"with block_shuffle={now.get('blocks')}"
        )
        raise ValueError(msg)
    if saved.get("even", now["even"]) != now["even"]:
        msg = f"the state was saved with even={saved['even']}; this pipe has even={now['even']}"
        raise ValueError(msg)


def lister_options(pipe: Any) -> dict[str, Any] | None:
    """The ``storage_options`` of the ``list_shards`` stage upstream of ``pipe``, if any.

    A stage that reads the listed shards takes them when given none of its own: a user
    who passed credentials to ``list_shards`` means them for the reads too.
    """
    seen: set[int] = set()
    while pipe is not None and id(pipe) not in seen:
        seen.add(id(pipe))
        if isinstance(pipe, ShardLister):
            return dict(pipe.storage_options) or None
        pipe = getattr(pipe, "source_datapipe", None)
    return None


def splitters(pipe: IterDataPipe[Any]) -> list[ShardSplitter]:
    """The ``split_shards`` stages upstream of ``pipe``, in a stable order."""
    return [s for s in graph_pipes(pipe) if isinstance(s, ShardSplitter)]


def placement_of(pipe: IterDataPipe[Any]) -> tuple[int, int]:
    """``(total workers, this one's global index)`` as the splits upstream of ``pipe`` see it.

    The first ``split_shards`` stage's (``apply_sharding``'s, if the DataLoader called
    it), else this process's DataLoader worker and rank.
    """
    for splitter in splitters(pipe):
        return splitter.placement()
    return worker_placement()


#: a source's next pass within one epoch of ``mix(epoch_size=...)`` is its split's epoch
#: plus this: each pass has a new order, apart from the epochs a loader counts
PASS_STRIDE = 1 << 20


def iteration_key(shared_seed: int | None, begun: int) -> int | None:
    """The key of a pipe's ``begun``-th iteration: shared by the workers of one iteration.

    From the DataLoader's shared seed if the pipe got it (``set_seed``), else the worker's
    base seed; ``None`` outside a DataLoader (see ``ShardSplitter._iteration_key``).
    """
    base = shared_seed
    if base is None:
        info = get_worker_info()
        base = info.seed - info.id if info is not None else None
    if base is None:
        return None
    digest = hashlib.sha256(f"{base}:{begun}".encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def set_epoch(pipe: IterDataPipe[Any], epoch: int) -> IterDataPipe[Any]:
    """Set the epoch of every ``split_shards`` stage in a pipeline; returns ``pipe``.

    The shard order of a seeded ``split_shards``, and seeded shuffle buffers, are functions
    of ``(seed, epoch)``. The epoch advances by itself each time iteration starts again;
    call this to choose it, e.g. before each epoch as with
    ``DistributedSampler.set_epoch``, or after loading a checkpoint.

    Raises:
        ValueError: If the pipeline has no ``split_shards`` stage (nothing takes an epoch).
    """
    stages = splitters(pipe)
    if not stages:
        msg = (
            f"{type(pipe).__name__} has no split_shards stage, so nothing in it takes an "
            "epoch: add .split_shards() after list_shards()"
        )
        raise ValueError(msg)
    for stage in stages:
        stage.set_epoch(epoch)
    for other in graph_pipes(pipe):
        if getattr(other, "takes_epoch", False):  # a mix (shardpipes.pipes.mix)
            other.set_epoch(epoch)
    return pipe


def check_process_group(total: int) -> None:
    """Refuse to read as one process when the environment says there are several.

    ``torchrun`` sets ``WORLD_SIZE``; without ``init_process_group`` the split cannot see
    the other ranks, and every rank would read every sample. A warning would scroll by
    once per rank and worker while the job trains on duplicates: this is an error.

    Args:
        total: The workers × ranks the split found.

    Raises:
        ValueError: ``WORLD_SIZE`` is above 1 and the split found one rank.
    """
    given = os.environ.get("WORLD_SIZE", "1")
    info = get_worker_info()
    world = total // (info.num_workers if info is not None else 1)
    if world == 1 and given.isdigit() and int(given) > 1:
        msg = (
            f"WORLD_SIZE={given} is set (as torchrun does), but torch.distributed is not "
            "initialized, so every process would read every sample: call "
            "torch.distributed.init_process_group() (backend 'gloo' on CPU, 'nccl' on GPUs) "
            "before the loader starts, or unset WORLD_SIZE for one process to read it all"
        )
        raise ValueError(msg)


def distributed() -> tuple[int, int]:
    """``(world size, rank)`` of ``torch.distributed``, or ``(1, 0)`` when not initialized."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def worker_placement(ranks: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(total workers, global index)`` from the DataLoader worker and the distributed rank.

    Args:
        ranks: ``(world size, rank)`` when known (taken in the main process: a worker
            started by ``spawn`` has no process group); default :func:`distributed`.
    """
    info = get_worker_info()
    num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
    world_size, rank = ranks or distributed()
    return global_worker(world_size, rank, num_workers, worker_id)
