"""The ``split_shards`` stage: the epoch's shard order, split exactly once over workers × ranks."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter.sharding import ShardingFilterIterDataPipe
from typing_extensions import override

from shardpipes._core.blocks import split_blocks
from shardpipes._core.clock import Clocked, EpochClock
from shardpipes._core.split import ShardPart, SplitPlanner
from shardpipes._core.split_state import check_split_state, digest
from shardpipes._core.stage import as_stage, no_length
from shardpipes.fs.retry import RetryPolicy
from shardpipes.pipes._stage import Pipe, functional_form
from shardpipes.pipes._torch import check_process_group, worker_placement
from shardpipes.pipes.index import Ranges, local_ranges, read_index, shard_ranges

__all__ = ["ShardSplitter"]


@functional_form("split_shards")
class ShardSplitter(Clocked, Pipe, ShardingFilterIterDataPipe):
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

    Shard order: with ``shuffle`` (the default, as the recipes) the list is permuted
    before splitting, the same way on every worker and rank. With ``seed`` given the order
    is a function of ``(seed, epoch, pass)`` only. Without, the DataLoader's seed (shared by
    its workers and, broadcast from rank 0, by all ranks) picks it; with no DataLoader,
    seed 0. ``DataLoader(pipe, shuffle=False)`` turns the shuffling off (``set_shuffle``).

    Epochs: :meth:`set_epoch` chooses one (as with ``DistributedSampler``); else each new
    iteration after one that began is the next epoch (see
    :class:`~shardpipes._core.stage.Stage`). A pass (``cycle_epochs``, a ``mix`` with
    ``epoch_size``) is a new order within the epoch.

    Even split (``even=True``): every worker, hence every rank, reads the same number of
    samples, so DDP never waits on a rank that ran out. The shards' samples, end to end,
    are cut into equal blocks of ``N // total`` and the last ``N % total`` samples (fewer
    than the number of workers) are dropped for the epoch. It needs each shard's sample
    count: from its ``URL.idx`` sidecar (``shardpipes index``, or written by
    ``shardpipes write`` and ``ShardWriter``), else from a scan of its headers, done once
    per shard by each worker process. Blocks are then read by byte range. A handler that
    skips bad samples breaks the equality.

    Args:
        source_datapipe: A pipe of shard URLs, e.g. :class:`~shardpipes.ShardLister`.
        shuffle: Permute the shard order.
        seed: Fixed seed for the permutation.
        even: Split so that every worker reads the same number of samples.
        storage_options: Passed to the filesystem when reading indexes (``even``); by
            default those given to ``list_shards``.
        index: Index URLs by shard URL, where not the ``URL.idx`` sidecar (``even``,
            ``block_shuffle``).
        block_shuffle: With ``shuffle``, cut every shard into blocks of this many samples,
            permute the blocks of all shards by ``(seed, epoch)`` and deal them to the
            workers (:func:`~shardpipes._core.blocks.split_blocks`): every worker reads from
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
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            msg = f"seed must be an integer or None (got {seed!r})"
            raise TypeError(msg)
        if block_shuffle is not None and (
            isinstance(block_shuffle, bool)
            or not isinstance(block_shuffle, int)
            or block_shuffle < 1
        ):
            msg = f"block_shuffle must be None or an int of at least 1 (got {block_shuffle!r})"
            raise ValueError(msg)
        super().__init__(source_datapipe)
        # not `self.shuffle`: an attribute of that name would hide torch's `.shuffle()` form
        self.shuffle_shards = bool(shuffle)
        self.seed = seed
        self.even = bool(even)
        self.block_shuffle = block_shuffle
        if storage_options is None:
            storage_options = as_stage(source_datapipe).listed_options()
        self.storage_options = dict(storage_options or {})
        self.index = dict(index or {})
        self.clock = EpochClock()
        self._shared_seed: int | None = None  # the DataLoader's (set_seed)
        self._placed: tuple[int, int] | None = None  # place(): resume_from's replays
        self._used: dict[str, Any] | None = None  # what the current plan is made of
        self._loaded: Mapping[str, Any] | None = None  # a loaded state, checked at the plan
        # each shard's sample ranges (uncompressed offsets) and whether it is compressed
        self._ranges: dict[str, tuple[Ranges, bool] | None] = {}

    # -- torch's hooks ----------------------------------------------------------------------

    def set_seed(self, seed: int) -> ShardSplitter:
        """Take the DataLoader's seed (shared by all workers and ranks) for the shard order."""
        self._shared_seed = seed
        return self

    def set_shuffle(self, shuffle: bool = True) -> ShardSplitter:
        """Turn the shard-order shuffle on or off (``DataLoader(shuffle=...)`` calls this)."""
        self.shuffle_shards = bool(shuffle)
        return self

    # -- the protocol ---------------------------------------------------------------------

    def set_epoch(self, epoch: int, *, given: bool = True) -> None:
        """Set the epoch of the next iteration; the shard order is a function of it."""
        self.clock.set(epoch, given=given)
        self._used = None

    @override
    def next_pass(self) -> None:
        self.clock.next_pass()  # a state loaded in the pass before was of that pass
        self._used, self._loaded, self._fresh = None, None, True

    def placement(self) -> tuple[int, int]:
        """``(total workers, this worker's global index)`` for the next iteration."""
        if self._placed is not None:
            return self._placed
        if self.groups:  # apply_sharding was called: the DataLoader counted workers and ranks
            return self.num_of_instances, self.instance_id
        return worker_placement()

    @override
    def place(self, placed: tuple[int, int] | None) -> None:
        self._placed = placed

    @override
    def split_seed(self) -> int | None:
        return self.seed

    even = endless = False  # instance values: the stage's own answers
    exact = split = True

    @override
    def listed_options(self) -> dict[str, Any]:
        return self.storage_options

    def want(self, fields: frozenset[str] | None) -> None:
        """Shard URLs: no fields."""

    @override
    def policies(self) -> dict[int, Any]:
        return {}

    def order_seed(self) -> int:
        """The seed of the shard order: ``seed``, else the DataLoader's, else 0."""
        if self.seed is not None:
            return self.seed
        return self._shared_seed if self._shared_seed is not None else 0

    def state(self) -> dict[str, Any]:
        """The epoch's shard order and split: seed, epoch, pass, shards, workers."""
        below = self.sources()[0].state()  # a list's is empty; a stage's refuses (cycle…)
        if self._loaded is not None:
            return dict(self._loaded)
        own = {"seed": self.order_seed(), **self.clock.state(), **(self._used or {})}
        return {**own, "source": below} if below else own

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """Set up the next iteration: the current epoch's start, or a saved epoch's split.

        Raises:
            ValueError: A malformed state, or one of another epoch than ``set_epoch``
                chose; when iterated, a state of another shard list, number of workers ×
                ranks, worker, ``even`` or fixed ``seed``.
        """
        self._fresh, self._used = True, None
        if state is None:
            self.clock.restart()
            self._loaded = None
            self.sources()[0].reset(None)
            return
        if not isinstance(state, Mapping) or not isinstance(state.get("seed"), int):
            msg = f"not a split_shards state (needs an int 'seed'): {str(state)[:200]}"
            raise ValueError(msg)
        self.clock.load(dict(state), "split_shards")
        self.sources()[0].reset(state.get("source"))
        if self.seed is None:
            self._shared_seed = state["seed"]
        self._loaded = dict(state)

    # -- iteration ----------------------------------------------------------------------------

    def _iterate(self) -> Iterator[ShardPart]:
        urls, total, worker = self._placed_urls()
        self.clock.start()
        loaded, self._loaded = self._loaded, None
        self._used = self._checked_plan(urls, total, worker, loaded)
        yield from self._parts(urls, total, worker)

    def _placed_urls(self) -> tuple[list[str], int, int]:
        """The shard list, and this iteration's ``(total workers, global worker)``."""
        # iter(): list() would ask the lister's len() first, listing (and checking) twice
        urls = list(iter(self.source_datapipe))
        total, worker = self.placement()
        check_process_group(total)
        return urls, total, worker

    def _checked_plan(
        self, urls: list[str], total: int, worker: int, loaded: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """What the plan is made of, a ``loaded`` state checked against it."""
        used = {
            "shards": len(urls), "digest": digest(urls), "workers": total, "worker": worker,
            "even": self.even, "shuffle": self.shuffle_shards, "seeded": self.seed is not None,
        }  # fmt: skip
        if self._blocks():
            used["blocks"] = self.block_shuffle
        if loaded is not None:
            check_split_state(loaded, used, fixed_seed=self.seed)
        return used

    def check_loaded(self) -> None:
        """Check a loaded state on the shard list and placement now (one listing)."""
        if self._loaded is not None:
            self._checked_plan(*self._placed_urls(), self._loaded)

    def _parts(self, urls: list[str], total: int, worker: int) -> list[ShardPart]:
        """Worker ``worker`` of ``total``'s parts of the current epoch and pass.

        With their byte spans where the split counted the samples.
        """
        shuffle, size = self.shuffle_shards, self._blocks()
        seed, epoch, pass_ = self.order_seed(), self.clock.epoch, self.clock.pass_
        counts = [len(self.shard_ranges(url)[0]) for url in urls] if self.even or size else None
        if size:
            assert counts is not None
            compressed = next((url for url in urls if self.shard_ranges(url)[1]), None)
            if compressed is not None:
                msg = (
                    f"{compressed}: block_shuffle reads blocks by byte range, which a "
                    "compressed shard cannot give: use uncompressed .tar shards, or "
                    "block_shuffle=None"
                )
                raise ValueError(msg)
            parts = split_blocks(
                urls, counts, size, seed=seed, epoch=epoch, total=total, worker=worker,
                even=self.even, pass_=pass_,
            )  # fmt: skip
        else:
            # one planner per shard list, seed, epoch and pass: its order is computed once
            # for every worker asked (a loader's len(), resume_from's replays)
            key = (shuffle, seed, epoch, pass_, self.even)
            cached = _PLANNERS.get(self)
            if cached is None or cached[0] is not urls or cached[1] != key:
                planner = SplitPlanner(
                    urls, shuffle=shuffle, seed=seed, epoch=epoch, pass_=pass_, counts=counts
                )
                cached = _PLANNERS[self] = (urls, key, planner)
            parts = cached[2].plan(1, 0, total, worker)
        return [self._span(part) for part in parts]  # (a streamed part has no stop)

    def _blocks(self) -> int:
        """The block size of the block split (0: not split by block)."""
        return self.block_shuffle if self.block_shuffle is not None and self.shuffle_shards else 0

    # -- lengths and sample ranges ----------------------------------------------------------

    def parts(self, total: int, worker: int, *, any_order: bool = False) -> Any:
        """Global worker ``worker`` of ``total``'s parts, with the shards' sample counts.

        Raises:
            TypeError: A shard has no ``.idx`` sidecar (its count is not known), or what a
                worker reads depends on a shard order from the DataLoader's seed.
        """
        urls = list(iter(self.source_datapipe))
        counts = self._known_counts(urls)
        seeded = not self.shuffle_shards or self.even or self.seed is not None
        if not (any_order or seeded or total == 1 or len(set(counts.values())) == 1):
            no_length(
                self,
                "with shards of different sample counts, what each worker reads depends on "
                "the shard order, from the DataLoader's seed: give split_shards (or the "
                "recipe) a seed=, or even=True, for an exact len()",
            )
        return self._parts(urls, total, worker), counts

    @override
    def length(self, total: int, worker: int | None) -> int:
        if worker is None:
            return sum(self.length(total, w) for w in range(total))
        # the parts, not their samples: counts only where the split itself needs them
        return len(self._parts(list(iter(self.source_datapipe)), total, worker))

    def _known_counts(self, urls: list[str]) -> dict[str, int]:
        """Each shard's sample count from its ``.idx`` sidecar, found once.

        Without one, a local plain tar's headers are walked (:func:`local_ranges`); a
        remote or gzip shard's count is unknown. Read 16 at a time, each storage call
        tried once: ``list(pipe)`` asks for ``len()`` first (a length hint), and must not
        pay retries for it. Any failure is a ``TypeError`` (which ``list()`` passes
        over), chained to the cause.
        """
        once = RetryPolicy(retries=0)

        def count(url: str) -> tuple[Ranges, bool] | None:
            ranges = read_index(
                url, storage_options=self.storage_options, index=self.index.get(url), retry=once
            )
            if ranges is None and url not in self.index:
                ranges = local_ranges(url, self.storage_options)
            return None if ranges is None else (ranges, False)

        missing = [url for url in dict.fromkeys(urls) if self._ranges.get(url) is None]
        try:
            with ThreadPoolExecutor(min(16, len(missing) or 1)) as pool:
                found = dict(zip(missing, pool.map(count, missing), strict=True))
        except Exception as exc:
            msg = f"{type(self).__name__} instance doesn't have valid length: {exc}"
            raise TypeError(msg) from exc
        self._ranges.update((url, ranges) for url, ranges in found.items() if ranges)
        unknown = next((url for url in urls if self._ranges.get(url) is None), None)
        if unknown is not None:
            no_length(
                self,
                f"the sample count of {unknown} is not known (a remote or gzip shard without "
                "an .idx sidecar): `shardpipes index URL` writes its sidecar, from which "
                "len() is exact",
            )
        return {url: len(self._ranges[url][0]) for url in urls}  # type: ignore[index]

    def shard_ranges(self, url: str) -> tuple[Ranges, bool]:
        """A shard's sample ranges (uncompressed offsets), and whether it is compressed.

        From its index, else a scan of its headers; once per shard and process.
        """
        found = self._ranges.get(url)
        if found is None:
            found = self._ranges[url] = shard_ranges(url, self.storage_options, self.index.get(url))
        return found

    def _span(self, part: ShardPart) -> ShardPart:
        """``part`` with the byte span of its samples, where it is a range of a plain tar."""
        if part.span is not None or part.stop is None or part.parts != 1:
            return part
        ranges, compressed = self.shard_ranges(part.url)
        if compressed:  # read from its start, not by range
            return part
        return part._replace(span=(ranges[part.start][0], ranges[part.stop - 1][1]))


#: each splitter's last SplitPlanner: (its shard list, its key, it); held beside the
#: splitter, not in it, so that it is never pickled to the workers
_PLANNERS: weakref.WeakKeyDictionary[ShardSplitter, tuple[list[str], Any, SplitPlanner]] = (
    weakref.WeakKeyDictionary()
)
