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
from shardpipes._core.mixing import MixDraws, check_weights
from shardpipes.pipes.shards import PASS_STRIDE, iteration_key, splitters, worker_placement

__all__ = ["Mixer", "mix"]


class Mixer(IterDataPipe[dict[str, Any]]):
    """Samples (dicts) from named pipes, each drawn in proportion to its weight.

    An epoch draws until every source has run out: while all have samples, the shares
    follow the weights (over any window of a few dozen samples, within a sample or so of
    a block's share); a source that runs out leaves the others to go on in proportion to
    their own weights. A source of weight 0 is not read. Each sample gets ``__source__``,
    the name of its source.

    Deterministic with ``seed``: the draws are a function of ``(seed, epoch, global
    worker)``; the sources' own seeds decide their orders. Resumable with the plain
    ``StatefulDataLoader`` (the draws' position is part of the pipeline's state).

    Args:
        sources: Name → a pipe of sample dicts (``open_tar``, ``decode``… chains, or a
            recipe without ``batch_size``).
        weights: Name → weight (non-negative, not all zero); default 1 each.
        seed: The draws' seed.
        epoch_size: Samples per epoch over all workers and ranks, instead of one pass
            over every source: exactly this many, in the weights' proportions; a source
            that runs out starts another pass (its next epoch: a new order, each sample
            once per pass). Each of the ``T`` workers (DataLoader workers × ranks) yields
            ``epoch_size // T``, the first ``epoch_size % T`` one more.

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
    ) -> None:
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
        if isinstance(seed, bool) or not isinstance(seed, int):
            msg = f"seed must be an int (got {seed!r})"
            raise TypeError(msg)
        self.sources = dict(sources)
        self.weights = check_weights(list(self.sources), weights)
        self.seed = seed
        self.epoch_size = epoch_size
        self._epochs = EpochCounter()
        self._begun = 0
        self._draws: MixDraws | None = None
        self._epoch = 0
        self._yielded = 0  # samples yielded in the current epoch, by this worker
        self._pinned: Mapping[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (later ones count on from it)."""
        self._epochs.set(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._begun += 1
        epoch = self._epochs.begin(iteration_key(None, self._begun))
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            epoch = int(pinned["epoch"])
            self._epochs.resumed(epoch)
        total, worker = worker_placement()
        quota = self._quota(total, worker)
        draws = MixDraws(self.weights, f"{self.seed}:{epoch}:{worker}")
        self._yielded = 0
        if pinned is not None:
            draws.restore(pinned["draws"])
            self._yielded = int(pinned.get("yielded", 0))
        self._draws, self._epoch = draws, epoch
        streams = {name: iter(pipe) for name, pipe in self.sources.items()}
        try:
            while draws.live and (quota is None or self._yielded < quota):
                name = draws.next()
                sample = self._next(streams, name)
                if sample is None:
                    draws.exhausted(name)
                    continue
                if not isinstance(sample, dict):
                    msg = (
                        f"mix takes sample dicts; source {name!r} gave a "
                        f"{type(sample).__name__}: mix before to_tuple, batch or collate"
                    )
                    raise TypeError(msg)
                sample["__source__"] = name
                self._yielded += 1
                yield sample
        finally:
            for stream in streams.values():
                close = getattr(stream, "close", None)
                if close is not None:
                    close()

    def _quota(self, total: int, worker: int) -> int | None:
        """This worker's share of ``epoch_size`` (``None``: one pass over the sources)."""
        if self.epoch_size is None:
            return None
        if self.epoch_size < total:
            msg = (
                f"epoch_size={self.epoch_size} is below the number of workers × ranks "
                f"({total}): some would have no sample to give"
            )
            raise ValueError(msg)
        return self.epoch_size // total + (worker < self.epoch_size % total)

    def _next(self, streams: dict[str, Iterator[Any]], name: str) -> Any | None:
        """The next sample of source ``name``; ``None`` when it has run out.

        With ``epoch_size``, a source that runs out starts its next pass (``None`` only
        if that pass is empty too).
        """
        try:
            return next(streams[name])
        except StopIteration:
            if self.epoch_size is None:
                return None
        for splitter in splitters(self.sources[name]):
            used = splitter.used()
            splitter.next_pass((used["epoch"] if used else self._epoch) + PASS_STRIDE)
        streams[name] = iter(self.sources[name])
        return next(streams[name], None)

    def state_dict(self) -> dict[str, Any] | None:
        """The draws' position in the current epoch (``None`` before any)."""
        if self._draws is None:
            return None
        return {
            "epoch": self._epoch,
            "draws": self._draws.state(),
            "yielded": self._yielded,
            "sources": list(self.sources),
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Resume the draws at the next iteration.

        Raises:
            ValueError: The state is of another set of sources.
        """
        if state is None:
            return
        if list(state.get("sources", ())) != list(self.sources):
            msg = (
                f"the state was saved for a mix of {state.get('sources')}, this one mixes "
                f"{list(self.sources)}"
            )
            raise ValueError(msg)
        self._pinned = state


def mix(
    sources: Mapping[str, IterDataPipe[Any]],
    weights: Mapping[str, float] | None = None,
    *,
    seed: int = 0,
    epoch_size: int | None = None,
) -> Mixer:
    """Mix sample pipes by weight: see :class:`Mixer`.

    Example:
        >>> import shardpipes as sp
        >>> laion = sp.list_shards("data/train-*.tar").split_shards().open_tar()
        >>> coyo = sp.list_shards("data/train-*.tar").split_shards().open_tar()
        >>> pipe = sp.mix({"laion": laion, "coyo": coyo}, weights={"laion": 3, "coyo": 1})
    """
    return Mixer(sources, weights, seed=seed, epoch_size=epoch_size)
