"""``mix``: samples from several pipes, drawn in proportion to their weights, resumably.

The draws are :class:`~shardpipes._core.mixing.MixDraws` — blocks of 20 in which every
source has its share, in a random order — seeded by ``(seed, epoch, global worker)``;
each source splits its own shards over the workers and ranks, so every sample of every
source comes once per epoch, and ``__source__`` says which source it came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes._core.epochs import EpochCounter
from shardpipes._core.mixing import MixDraws, check_weights, mixed
from shardpipes._core.split import share
from shardpipes.pipes._epoch import ShardReading, reading_of
from shardpipes.pipes._length import local_length, no_length
from shardpipes.pipes._stage import ChainState, graph_pipes
from shardpipes.pipes.fields import takes_samples
from shardpipes.pipes.flow import Positioned
from shardpipes.pipes.shards import PASS_STRIDE, iteration_key, placement_of, splitters

__all__ = ["Mixer", "mix"]


class Mixer(ChainState, IterDataPipe[dict[str, Any]]):
    """Samples (dicts) from named pipes, each drawn in proportion to its weight.

    An epoch draws until every source has run out: while all have samples, the shares
    follow the weights (over any window of a few dozen samples, within a sample or so of
    a block's share); a source that runs out leaves the others to go on in proportion to
    their own weights. A source of weight 0 is not read. Each sample gets ``__source__``,
    the name of its source.

    Deterministic with ``seed``: the draws are a function of ``(seed, epoch, global
    worker)``; the sources' own seeds decide their orders. Resumable with the plain
    ``StatefulDataLoader`` (the draws' position is part of the pipeline's state);
    ``state_dict()`` is the whole pipeline's (the draws alone: ``own_state()``).

    Args:
        sources: Name → a pipe of sample dicts: ``open_tar``, ``shuffle_samples``,
            ``decode``, ``map`` … chains (a recipe yields tuples: for recipes, give
            ``tar_shards`` a dict of sources instead).
        weights: Name → weight (non-negative, not all zero); default 1 each.
        seed: The draws' seed.
        epoch_size: Samples per epoch over all workers and ranks, instead of one pass
            over every source: exactly this many, in the weights' proportions; a source
            that runs out starts another pass (its next epoch: a new order, each sample
            once per pass). Each of the ``T`` workers (DataLoader workers × ranks) yields
            ``epoch_size // T``, the first ``epoch_size % T`` one more.
        resample: Without ``epoch_size``: an endless epoch, each source starting another
            pass whenever it runs out (what webdataset's ``ResampledShards`` is used
            for, but without replacement within a pass); end it where you like
            (``itertools.islice``, a step count).

    Raises:
        ValueError: No source, a weight negative, not a number, or naming no source, or
            all zero; ``epoch_size`` below 1 (and, when iterated, below the number of
            workers × ranks).
        TypeError: A source is not an ``IterDataPipe``, or a name not a ``str``.
    """

    takes_epoch = True  # shardpipes.set_epoch sets it

    def __init__(
        self,
        sources: Mapping[str, IterDataPipe[Any]],
        weights: Mapping[str, float] | None = None,
        *,
        seed: int = 0,
        epoch_size: int | None = None,
        resample: bool = False,
    ) -> None:
        if epoch_size is not None and resample:
            msg = "give epoch_size= (an epoch of that many) or resample=True (endless), not both"
            raise ValueError(msg)
        if epoch_size is not None and (
            isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1
        ):
            msg = f"epoch_size must be a positive int or None (got {epoch_size!r})"
            raise ValueError(msg)
        if not isinstance(sources, Mapping):
            msg = f"mix takes a dict of name -> pipe (got {type(sources).__name__})"
            raise TypeError(msg)
        for name, pipe in sources.items():
            if not isinstance(name, str):
                msg = f"a source's name must be a str (got {name!r})"
                raise TypeError(msg)
            if not isinstance(pipe, IterDataPipe):
                msg = f"source {name!r} is not an IterDataPipe (got {type(pipe).__name__})"
                raise TypeError(msg)
            takes_samples(
                pipe, f"mix (source {name!r})",
                "; for recipes, give tar_shards a dict of sources (tar_shards({'a': urls_a, "
                "'b': urls_b}, weights=...))", batches=False,
            )  # fmt: skip
        if isinstance(seed, bool) or not isinstance(seed, int):
            msg = f"seed must be an int (got {seed!r})"
            raise TypeError(msg)
        self.sources = dict(sources)
        self.weights = check_weights(list(self.sources), weights)
        self.seed = seed
        self.epoch_size = epoch_size
        self.resample = bool(resample)
        self._epochs = EpochCounter()
        self._begun = 0
        self._draws: MixDraws | None = None
        self._epoch = 0
        self._yielded = 0  # samples yielded in the current epoch, by this worker
        self._pinned: Mapping[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (later ones count on from it).

        The draws' and every source's ``split_shards`` stage's, as ``shardpipes.set_epoch``.
        """
        for source in self.sources.values():
            for splitter in splitters(source):
                splitter.set_epoch(epoch)
        self._epochs.set(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._begun += 1
        pinned, self._pinned = self._pinned, None
        if pinned is not None:  # its epoch is counted from the state, not as a new one
            epoch = int(pinned["epoch"])
            chosen = self._epochs.chosen()
            if chosen is not None and chosen != epoch:
                msg = (
                    f"the mix's state was saved in epoch {epoch}; this pipe was set to epoch "
                    f"{chosen} (set_epoch): set the epoch the checkpoint was taken in"
                )
                raise ValueError(msg)
            self._epochs.resumed(epoch)
        else:
            epoch = self._epochs.begin(iteration_key(None, self._begun))
        total, worker = self._placement()
        quota = self._quota(total, worker)
        draws = MixDraws(self.weights, self.draw_seed(epoch, worker))
        self._yielded = 0
        if pinned is not None and pinned["draws"] is not None:
            draws.restore(pinned["draws"])
            self._yielded = int(pinned.get("yielded", 0))
        self._draws, self._epoch = draws, epoch
        for pipe in self.sources.values():
            for splitter in splitters(pipe):
                splitter.begin_now()  # every source's epoch is counted now, drawn or not
        held = self._held()
        for stage in held:
            stage.await_epoch()  # and its state is that epoch's until drawn
        streams = {name: iter(pipe) for name, pipe in self.sources.items()}
        try:
            pairs = mixed(draws, lambda name: self._next(streams, name))
            while quota is None or self._yielded < quota:  # quota checked before a draw
                found = next(pairs, None)
                if found is None:
                    break
                name, sample = found
                if not isinstance(sample, dict):
                    msg = (
                        f"mix takes sample dicts; source {name!r} gave a "
                        f"{type(sample).__name__}: mix before to_tuple, batch or collate"
                    )
                    raise TypeError(msg)
                sample["__source__"] = name
                self._yielded += 1
                yield sample
            for stage in held:  # loaded into a source this epoch never read (spent before):
                stage.drop_loaded()  # its epoch counts as done, the next one reads it anew
            if self.resample or (quota is not None and self._yielded < quota):
                msg = (
                    f"the sources ran out of samples ({', '.join(self.sources)}: a whole pass "
                    f"of each gave this worker none) after {self._yielded}, so epoch_size= or "
                    "resample= cannot be met"
                )
                raise ValueError(msg)
        finally:
            for stream in streams.values():
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

    def _held(self) -> list[ShardReading | Positioned]:
        """The sources' stages with a position of their own (readings, counts), one walk."""
        found = (
            stage if isinstance(stage, Positioned) else reading_of(stage)
            for pipe in self.sources.values()
            for stage in graph_pipes(pipe)
        )
        return list(dict.fromkeys(stage for stage in found if stage is not None))

    def _placement(self) -> tuple[int, int]:
        """``(total workers, this one's global index)``, as the sources' splits see it."""
        return placement_of(self)

    def draw_seed(self, epoch: int, worker: int) -> str:
        """The seed of global worker ``worker``'s draws in ``epoch``."""
        return f"{self.seed}:{epoch}:{worker}"

    def resume_epoch(self, epoch: int) -> None:
        """Make the next iteration ``epoch`` (its sources resumed by ``resume_from``)."""
        self._epochs.set(epoch)

    def _quota(self, total: int, worker: int) -> int | None:
        """This worker's share of ``epoch_size`` (``None``: one pass over the sources).

        ``epoch_size // total`` for every worker when the sources split with ``even=True``
        (DDP): ranks that gave different counts would hang a collective.
        """
        if self.epoch_size is None:
            return None
        if self.epoch_size < total:
            msg = (
                f"epoch_size={self.epoch_size} is below the number of workers × ranks "
                f"({total}): some would have no sample to give"
            )
            raise ValueError(msg)
        if all(s.even for pipe in self.sources.values() for s in splitters(pipe)):
            return self.epoch_size // total
        return share(self.epoch_size, total, worker)

    def _next(self, streams: dict[str, Iterator[Any]], name: str) -> Any | None:
        """The next sample of source ``name``; ``None`` when it has run out.

        With ``epoch_size`` or ``resample``, a source that runs out starts its next pass
        (``None`` only if that pass is empty too).
        """
        try:
            return next(streams[name])
        except StopIteration:
            if self.epoch_size is None and not self.resample:
                return None
        for splitter in splitters(self.sources[name]):
            used = splitter.used()
            splitter.next_pass((used["epoch"] if used else self._epoch) + PASS_STRIDE)
        streams[name] = iter(self.sources[name])
        return next(streams[name], None)  # None: a pass with nothing for this worker

    def __len__(self) -> int:
        """Samples this mix yields in an epoch here (see :mod:`shardpipes.pipes._length`)."""
        if self.resample:
            no_length(self, "resample=True: its epoch never ends")
        return local_length(self)

    def pending(self) -> bool:
        """Whether a loaded state waits for an epoch to begin."""
        return self._pinned is not None

    def drop_loaded(self) -> None:
        """Drop a loaded state that no epoch began from; its epoch counts as done."""
        if self._pinned is not None:
            if self._epochs.chosen() is None:  # else set_epoch chose the next one
                self._epochs.resumed(int(self._pinned["epoch"]))
            self._pinned = None

    def own_state(self) -> dict[str, Any]:
        """The draws' position in the current epoch (before any: the start of the next).

        Like the reading stages' states, so that a state taken in a process that never
        iterated (the main process of a loader with workers) is of the same epoch as
        theirs, and dropped with them.
        """
        if self._draws is None:
            return self._state(self._epochs.current(), None, 0)
        return self._state(self._epoch, self._draws.state(), self._yielded)

    def upcoming_state(self) -> dict[str, Any]:
        """The state of the epoch about to begin here: a loaded state, else its start."""
        if self._pinned is not None:
            return dict(self._pinned)
        return self._state(self._epochs.peek(iteration_key(None, self._begun + 1)), None, 0)

    def _state(self, epoch: int, draws: Any, yielded: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "draws": draws,
            "yielded": yielded,
            "sources": list(self.sources),
            "seed": self.seed,
            "weights": dict(self.weights),
            "epoch_size": self.epoch_size,
        }

    def load_own(self, state: Mapping[str, Any] | None) -> None:
        """Resume the draws at the next iteration, from an :meth:`own_state`.

        Raises:
            ValueError: The state is of another set of sources, seed, weights or
                ``epoch_size``.
        """
        if state is None:
            return
        if list(state.get("sources", ())) != list(self.sources):
            msg = (
                f"the state was saved for a mix of {state.get('sources')}, this one mixes "
                f"{list(self.sources)}"
            )
            raise ValueError(msg)
        for key, mine in (
            ("seed", self.seed),
            ("weights", dict(self.weights)),
            ("epoch_size", self.epoch_size),
        ):
            if key in state and state[key] != mine:
                msg = (
                    f"the state was saved for a mix with {key}={state[key]!r}; this one has "
                    f"{key}={mine!r}"
                )
                raise ValueError(msg)
        self._pinned = state


def mix(
    sources: Mapping[str, IterDataPipe[Any]],
    weights: Mapping[str, float] | None = None,
    *,
    seed: int = 0,
    epoch_size: int | None = None,
    resample: bool = False,
) -> Mixer:
    """Mix sample pipes by weight: see :class:`Mixer`.

    Example:
        >>> import shardpipes as sp
        >>> laion = sp.list_shards("data/train-*.tar").split_shards().open_tar()
        >>> coyo = sp.list_shards("data/train-*.tar").split_shards().open_tar()
        >>> pipe = sp.mix({"laion": laion, "coyo": coyo}, weights={"laion": 3, "coyo": 1})
    """
    return Mixer(sources, weights, seed=seed, epoch_size=epoch_size, resample=resample)
