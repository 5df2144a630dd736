"""``resume_from``: the rest of an interrupted epoch, on another number of ranks or workers.

See :mod:`shardpipes._core.elastic` for how what is left is found and dealt out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.iter import Mapper

from shardpipes._core.elastic import (
    buffer_seed_of,
    left_over,
    replay,
    samples_of,
    size_of,
    unit_to_list,
    units_of,
)
from shardpipes._core.mixing import replay_draws
from shardpipes._core.split import ShardPart
from shardpipes.pipes._epoch import VERSION, ShardReading, ShuffleBuffer, reading_of, readings
from shardpipes.pipes._stage import graph_pipes
from shardpipes.pipes.decode import SampleDecoder
from shardpipes.pipes.fields import FieldMapper, FieldRenamer, TupleMaker
from shardpipes.pipes.flow import FORMS, SampleLimiter, lone_limit
from shardpipes.pipes.mix import Mixer
from shardpipes.pipes.resumable import Positions, Resumable, mixers
from shardpipes.pipes.shards import ShardLister, ShardSplitter, _digest, splitters
from shardpipes.pipes.shuffle import SampleShuffler
from shardpipes.pipes.stream import ShardStream

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
    :mod:`shardpipes._core.elastic`); their shuffle buffers need the job's fixed ``seed``.
    Without ``even``, pass the list of every rank's state (a one-process job's state is
    every rank's). Fewer than (ranks × workers now) samples
    are left out, so that every worker delivers as many.

    With a ``limit_samples(n)`` after the reading, the rest of its epoch is what each old
    worker would still have delivered of its share of ``n`` (found by replaying its
    shuffle buffer, so a buffer needs the job's fixed ``seed``); the stages between
    must give one item per sample (``decode``, ``to_tuple``, ``map``… not ``batch`` or
    ``filter``). The epochs after are ``n`` samples over the new topology.

    Args:
        pipe: The pipeline (a recipe, a chain, or ``Resumable`` of one), with one reading
            stage, or a ``mix`` of several (not with ``epoch_size`` or ``resample``): each
            source's rest is dealt out, and the new workers draw from them by weight. It
            may end in a ``limit_samples`` (not after a mix); not ``cycle_epochs`` or
            ``prefetch_items``.
        state: One rank's state, or a list of every rank's.

    Returns:
        ``pipe``, set to resume.

    Raises:
        ValueError: If the state is not one of this pipeline's, a mix has an
            ``epoch_size`` or ``resample``, or one rank's state is given without
            ``even=True`` or without a fixed seed for the shuffle buffer.

    Example:
        >>> import shardpipes as sp
        >>> pipe = sp.recipes.tar_shards("data/train-*.tar", even=True, seed=0)
        >>> pipe = sp.resume_from(pipe, checkpoint["loader"])  # doctest: +SKIP
        >>> loader = StatefulDataLoader(pipe, batch_size=None, num_workers=3)  # doctest: +SKIP
    """
    target: Any = pipe.pipe if isinstance(pipe, Resumable) else pipe
    if not isinstance(target, IterDataPipe):
        msg = f"resume_from takes a shardpipes pipeline (got {type(pipe).__name__})"
        raise TypeError(msg)
    found, mixer, limiter = _stages(target)
    ranks = _rank_states(state, len(found))
    plans = []
    for i, (reading, splitter) in enumerate(found):
        stage_ranks = [[worker.stages[i] for worker in workers] for workers in ranks]
        plans.append(_Plan(reading, splitter, stage_ranks, _buffer(target, reading, splitter)))
    delivered = _Delivered(plans, ranks, mixer)
    for (reading, splitter), plan in zip(found, plans, strict=True):
        if limiter is None:
            units = plan.left(delivered)
        else:
            units = plan.limited(delivered, limiter, _given(ranks, limiter))
            limiter.drop_loaded()  # the resumed epoch's limit is its units; then n again
        index = {url: i for i, url in enumerate(plan.urls)}
        saved = plan.saved
        elastic = {"units": [unit_to_list(unit, index) for unit in units]}
        pinned = {
            "seed": saved["seed"], "epoch": saved["epoch"], "shards": len(plan.urls),
            "digest": _digest(plan.urls), "elastic": elastic,
        }  # fmt: skip
        reading.drop_loaded()
        splitter.resume_elastic(pinned)
    if mixer is not None:
        mixer.drop_loaded()
        mixer.resume_epoch(plans[0].saved["epoch"])
    return pipe


def _stages(
    pipe: IterDataPipe[Any],
) -> tuple[list[tuple[ShardReading, ShardSplitter]], Mixer | None, SampleLimiter | None]:
    """The reading stages with their splitters (in the state's order), the mix and the limit.

    Raises:
        ValueError: For a pipeline ``resume_from`` cannot resume, saying why.
    """
    held = Positions(pipe).held
    limiter = lone_limit(held)
    if held and limiter is None:
        forms = [FORMS[type(stage)] for stage in held]
        names = sorted(name for name in set(forms) if name != "limit_samples")
        if forms.count("limit_samples") > 1:
            names.append("more than one limit_samples")
        msg = (
            f"resume_from cannot yet resume a pipeline with {' and '.join(names)} on another "
            "topology: resume it on the same number of ranks and workers (load_state_dict)"
        )
        raise ValueError(msg)
    mixes = mixers(pipe)
    if len(mixes) > 1:
        msg = "resume_from resumes at most one mix on another topology"
        raise ValueError(msg)
    mixer = mixes[0] if mixes else None
    if limiter is not None:
        _check_limit(limiter, mixer)
    if mixer is not None and (mixer.epoch_size is not None or mixer.resample):
        msg = (
            "resume_from cannot yet resume a mix with epoch_size= or resample=True on another "
            "topology: resume it on the same number of ranks and workers (load_state_dict)"
        )
        raise ValueError(msg)
    found = []
    for reading in readings(pipe):
        stages = splitters(reading.source)
        if len(stages) != 1:
            msg = (
                "resume_from needs one split_shards stage under each reading stage (found "
                f"{len(stages)})"
            )
            raise ValueError(msg)
        found.append((reading, stages[0]))
    if not found or (mixer is None and len(found) != 1):
        msg = (
            f"resume_from needs a pipeline with one reading stage, or a mix of them (this one "
            f"has {len(found)})"
        )
        raise ValueError(msg)
    return found, mixer, limiter


# stages that give one item per sample they take (unless an error handler skips one)
_ONE_FOR_ONE = (
    Mapper,
    SampleDecoder,
    TupleMaker,
    FieldRenamer,
    FieldMapper,
    SampleShuffler,
    ShardLister,
    ShardSplitter,
)


def _check_limit(limiter: SampleLimiter, mixer: Mixer | None) -> None:
    """A ``limit_samples`` resumes elsewhere if it counts one reading's samples."""
    if mixer is not None:
        msg = (
            "resume_from cannot yet resume a limit_samples with a mix on another topology: "
            "resume it on the same number of ranks and workers (load_state_dict), or give "
            "the mix an epoch_size= instead of the limit"
        )
        raise ValueError(msg)
    for stage in graph_pipes(limiter.source_datapipe):
        batches = isinstance(stage, ShardStream) and stage.batch_size is not None
        if batches or (reading_of(stage) is None and not isinstance(stage, _ONE_FOR_ONE)):
            msg = (
                f"resume_from resumes a limit_samples on another topology only when it counts "
                f"samples, and this one has {type(stage).__name__} before it: put "
                "limit_samples before batch and filter (its n is then samples), or resume on "
                "the same number of ranks and workers (load_state_dict)"
            )
            raise ValueError(msg)


def _given(ranks: list[list[_Worker]], limiter: SampleLimiter) -> dict[int, int]:
    """The items each begun old worker's ``limit_samples`` had given, by global worker.

    Raises:
        ValueError: A state without a limit's count, or of another ``n``.
    """
    out = {}
    for workers in ranks:
        for worker in workers:
            split = _split_of(worker.stages[0])
            if "workers" not in split:
                continue  # not begun: it gave nothing
            if not worker.held:
                msg = "the state has no limit_samples count: it was saved by another pipeline"
                raise ValueError(msg)
            limiter.check_options(worker.held[0])
            out[int(split["worker"])] = int(worker.held[0]["given"])
    return out


@dataclass
class _Worker:
    """One saved worker: its reading stages' states, and its mix's."""

    stages: list[Mapping[str, Any]]
    mix: Mapping[str, Any] | None
    held: list[Mapping[str, Any]] | None = None  # limit_samples' counts


def _rank_states(state: Any, stages: int) -> list[list[_Worker]]:
    """Each rank's workers (in worker id order), from loader or pipe states."""
    given = [state] if isinstance(state, Mapping) else state
    if isinstance(state, str | PurePath):
        msg = f"{_HOW}, not a file name: load it first, e.g. torch.load({str(state)!r})"
        raise TypeError(msg)
    if not isinstance(given, Sequence) or not given:
        msg = f"{_HOW} (got {type(state).__name__})"
        raise TypeError(msg)
    ranks = [_worker_states(one, stages) for one in given]
    if len({len(workers) for workers in ranks}) != 1:
        msg = "the ranks' states have different numbers of DataLoader workers"
        raise ValueError(msg)
    return ranks


def _worker_states(state: Any, stages: int) -> list[_Worker]:
    if not isinstance(state, Mapping):
        msg = f"{_HOW} (got a list holding {type(state).__name__})"
        raise TypeError(msg)
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping):  # a StatefulDataLoader's, with workers
        workers = snapshot.get("_worker_snapshots") or {}
        pipes = [_pipe_state(workers[k]) for k in sorted(workers, key=_worker_number)]
    elif "fetcher_state" in state or "dataset_state" in state:  # one without workers
        pipes = [_pipe_state(state)]
    elif "stages" in state or "position" in state:
        pipes = [state]
    else:
        msg = (
            f"{_HOW}; this dict has the keys {sorted(map(str, state))[:8]}: if it is your "
            "checkpoint, pass the loader's entry (e.g. checkpoint['loader'])"
        )
        raise ValueError(msg)
    out = []
    for one in pipes:
        if isinstance(one, Mapping) and "position" in one:  # a reading's own (a recipe's)
            out.append(_Worker([one], None))
            continue
        found = one.get("stages") if isinstance(one, Mapping) else None
        if one.get("version") != VERSION or not isinstance(found, list) or len(found) != stages:
            saved = len(found) if isinstance(found, list) else "no"
            mixed = len(one.get("mixes") or [])
            msg = (
                f"not a state of this pipeline: it has {saved} reading stages"
                f"{f' and {mixed} mix' if mixed else ''}, this pipeline {stages}"
                f"{' (a mix of them)' if stages > 1 else ''} (a state of another pipeline, or "
                f"of another version): {str(one)[:120]}"
            )
            raise ValueError(msg)
        mixes = one.get("mixes") or [None]
        out.append(_Worker(list(found), mixes[0], one.get("held")))
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
    if splitter.seed is not None and first["seed"] != splitter.seed and "workers" in first:
        msg = f"the state was saved with seed {first['seed']}; this pipe has seed={splitter.seed}"
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
    """One source's old workers: their parts, and what each left."""

    def __init__(
        self,
        reading: ShardReading,
        splitter: ShardSplitter,
        ranks: list[list[Mapping[str, Any]]],
        buffer: tuple[int, int | None],
    ) -> None:
        saved = _saved_split(ranks, splitter)
        urls = list(iter(splitter.source_datapipe))
        if "digest" in saved and (len(urls), _digest(urls)) != (saved["shards"], saved["digest"]):
            msg = (
                f"the state was saved for another shard list ({saved['shards']} shards, digest "
                f"{saved['digest']}; this pipe lists {len(urls)}, digest {_digest(urls)})"
            )
            raise ValueError(msg)
        self.splitter, self.urls, self.saved, self.buffer = splitter, urls, saved, buffer
        self.indexed = reading.reader.index is not False  # else (k, m) parts are strided
        self.total = int(saved.get("workers", 1))  # none had begun: the epoch from its start
        self.per_rank = len(ranks[0])  # a rank's loader workers
        self.given = sum(len(workers) for workers in ranks)
        self.states: dict[int, Mapping[str, Any]] = {}  # the begun workers', by global index
        for workers in ranks:
            for worker in workers:
                split = _split_of(worker)
                if "workers" in split:
                    index = int(split["worker"])
                    if index in self.states:
                        msg = (
                            f"global worker {index}'s state is given twice (one rank's state "
                            "twice in the list?): give each rank's once"
                        )
                        raise ValueError(msg)
                    self.states[index] = worker
        self.elastic = saved.get("elastic")
        self._parts: dict[int, list[ShardPart]] = {}

    def ranges(self, url: str) -> Any:
        """A shard's sample ranges (in the uncompressed tar), found once."""
        return self.splitter.shard_ranges(url)[0]

    def streamed(self, url: str) -> bool:
        """Whether the reader streams the shard (compressed, or ``index=False``)."""
        return self.splitter.shard_ranges(url)[1] or not self.indexed

    @property
    def complete(self) -> bool:
        """Whether every old worker's state was given (else: replay the missing ones)."""
        return self.given == self.total or not self.states

    def parts(self, worker: int) -> list[ShardPart]:
        """Global worker ``worker``'s parts in the saved epoch, in reading order.

        The splitter's own split, with the saved seed, epoch, shard order and (an epoch
        itself resumed elsewhere) units; ``even`` and the block size are checked to match.
        """
        if worker not in self._parts:
            saved = self.saved
            self._parts[worker] = self.splitter.parts_for(
                self.urls, seed=saved["seed"], epoch=saved["epoch"], total=self.total,
                worker=worker, shuffle=saved.get("shuffle"),
                units=None if self.elastic is None else self.elastic["units"],
            )  # fmt: skip
        return self._parts[worker]

    def saved_left(self, worker: int) -> list[ShardPart]:
        """What a worker whose state was given left (all, if it had not begun)."""
        state = self.states.get(worker)
        return left_over(self.parts(worker), state and state["position"], self)

    def delivered(self, worker: int) -> int:
        """Samples a worker whose state was given delivered."""
        return _count(self.parts(worker)) - _count(self.saved_left(worker))

    def replayed_left(self, worker: int, delivered: int, *, limit: bool = False) -> list[ShardPart]:
        """What a worker left after delivering ``delivered`` samples, by replaying it.

        Args:
            worker: The global worker, in the saved epoch.
            delivered: Samples it delivered.
            limit: ``delivered`` is where a ``limit_samples`` stops it: the parts may
                hold fewer (then nothing is left).
        """
        size, base = self.buffer
        if size >= 2 and base is None and self.saved.get("seeded"):
            msg = f"the state was saved with seed={self.saved['seed']}: give the pipe that seed"
            raise ValueError(msg)
        if size >= 2 and base is None:
            if limit:
                why = "where a limit_samples epoch stops is found by replaying the shuffle buffers"
                way = "Resume"
            else:
                why = (
                    "one rank's state gives the other ranks' positions only by replaying "
                    "their shuffle buffers"
                )
                way = (
                    "Give every rank's state (a list, e.g. gathered with "
                    "torch.distributed.all_gather_object), or resume"
                )
            msg = (
                f"{why}, and their seeds are not in it: the job ran without a fixed seed= "
                f"(the DataLoader's seeds were used). {way} on the same topology with "
                "load_state_dict; pass seed= in the next jobs"
            )
            raise ValueError(msg)
        seed = buffer_seed_of(base, self.saved["epoch"], worker) if base is not None else 0
        parts = self.parts(worker)
        position = replay(
            parts, self, buffer_size=size, seed=seed, delivered=delivered, strict=not limit
        )
        return left_over(parts, position, self)

    def limited(
        self, delivered: _Delivered, limiter: SampleLimiter, given: Mapping[int, int]
    ) -> list[ShardPart]:
        """What every old worker would still have delivered of its ``limit_samples`` share.

        Its samples from where it stopped (as :meth:`left` finds it) up to where the limit
        would have ended its epoch (a replay to its quota), as sample ranges.
        """
        out = []
        for w in range(self.total):
            if self.complete or w in self.states:
                done, left = given.get(w, 0), self.saved_left(w)
                if w in self.states:
                    self._check_given(w, done, left)
            else:
                done = delivered.of(self, w)
                left = self.replayed_left(w, done)
            if self.elastic is not None:  # a resumed epoch, not cut by the limit: all of it
                out += samples_of(left, self)
                continue
            quota = limiter.quota(self.total, w)
            if done >= quota:
                continue  # its share given (what the replay below would find, at a cost)
            beyond = set(samples_of(self.replayed_left(w, quota, limit=True), self))
            out += [sample for sample in samples_of(left, self) if sample not in beyond]
        return units_of(out, self)

    def _check_given(self, worker: int, given: int, left: list[ShardPart]) -> None:
        """The limit's count must be the samples the reading delivered."""
        read = len(samples_of(self.parts(worker), self)) - len(samples_of(left, self))
        if read != given:
            msg = (
                f"worker {worker}'s limit_samples gave {given} items while its reading "
                f"delivered {read} samples (an error handler skipped some): resume on the "
                "same number of ranks and workers (load_state_dict)"
            )
            raise ValueError(msg)

    def left(self, delivered: _Delivered) -> list[ShardPart]:
        """What every old worker left, in global worker order.

        A worker that had not begun (its loader had not asked it yet) left all its parts;
        one whose state is missing is replayed (see :class:`_Delivered`).
        """
        out = []
        for w in range(self.total):
            if self.complete or w in self.states:
                out += self.saved_left(w)
            else:
                out += self.replayed_left(w, delivered.of(self, w))
        return out


class _Delivered:
    """How many samples of each source the old workers delivered, where states are missing.

    With one rank's states and the even split: global worker ``w`` is worker ``w //
    world`` of rank ``w % world``, and every rank's worker of one id delivered as many
    samples (batches in turn from each worker, in lockstep over the ranks). Through a mix,
    the split of those among the sources is the replay of the mix's draws. This rank's
    saved positions are checked against replays first.
    """

    def __init__(self, plans: list[_Plan], ranks: list[list[_Worker]], mixer: Mixer | None):
        self.plans, self.mixer = plans, mixer
        first = plans[0]
        self.world = first.total // first.per_rank if first.total % first.per_rank == 0 else 0
        self.mixed: dict[int, int] = {}  # through a mix: samples yielded, by worker id
        if mixer is not None:
            for workers in ranks:
                for k, worker in enumerate(workers):
                    self.mixed[k] = int((worker.mix or {}).get("yielded", 0))
        self._checked = False

    def of(self, plan: _Plan, worker: int) -> int:
        """Samples of ``plan``'s source that global worker ``worker`` delivered."""
        if not plan.saved.get("even"):
            missing = plan.total - plan.given
            msg = (
                f"the states of {missing} of {plan.total} workers are missing: without "
                "even=True each rank delivers its own count, so give every rank's state (a "
                "list), or split with even=True"
            )
            raise ValueError(msg)
        if not self.world:
            msg = f"{plan.per_rank} worker states do not make a rank of {plan.total} workers"
            raise ValueError(msg)
        if not self._checked:
            self._check()
            self._checked = True
        return self._counts(worker)[self.plans.index(plan)]

    def _counts(self, worker: int) -> list[int]:
        """Each source's samples delivered by ``worker`` (one source: without a mix)."""
        k = worker // self.world
        if self.mixer is None:
            plan = self.plans[0]
            own = [w for w in plan.states if w // self.world == k]
            return [plan.delivered(own[0]) if own else 0]
        available = {
            name: _count(plan.parts(worker))
            for name, plan in zip(self.mixer.sources, self.plans, strict=True)
        }
        got = replay_draws(
            self.mixer.weights, self.mixer.draw_seed(self.plans[0].saved["epoch"], worker),
            available, self.mixed.get(k, 0),
        )  # fmt: skip
        return [got[name] for name in self.mixer.sources]

    def _check(self) -> None:
        """This rank's saved positions must be what replaying its workers gives."""
        for i, plan in enumerate(self.plans):
            for w in plan.states:
                again = plan.replayed_left(w, self._counts(w)[i])
                if set(samples_of(again, plan)) != set(samples_of(plan.saved_left(w), plan)):
                    msg = (
                        "this rank's saved positions differ from a replay of its epoch (were "
                        "samples skipped by an error handler?): give every rank's state (a "
                        "list)"
                    )
                    raise ValueError(msg)


def _count(units: list[ShardPart]) -> int:
    return sum(size_of(unit) or 0 for unit in units)


def _buffer(
    pipe: IterDataPipe[Any], reading: ShardReading, splitter: ShardSplitter
) -> tuple[int, int | None]:
    """``(size, fixed seed)`` of the shuffle buffer over ``reading`` (size 0: none)."""
    for stage in graph_pipes(pipe):
        buffer = getattr(stage, "buffer", None)
        feeds = reading_of(stage) or reading_of(getattr(stage, "source_datapipe", None))
        if isinstance(buffer, ShuffleBuffer) and feeds is reading:
            size = buffer.size if buffer.enabled and buffer.size >= 2 else 0
            return size, buffer.seed if buffer.seed is not None else splitter.seed
    return 0, None
