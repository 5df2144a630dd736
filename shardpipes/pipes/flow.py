"""The stages around an epoch: ``limit_samples``, ``cycle_epochs``, ``prefetch_items``.

webdataset's ``.slice(n)`` / torchdata's ``.header(n)``, ``.repeat()`` / ``.cycle()`` and
``.prefetch(n)``, each resumable with the plain ``StatefulDataLoader``: their positions
(items given this epoch, the pass, the items to skip) are part of the pipeline's state.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.prefetch import Prefetch
from shardpipes._core.split import share
from shardpipes.pipes._length import local_length, no_length
from shardpipes.pipes._stage import ChainState, SampleStage, functional_form, upstream
from shardpipes.pipes.shards import PASS_STRIDE, placement_of, splitters

__all__ = ["EpochCycler", "ItemPrefetcher", "SampleLimiter"]


def _count(value: Any, name: str, *, optional: bool = False) -> int | None:
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = "a positive int or None" if optional else "a positive int"
        msg = f"{name} must be {allowed} (got {value!r})"
        raise ValueError(msg)
    return value


class Positioned(ChainState, SampleStage):
    """A stage with a position of its own: loaded for the next iteration, dropped unused.

    Its own count is :meth:`own_state`; ``state_dict`` / ``load_state_dict`` are the
    whole pipeline's (:class:`~shardpipes.pipes._stage.ChainState`).
    """

    _pinned: Mapping[str, Any] | None = None

    def pending(self) -> bool:
        """Whether a loaded state waits for an iteration to begin."""
        return self._pinned is not None

    def drop_loaded(self) -> None:
        """Drop a loaded state that no iteration began from."""
        self._pinned = None

    _awaiting = False  # an epoch was begun here (by a mix) that has not read yet

    def await_epoch(self) -> None:
        """An epoch was begun for this stage (by a ``mix``) that reads only when drawn.

        Until it reads, its state is that epoch's start (or the state loaded for it), not
        the count at the last epoch's end: a checkpoint then would resume it as spent.
        """
        self._awaiting = True

    def _take_pinned(self) -> Mapping[str, Any]:
        pinned, self._pinned, self._awaiting = self._pinned, None, False
        return pinned or {}

    def load_own(self, state: Mapping[str, Any]) -> None:
        """Resume this stage's count from an :meth:`own_state` at the next iteration.

        Raises:
            ValueError: If the state is not one of this stage's.
        """
        mine = self.own_state()
        if not isinstance(state, Mapping) or set(state) != set(mine):
            msg = f"not a {type(self).__name__} state: {str(state)[:100]} (keys: {sorted(mine)})"
            raise ValueError(msg)
        self.check_options(state)
        self._pinned = dict(state)

    def options(self) -> dict[str, Any]:
        """What the stage was made with that a state of it must match (none by default)."""
        return {}

    def check_options(self, state: Mapping[str, Any]) -> None:
        """Refuse a count saved by this stage made with other options.

        Raises:
            ValueError: ``state`` was saved with another ``n`` (``count``…), naming both.
        """
        for key, value in self.options().items():
            if state.get(key) != value:
                name = FORMS[type(self)]
                msg = (
                    f"the state was saved with {name}({key}={state.get(key)!r}); this pipe has "
                    f"{name}({key}={value!r}): resume with the same {key} (its epoch was cut "
                    "by the saved one)"
                )
                raise ValueError(msg)

    def own_state(self) -> dict[str, Any]:
        """This stage's own count (the pipeline's state holds it under ``"held"``)."""
        if self._awaiting:
            return self.upcoming_state()
        return self._own()

    def _own(self) -> dict[str, Any]:
        raise NotImplementedError

    def upcoming_state(self) -> dict[str, Any]:
        """The state of the iteration about to begin here: a loaded state, else its start."""
        if self._pinned is not None:
            return dict(self._pinned)
        return {**dict.fromkeys(self._own(), 0), **self.options()}


@functional_form("limit_samples")
class SampleLimiter(Positioned):
    """At most ``n`` items an epoch over all workers and ranks (functional: ``limit_samples``).

    webdataset's ``.slice(n)`` and torchdata's ``.header(n)``, counted over the whole
    epoch rather than per DataLoader worker: each of the ``T`` workers × ranks gives
    ``n // T`` items, the first ``n % T`` one more (fewer if its share of the data runs
    out first); with ``split_shards(even=True)`` upstream, ``n // T`` each, as DDP
    needs. It stops reading there; the next epoch starts again from the top. Its count is
    in the pipeline's state, so a resumed epoch stops at the same place.

    Args:
        source_datapipe: Items: samples, or batches after ``batch``.
        n: Items per epoch, over all workers and ranks.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(10)).limit_samples(4))
        [0, 1, 2, 3]
    """

    def __init__(self, source_datapipe: IterDataPipe[Any], n: int) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.n: int = _count(n, "n")  # type: ignore[assignment]
        self._given = 0

    def quota(self, total: int, worker: int) -> int:
        """The items global worker ``worker`` of ``total`` gives in an epoch, at most.

        With ``split_shards(even=True)`` upstream (DDP), ``n // total`` for every worker:
        ranks that gave different counts would hang a collective.
        """
        if any(splitter.even for splitter in splitters(self.source_datapipe)):
            return self.n // total
        return share(self.n, total, worker)

    def resumed(self, *, upcoming: bool) -> bool:
        """Whether the epoch is the rest of one ``resume_from`` resumed: no limit then.

        Its units are what the old workers had left of their shares; the new workers'
        shares of ``n`` need not cut them where they fall.

        Args:
            upcoming: The epoch about to begin here (else the current one, as ``len()``
                counts it).
        """
        found = splitters(self.source_datapipe)
        if upcoming:
            return any("elastic" in s.upcoming_state() for s in found)
        return any(s.resumed_units() is not None for s in found)

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Any]:
        resumed = self.resumed(upcoming=True)
        self._given = int(self._take_pinned().get("given", 0))
        quota = math.inf if resumed else self.quota(*placement_of(self.source_datapipe))
        if self._given >= quota:
            from shardpipes.pipes.resumable import Positions

            Positions(self.source_datapipe).drop_loaded()  # its epoch is over, unread
            return
        items = upstream(self.source_datapipe, wanted)
        try:
            for item in items:
                self._given += 1
                yield item
                if self._given >= quota:
                    return
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _own(self) -> dict[str, Any]:
        """The items given in the current epoch by this worker, and ``n``."""
        given = self._given if self._pinned is None else self._pinned["given"]
        return {"given": given, **self.options()}

    def options(self) -> dict[str, Any]:
        """``n``: a state of another limit is refused."""
        return {"n": self.n}

    def __len__(self) -> int:
        return local_length(self)


@functional_form("cycle_epochs")
class EpochCycler(Positioned):
    """Read the source again and again (functional name: ``cycle_epochs``).

    torchdata's ``.cycle()`` and webdataset's ``.repeat()``: ``count`` passes over the
    source (``None``: without end), each pass a new shard order and shuffle (the
    ``split_shards`` epoch plus one pass stride, as ``mix(epoch_size=...)`` takes more
    passes), every sample once per pass. The pass is part of the pipeline's state. Each
    DataLoader worker cycles its own share, so the workers' passes need not line up.

    Args:
        source_datapipe: Items.
        count: Passes per iteration, or ``None`` for an endless one (end it where you
            like: ``limit_samples``, a step count).

    Raises:
        ValueError: ``count`` not a positive int or ``None``; when iterated without
            ``count``, a whole pass that gave this worker nothing (it would spin).

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(3)).cycle_epochs(2))
        [0, 1, 2, 0, 1, 2]
    """

    def __init__(self, source_datapipe: IterDataPipe[Any], count: int | None = None) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.count = _count(count, "count", optional=True)
        self._pass = 0

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Any]:
        pinned = self._take_pinned()
        self._pass = int(pinned.get("pass", 0))
        if self.count is not None and self._pass >= self.count:
            from shardpipes.pipes.resumable import Positions

            Positions(self.source_datapipe).drop_loaded()  # its epoch is over, unread
            return
        first = True  # a resumed pass may have nothing left
        while self.count is None or self._pass < self.count:
            if not first:
                for splitter in splitters(self.source_datapipe):
                    used = splitter.used()
                    if used is not None:
                        splitter.next_pass(used["epoch"] + PASS_STRIDE)
            given = 0
            for item in upstream(self.source_datapipe, wanted):
                given += 1
                yield item
            if self.count is None and given == 0 and not (first and pinned):
                msg = (
                    "cycle_epochs(): a whole pass over the source gave this worker no item "
                    "(its share of the shards, or of a limit_samples before the cycle, is "
                    "empty), so an endless cycle would spin: give count=, or more data (or "
                    "a larger limit) per worker"
                )
                raise ValueError(msg)
            first = False
            self._pass += 1

    def _own(self) -> dict[str, Any]:
        """The pass this worker is in, and ``count``."""
        return {
            "pass": self._pass if self._pinned is None else self._pinned["pass"],
            **self.options(),
        }

    def options(self) -> dict[str, Any]:
        """``count``: a state of another number of passes is refused."""
        return {"count": self.count}

    def __len__(self) -> int:
        if self.count is None:
            no_length(self, "cycle_epochs() without count never ends")
        return local_length(self)


@functional_form("prefetch_items")
class ItemPrefetcher(Positioned):
    """Keep ``size`` finished items ready, made in a background thread (``prefetch_items``).

    torchdata's ``.prefetch(n)``: the stages upstream (reading, decoding, batching…) run
    in a thread, up to ``size`` items ahead of the consumer, so that a training step and
    the next items' preparation overlap, with or without DataLoader workers. Resumable:
    the thread sends a snapshot of the upstream state with its first item, every
    ``size``-th and its last; a checkpoint is the newest snapshot delivered plus how many
    items (fewer than ``size``) to skip after it, which a resumed run reads again and
    drops. Errors raised upstream are raised here, as they were.

    Args:
        source_datapipe: Items: samples, or batches.
        size: Items kept ready (memory: ``size`` items, plus one being made).

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> list(IterableWrapper(range(5)).prefetch_items(2))
        [0, 1, 2, 3, 4]
    """

    def __init__(self, source_datapipe: IterDataPipe[Any], size: int = 2) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.size: int = _count(size, "size")  # type: ignore[assignment]
        self._run: Prefetch | None = None
        self._skipped = 0  # items a resumed run dropped before its first one

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Any]:
        from shardpipes.pipes.resumable import Positions

        if self._run is not None:  # a loop left early, its iterator still held: stop it
            self._run.close()
        skip = int(self._take_pinned().get("skip", 0))
        positions = Positions(self.source_datapipe)
        mark = (0, positions.states())  # nothing runs the source yet
        items = upstream(self.source_datapipe, wanted)
        if skip:
            items = itertools.islice(items, skip, None)
        run = Prefetch(items, self.size, positions.states, mark)
        self._run, self._skipped = run, skip
        yield from run

    def upstream_states(self) -> dict[int, Any] | None:
        """The upstream stages' states at the newest snapshot delivered (``None``: none)."""
        if self._run is None or self._pinned is not None:
            return None
        states: dict[int, Any] = self._run.mark[1]
        return states

    def _own(self) -> dict[str, Any]:
        """Items to skip after the upstream stages' states (see :meth:`upstream_states`)."""
        if self._pinned is not None:
            return {"skip": self._pinned["skip"]}
        run = self._run
        if run is None:
            return {"skip": 0}
        return {"skip": run.behind() + (self._skipped if run.mark[0] == 0 else 0)}

    def __len__(self) -> int:
        return local_length(self)

    def __getstate__(self) -> Any:
        state = {**self.__dict__, "_run": None}  # a thread: the next iteration makes its own
        if IterDataPipe.getstate_hook is not None:
            return IterDataPipe.getstate_hook(state)
        return state


def lone_limit(held: list[Positioned]) -> SampleLimiter | None:
    """A pipeline's only count stage, if it is a ``limit_samples`` (``resume_from`` takes it)."""
    return held[0] if len(held) == 1 and isinstance(held[0], SampleLimiter) else None


#: each stage's functional name, for messages
FORMS = {
    SampleLimiter: "limit_samples",
    EpochCycler: "cycle_epochs",
    ItemPrefetcher: "prefetch_items",
}
