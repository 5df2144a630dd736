"""``resume_from``: the rest of an interrupted epoch, on another number of ranks or workers.

See :mod:`shardpipes._core.elastic` for how what is left is found and dealt out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from shardpipes._core.elastic import (
    buffer_seed_of,
    left_over,
    replay,
    size_of,
    unit_from_list,
    unit_to_list,
)
from shardpipes._core.split import ShardPart, SplitPlanner, split_blocks
from shardpipes.pipes._epoch import VERSION, ShardReading, ShuffleBuffer, readings
from shardpipes.pipes.index import sample_count
from shardpipes.pipes.resumable import Resumable, mixers
from shardpipes.pipes.shards import ShardSplitter, _digest, splitters

__all__ = ["resume_from"]

P = TypeVar("P")

_HOW = (
    "resume_from takes a StatefulDataLoader's state_dict() or a pipe's state_dict() (one "
    "rank's, with even=True), or a list of them (every rank's)"
)


def resume_from(pipe: P, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> P:
    """Make ``pipe`` deliver the rest of an interrupted epoch over the ranks × workers it runs on.

    The state was saved by this pipeline (the same shards, seed and options) on another
    number of ranks or DataLoader workers. The next iteration of ``pipe`` (under any
    DataLoader, on any world size) is the rest of that epoch: every sample not delivered
    before the stop exactly once, spread evenly, then the epochs go on as usual. Its state
    is saved and loaded as any other (and can be resumed elsewhere again).

    With ``even=True`` (DDP's case) one rank's state is enough: a state of a
    ``StatefulDataLoader`` (its ``state_dict()``), or of the pipe. The other ranks'
    positions are found by replaying their epoch on sample references (see
    :mod:`shardpipes._core.elastic`); their shuffle buffers need a fixed ``seed``. Without
    ``even``, pass the list of every rank's state. Fewer than (ranks × workers now) samples
    are left out, so that every worker delivers as many.

    Args:
        pipe: The pipeline (a recipe, a chain, or ``Resumable`` of one), with one reading
            stage and no ``mix``.
        state: One rank's state, or a list of every rank's.

    Returns:
        ``pipe``, set to resume.

    Raises:
        ValueError: If the state is not one of this pipeline's, the pipeline mixes
            sources, or one rank's state is given without ``even=True`` or without a fixed
            seed for the shuffle buffer.

    Example:
        >>> import shardpipes as sp  # doctest: +SKIP
        >>> pipe = sp.resume_from(sp.recipes.tar_shards(urls, even=True, seed=0), saved)
        >>> loader = StatefulDataLoader(pipe, batch_size=64, num_workers=3)
    """
    target: Any = pipe.pipe if isinstance(pipe, Resumable) else pipe
    if not isinstance(target, IterDataPipe):
        msg = f"resume_from takes a shardpipes pipeline (got {type(pipe).__name__})"
        raise TypeError(msg)
    reading, splitter = _stages(target)
    ranks = _rank_states(state)
    saved = _saved_split(ranks, splitter)
    urls = list(iter(splitter.source_datapipe))
    counts: dict[str, Any] = {}

    def ranges_of(url: str) -> Any:
        if url not in counts:
            counts[url] = sample_count(url, splitter.storage_options, splitter.index.get(url))
        found = counts[url]
        return None if isinstance(found, int) else found

    plan = _Plan(splitter, urls, saved, ranges_of)
    units = plan.left(ranks, buffer=_buffer(target, splitter))
    index = {url: i for i, url in enumerate(urls)}
    elastic = {
        "epoch": saved["epoch"],
        "seed": saved["seed"],
        "units": [unit_to_list(unit, index) for unit in units],
    }
    pinned = {
        "seed": saved["seed"], "epoch": saved["epoch"], "shards": len(urls),
        "digest": _digest(urls), "elastic": elastic,
    }  # fmt: skip
    reading.drop_loaded()
    splitter.resume_elastic(pinned)
    return pipe


def _stages(pipe: IterDataPipe[Any]) -> tuple[ShardReading, ShardSplitter]:
    if mixers(pipe):
        msg = (
            "resume_from cannot yet resume a mix on another topology: resume it on the same "
            "number of ranks and workers (load_state_dict)"
        )
        raise ValueError(msg)
    found, stages = readings(pipe), splitters(pipe)
    if len(found) != 1 or len(stages) != 1:
        msg = (
            f"resume_from needs a pipeline with one reading stage and one split_shards stage "
            f"(this one has {len(found)} and {len(stages)})"
        )
        raise ValueError(msg)
    return found[0], stages[0]


def _rank_states(state: Any) -> list[list[Mapping[str, Any]]]:
    """Each rank's workers' reading states, from loader or pipe states."""
    given = [state] if isinstance(state, Mapping) else state
    if not isinstance(given, Sequence) or isinstance(given, str) or not given:
        msg = f"{_HOW} (got {type(state).__name__})"
        raise TypeError(msg)
    return [_worker_states(one) for one in given]


def _worker_states(state: Any) -> list[Mapping[str, Any]]:
    if not isinstance(state, Mapping):
        msg = f"{_HOW} (got a list holding {type(state).__name__})"
        raise TypeError(msg)
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping):  # a StatefulDataLoader's, with workers
        workers = snapshot.get("_worker_snapshots") or {}
        pipes = [_pipe_state(workers[k]) for k in sorted(workers, key=_worker_number)]
    elif "fetcher_state" in state or "dataset_state" in state:  # one without workers
        pipes = [_pipe_state(state)]
    else:
        pipes = [state]
    out = []
    for one in pipes:
        if isinstance(one, Mapping) and "position" in one:  # a reading's own (a recipe's)
            out.append(one)
            continue
        stages = one.get("stages") if isinstance(one, Mapping) else None
        if one.get("version") != VERSION or not isinstance(stages, list) or len(stages) != 1:
            msg = f"not a state of a pipeline with one reading stage: {str(one)[:200]}"
            raise ValueError(msg)
        out.append(stages[0])
    return out


def _worker_number(key: str) -> int:
    return int(key.rpartition("_")[2])


def _pipe_state(snapshot: Mapping[str, Any]) -> Any:
    for found in (
        snapshot.get("dataset_state"),
        (snapshot.get("fetcher_state") or {}).get("dataset_iter_state"),
    ):
        if isinstance(found, Mapping) and "stages" in found:
            return found
    msg = "a StatefulDataLoader state without a shardpipes pipeline's state"
    raise ValueError(msg)


def _saved_split(ranks: list[list[Mapping[str, Any]]], splitter: ShardSplitter) -> dict[str, Any]:
    """The split every saved worker used (they must agree), checked against ``splitter``.

    Workers that had not begun their epoch saved only its seed and number.
    """
    splits = [_split_of(worker) for workers in ranks for worker in workers]
    begun = [split for split in splits if "workers" in split] or splits
    first = begun[0]
    keys = ("seed", "epoch", "shards", "digest", "workers", "even")
    for other in begun[1:]:
        if any(other.get(k) != first.get(k) for k in keys):
            msg = "the states were saved in different epochs or splits: give one checkpoint's"
            raise ValueError(msg)
    blocks = splitter.block_shuffle if splitter.shuffle_shards else None
    if "workers" in first and first.get("blocks") != blocks:
        msg = (
            f"the state was saved with block_shuffle={first.get('blocks')}; this pipe has {blocks}"
        )
        raise ValueError(msg)
    if first.get("even", splitter.even) != splitter.even:
        msg = f"the state was saved with even={first['even']}; this pipe has even={splitter.even}"
        raise ValueError(msg)
    return dict(first)


def _split_of(worker: Mapping[str, Any]) -> Mapping[str, Any]:
    found = worker.get("splitters")
    if not isinstance(found, list) or len(found) != 1 or "epoch" not in found[0]:
        msg = f"not a state of a worker reading shards: {str(worker)[:200]}"
        raise ValueError(msg)
    split: Mapping[str, Any] = found[0]
    return split


class _Plan:
    """Every old worker's parts, and what each left."""

    def __init__(
        self,
        splitter: ShardSplitter,
        urls: list[str],
        saved: Mapping[str, Any],
        ranges_of: Any,
    ) -> None:
        if "digest" in saved and (len(urls), _digest(urls)) != (saved["shards"], saved["digest"]):
            msg = (
                f"the state was saved for another shard list ({saved['shards']} shards, digest "
                f"{saved['digest']}; this pipe lists {len(urls)}, digest {_digest(urls)})"
            )
            raise ValueError(msg)
        self.splitter, self.urls, self.saved, self.ranges_of = splitter, urls, saved, ranges_of
        self.total = int(saved.get("workers", 1))  # none had begun: the epoch from its start
        counts = None
        if saved.get("even"):
            counts = [len(ranges_of(url) or ()) for url in urls]
        planner = SplitPlanner(
            urls, shuffle=saved.get("shuffle", splitter.shuffle_shards), seed=saved["seed"],
            epoch=saved["epoch"], counts=counts,
        )  # fmt: skip
        self.planner = planner
        self.elastic = saved.get("elastic")

    def parts(self, worker: int) -> list[ShardPart]:
        """Global worker ``worker``'s parts in the saved epoch, in reading order."""
        if self.elastic is not None:  # itself the rest of an epoch resumed elsewhere
            from shardpipes._core.elastic import share

            units = [unit_from_list(u, self.urls) for u in self.elastic["units"]]
            return [self._spanned(p) for p in share(units, self.total, worker)]
        if self.saved.get("blocks"):
            counts = [len(self.ranges_of(url) or ()) for url in self.urls]
            parts = split_blocks(
                self.urls, counts, self.saved["blocks"], seed=self.saved["seed"],
                epoch=self.saved["epoch"], total=self.total, worker=worker,
                even=bool(self.saved.get("even")),
            )  # fmt: skip
        else:
            parts = self.planner.plan(1, 0, self.total, worker)
        return [self._spanned(p) for p in parts]

    def _spanned(self, part: ShardPart) -> ShardPart:
        if part.span is not None or part.stop is None or part.parts != 1:
            return part
        ranges = self.ranges_of(part.url)
        if ranges is None:
            return part
        return part._replace(span=(ranges[part.start][0], ranges[part.stop - 1][1]))

    def left(
        self, ranks: list[list[Mapping[str, Any]]], *, buffer: tuple[int, int | None]
    ) -> list[ShardPart]:
        """What every old worker left, in global worker order.

        A worker that had not begun (its loader had not asked it yet) left all its parts.
        """
        states: dict[int, Mapping[str, Any]] = {}
        for workers in ranks:
            for worker in workers:
                split = _split_of(worker)
                if "workers" in split:
                    states[int(split["worker"])] = worker
        given = sum(len(workers) for workers in ranks)
        if given == self.total or not states:  # every worker's state (or nothing begun)
            return [
                unit
                for w in range(self.total)
                for unit in left_over(
                    self.parts(w), states[w]["position"] if w in states else None, self.ranges_of
                )
            ]
        return self._replayed(ranks, states, buffer)

    def _replayed(
        self,
        ranks: list[list[Mapping[str, Any]]],
        states: Mapping[int, Mapping[str, Any]],
        buffer: tuple[int, int | None],
    ) -> list[ShardPart]:
        """With one rank's states and the even split: the others' found by replaying.

        Global worker ``w`` is worker ``w // world`` of rank ``w % world``: every rank's
        worker of one id delivered as many samples.
        """
        missing = self.total - sum(len(workers) for workers in ranks)
        if not self.saved.get("even"):
            msg = (
                f"the states of {missing} of {self.total} workers are missing: without "
                "even=True each rank delivers its own count, so give every rank's state (a "
                "list), or split with even=True"
            )
            raise ValueError(msg)
        per_rank = len(ranks[0])  # a rank's loader workers
        if self.total % per_rank:
            msg = f"{per_rank} worker states do not make a rank of {self.total} workers"
            raise ValueError(msg)
        world = self.total // per_rank
        size, base = buffer
        if size >= 2 and base is None:
            msg = (
                "one rank's state gives the other ranks' positions only by replaying their "
                "shuffle buffers, which needs a fixed seed: give the pipe seed=..., or "
                "give every rank's state (a list)"
            )
            raise ValueError(msg)
        delivered = dict.fromkeys(range(per_rank), 0)  # by worker id; not begun: none
        left: dict[int, list[ShardPart]] = {}
        for w, state in states.items():
            parts = self.parts(w)
            left[w] = left_over(parts, state["position"], self.ranges_of)
            delivered[w // world] = _count(parts) - _count(left[w])
            again = self._replay(w, parts, delivered[w // world], size, base)
            if _samples(again) != _samples(left[w]):
                msg = (
                    "this rank's saved positions differ from a replay of its epoch (were "
                    "samples skipped by an error handler?): give every rank's state (a list)"
                )
                raise ValueError(msg)
        for w in range(self.total):
            if w not in left:
                left[w] = self._replay(w, self.parts(w), delivered[w // world], size, base)
        return [unit for w in range(self.total) for unit in left[w]]

    def _replay(
        self, worker: int, parts: list[ShardPart], delivered: int, size: int, base: int | None
    ) -> list[ShardPart]:
        seed = buffer_seed_of(base, self.saved["epoch"], worker) if base is not None else 0
        position = replay(parts, self.ranges_of, buffer_size=size, seed=seed, delivered=delivered)
        return left_over(parts, position, self.ranges_of)


def _count(units: list[ShardPart]) -> int:
    return sum(size_of(unit) or 0 for unit in units)


def _samples(units: list[ShardPart]) -> set[tuple[str, int]]:
    return {(u.url, i) for u in units for i in range(u.start, u.stop or u.start)}


def _buffer(pipe: IterDataPipe[Any], splitter: ShardSplitter) -> tuple[int, int | None]:
    """``(size, fixed seed)`` of the pipeline's shuffle buffer (size 0: none)."""
    for stage in get_all_graph_pipes(traverse_dps(pipe)):
        buffer = getattr(stage, "buffer", None)
        if isinstance(buffer, ShuffleBuffer):
            size = buffer.size if buffer.enabled and buffer.size >= 2 else 0
            return size, buffer.seed if buffer.seed is not None else splitter.seed
    return 0, None
