"""``resume_from``: the rest of an interrupted epoch, on another number of ranks or workers.

Canonical workers: the run that began the epoch had ``C`` workers (DataLoader workers ×
ranks), and each worker's state says where it was. What each of them had still to
deliver is found by running its pipeline again on sample references alone (the protocol's
``references()``: no byte read), from its state, or — for a worker whose state is not
given, with ``even=True`` — from the epoch's start up to the items its peer on this rank
delivered (ranks step together). Every stage does on references what it does on
samples (a shuffle buffer, a mix's draws, a limit's quota, a cycle's passes), so the
replay delivers what the worker would have. The rest of the epoch is those references,
dealt evenly over the workers the job runs on now (:class:`Rest`), each read by byte
range and made into items by the stages' ``fetch`` (:class:`~shardpipes.Resumable`); the
epochs after are whole again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import PurePath
from typing import Any, TypeVar

from shardpipes._core.shuffle import unpack
from shardpipes._core.stage import Stage, as_stage, is_rest
from shardpipes.pipes._stage import pipeline_state
from shardpipes.pipes._torch import require_pipeline
from shardpipes.pipes.resumable import Resumable, deal, flatten, undelivered

__all__ = ["resume_from"]

P = TypeVar("P")

_HOW = (
    "resume_from takes a StatefulDataLoader's state_dict() or a pipe's state_dict() (one "
    "rank's, with even=True), or a list of them (every rank's)"
)


def resume_from(pipe: P, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> P:
    """Make ``pipe`` deliver the rest of an interrupted epoch over the ranks × workers it runs on.

    The state was saved by this pipeline (the same shards, seeds and options) on another
    number of ranks or DataLoader workers. The next iteration of the pipe returned
    (under any DataLoader, on any world size) is the rest of that epoch: every sample not
    delivered before the stop exactly once, spread evenly, then the epochs go on as usual.
    Its state is saved and loaded as any other (and can be resumed elsewhere again).

    With ``even=True`` (DDP's case) one rank's state is enough: the other ranks'
    workers delivered as many items as this rank's (ranks step together), and their
    epochs are replayed on references (a shuffle buffer needs the job's fixed ``seed``).
    Without ``even``, pass the list of every rank's state (a one-process job's state is
    every rank's). Fewer than (ranks × workers now) samples are left out with ``even``, so
    that every worker delivers as many.

    Every stage resumes: shuffle buffers, mixes (``epoch_size`` too), ``limit_samples``,
    ``cycle_epochs``, ``prefetch_items``, decode threads, torch's ``map``, ``batch`` and
    ``collate``. A ``filter``, and an error handler that skipped samples, make the
    counts a replay cannot know: they are refused where counts matter (a limit or mix
    after the filter, a rank's state standing for the others). An endless epoch
    (``resample=True``, ``cycle_epochs()``) has no rest: it starts the next epoch.

    Args:
        pipe: The pipeline (a recipe, a chain).
        state: One rank's state, or a list of every rank's.

    Returns:
        The pipeline, set to resume: a :class:`~shardpipes.Resumable` over ``pipe``.

    Raises:
        ValueError: If the state is not one of this pipeline's, or one rank's state is
            given without ``even=True``, or counts a replay cannot know are needed.

    Example:
        >>> import shardpipes as sp
        >>> pipe = sp.recipes.tar_shards("data/train-*.tar", even=True, seed=0)
        >>> pipe = sp.resume_from(pipe, checkpoint["loader"])  # doctest: +SKIP
        >>> loader = StatefulDataLoader(pipe, batch_size=None, num_workers=3)  # doctest: +SKIP
    """
    require_pipeline(pipe, "resume_from")
    inner: Any = pipe.source_datapipe if isinstance(pipe, Resumable) else pipe
    workers = _workers(state)
    root = as_stage(inner)
    saved = next(iter(workers.values()))
    if root.endless:  # an endless epoch has no rest: the next one begins
        root.set_epoch(saved["epoch"] + 1)
        return Resumable(inner)  # type: ignore[return-value]
    if is_rest(saved["pipeline"]):
        rests = _rest_of_rests(root, workers, saved)
    else:
        rests = _rests(root, workers)
    root.place(None)
    root.reset(None)
    resumed = Resumable(inner)
    resumed.resume(rests, epoch=saved["epoch"], even=root.even)
    return resumed  # type: ignore[return-value]


def _rests(root: Stage, workers: dict[int, dict[str, Any]]) -> list[Any]:
    """What every canonical worker had left, in worker order, as references."""
    first = next(iter(workers.values()))
    total, epoch = first["workers"], first["epoch"]
    delivered: dict[int, int] = {}
    if len(workers) < total:
        for w, saved in workers.items():  # (a state this pipe cannot take is refused here)
            full = _count(_replay(root, (total, w), saved["pipeline"], start=epoch))
            left = _count(_replay(root, (total, w), saved["pipeline"]))
            delivered[w] = full - left
        _check_lockstep(root, workers, total)
    out: list[Any] = []
    for w in range(total):
        if w in workers:
            items = _replay(root, (total, w), workers[w]["pipeline"])
        else:
            peer = _peer(w, workers, total)
            items = _replay(root, (total, w), workers[peer]["pipeline"], start=epoch)
            items = itertools.islice(items, delivered[peer], None)
        out += flatten(items)
    return out


def _rest_of_rests(
    root: Stage, workers: dict[int, dict[str, Any]], first: dict[str, Any]
) -> list[Any]:
    """What a resumed epoch had left: each worker's share, less the items it delivered.

    ``done`` counts items (batches after ``batch``): ``root`` regroups the share into them.
    A worker whose state is not given delivered as many as its peer on this rank.
    """
    total = first["workers"]
    rest = first["pipeline"]["rest"]
    if len(workers) < total and not rest["even"]:
        raise ValueError(_missing(total - len(workers), total))
    refs = unpack(rest)
    out: list[Any] = []
    for w in range(total):
        given = workers[w] if w in workers else workers[_peer(w, workers, total)]
        out += undelivered(root, deal(refs, total, w, even=rest["even"]), given["pipeline"]["done"])
    return out


def _replay(
    root: Stage, placed: tuple[int, int], state: Any, *, start: int | None = None
) -> Iterator[Any]:
    """The items a worker would still deliver, made of references (see the module docs).

    ``start``: from the start of that epoch, with the state's seeds.
    """
    root.place(placed)
    root.reset(state)
    if start is not None:
        root.set_epoch(start, given=False)
        root.reset(None)
    return root.references()


def _count(items: Iterable[Any]) -> int:
    return sum(1 for _ in items)


def _check_lockstep(root: Stage, workers: dict[int, dict[str, Any]], total: int) -> None:
    """One rank's states stand for the others' only when they step as this one."""
    if not root.even:
        msg = _missing(total - len(workers), total)
        raise ValueError(msg)
    if not root.exact:
        msg = (
            "one rank's state stands for the others' by counting the items they delivered, "
            "which a filter makes unknown on references: give every rank's state (a list)"
        )
        raise ValueError(msg)
    if not root.seeded:
        msg = (
            "one rank's state gives the other ranks' positions only by replaying their "
            "shuffle buffers, and their seeds are not in it: the job ran without a fixed "
            "seed= (the DataLoader's seeds were used). Give every rank's state (a list, e.g. "
            "gathered with torch.distributed.all_gather_object), or resume on the same "
            "topology with load_state_dict; pass seed= in the next jobs"
        )
        raise ValueError(msg)
    if any(saved.get("skipped") for saved in workers.values()):
        msg = (
            "samples were skipped by an error handler, so this rank's counts do not say "
            "what the others delivered: give every rank's state (a list)"
        )
        raise ValueError(msg)


def _missing(missing: int, total: int) -> str:
    return (
        f"the states of {missing} of {total} workers are missing: without even=True each "
        "rank delivers its own count, so give every rank's state (a list), or split with "
        "even=True"
    )


def _per_rank(workers: dict[int, dict[str, Any]], total: int) -> int:
    """DataLoader workers per rank, from the given states (one rank's, at least)."""
    per_rank = max(int(saved.get("loader_workers", 1)) for saved in workers.values())
    if total % per_rank:
        msg = f"{per_rank} worker states do not make a rank of {total} workers"
        raise ValueError(msg)
    return per_rank


def _local(w: int, workers: dict[int, dict[str, Any]], total: int) -> int:
    """The DataLoader worker id of global worker ``w``.

    Worker ``k`` of rank ``r`` is global worker ``k·world + r``.
    """
    return w // (total // _per_rank(workers, total))


def _peer(w: int, workers: dict[int, dict[str, Any]], total: int) -> int:
    """A given worker with the same DataLoader worker id as ``w`` (of another rank)."""
    k = _local(w, workers, total)
    for given in workers:
        if _local(given, workers, total) == k:
            return given
    msg = f"no state of DataLoader worker {k} is given: give every rank's state (a list)"
    raise ValueError(msg)


def _workers(state: Any) -> dict[int, dict[str, Any]]:
    """Every given worker's envelope, by global worker index (in the saved topology)."""
    if isinstance(state, str | PurePath):
        msg = f"{_HOW}, not a file name: load it first, e.g. torch.load({str(state)!r})"
        raise TypeError(msg)
    given = [state] if isinstance(state, Mapping) else state
    if not isinstance(given, Sequence) or not given:
        msg = f"{_HOW} (got {type(state).__name__})"
        raise TypeError(msg)
    out: dict[int, dict[str, Any]] = {}
    for one in given:
        envelopes = _envelopes(one)
        for envelope in envelopes:
            envelope = {**envelope, "loader_workers": len(envelopes)}
            w = envelope["worker"]
            if w in out:
                msg = (
                    f"global worker {w}'s state is given twice (one rank's state twice in the "
                    "list?): give each rank's once"
                )
                raise ValueError(msg)
            out[w] = envelope
    first = next(iter(out.values()))
    for envelope in out.values():
        if (envelope["workers"], envelope["epoch"]) != (first["workers"], first["epoch"]):
            msg = "the states were saved in different epochs or splits: give one checkpoint's"
            raise ValueError(msg)
    return out


def _envelopes(state: Any) -> list[dict[str, Any]]:
    """The pipe states in one rank's state (a loader's, with or without workers, or a pipe's)."""
    if not isinstance(state, Mapping):
        msg = f"{_HOW} (got a list holding {type(state).__name__})"
        raise TypeError(msg)
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping):  # a StatefulDataLoader's, with workers
        found = snapshot.get("_worker_snapshots") or {}
        pipes = [
            _pipe_state(found[k]) for k in sorted(found, key=lambda k: int(k.rpartition("_")[2]))
        ]
    elif "fetcher_state" in state or "dataset_state" in state:  # one without workers
        pipes = [_pipe_state(state)]
    elif "shardpipes" in state:
        pipes = [state]
    else:
        msg = (
            f"{_HOW}; this dict has the keys {sorted(map(str, state))[:8]}: if it is your "
            "checkpoint, pass the loader's entry (e.g. checkpoint['loader'])"
        )
        raise ValueError(msg)
    for envelope in pipes:
        pipeline_state(envelope)  # the version checked
    return [dict(envelope) for envelope in pipes]


def _pipe_state(snapshot: Mapping[str, Any]) -> Any:
    for found in (
        snapshot.get("dataset_state"),
        (snapshot.get("fetcher_state") or {}).get("dataset_iter_state"),
    ):
        if isinstance(found, Mapping) and "shardpipes" in found:
            return found
    msg = "a StatefulDataLoader state without a shardpipes pipeline's state"
    raise ValueError(msg)
