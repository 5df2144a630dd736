"""``mix``: samples from several pipes, drawn in proportion to their weights, resumably.

The draws are :class:`~shardpipes._core.mixing.MixDraws` — blocks of 20 in which every
source has its share, in a random order — seeded by ``(seed, epoch, pass, global
worker)``; each source splits its own shards over the workers and ranks, so every sample
of every source comes once per epoch, and ``__source__`` says which source it came from.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.clock import Clocked, EpochClock
from shardpipes._core.mixing import MixDraws, check_weights, mixed
from shardpipes._core.split import share
from shardpipes._core.stage import Stage, as_stage, checked_int, loaded_state, no_length
from shardpipes.pipes._stage import Pipe
from shardpipes.pipes._torch import require_pipeline
from shardpipes.pipes.fields import takes_samples

__all__ = ["Mixer", "mix"]


_RECIPES = (
    "; to mix recipes, give tar_shards a dict of sources: "
    "sp.recipes.tar_shards({'a': urls_a, 'b': urls_b}, weights={'a': 3, 'b': 1})"
)


class Mixer(Clocked, Pipe):
    """Samples (dicts) from named pipes, each drawn in proportion to its weight.

    An epoch draws until every source has run out: while all have samples, the shares
    follow the weights (over any window of a few dozen samples, within a sample or so of
    a block's share); a source that runs out leaves the others to go on in proportion to
    their own weights. A source of weight 0 is not read. Each sample gets ``__source__``,
    the name of its source.

    Deterministic with ``seed``: the draws are a function of ``(seed, epoch, global
    worker)``; the sources' own seeds decide their orders. Its state holds the draws'
    position and every source's state (a source not yet drawn this epoch: its start).

    Args:
        sources: Name → a pipe of sample dicts: ``open_tar``, ``shuffle_samples``,
            ``decode``, ``map`` … chains.
        weights: Name → weight (non-negative, not all zero); default 1 each.
        seed: The draws' seed.
        epoch_size: Samples per epoch over all workers and ranks, instead of one pass
            over every source: exactly this many, in the weights' proportions; a source
            that runs out starts another pass (a new order, each sample once per pass).
            Each of the ``T`` workers (DataLoader workers × ranks) yields
            ``epoch_size // T``, the first ``epoch_size % T`` one more.
        resample: Without ``epoch_size``: an endless epoch, each source starting another
            pass whenever it runs out (what webdataset's ``ResampledShards`` is used
            for, but without replacement within a pass); end it where you like.

    Raises:
        ValueError: No source, a weight negative, not a number, or naming no source, or
            all zero; ``epoch_size`` below 1 (and, when iterated, below the number of
            workers × ranks).
        TypeError: A source is not an ``IterDataPipe``, or a name not a ``str``.
    """

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
        checked_int(epoch_size, "epoch_size", optional=True)
        if not isinstance(sources, Mapping):
            msg = f"mix takes a dict of name -> pipe (got {type(sources).__name__})"
            raise TypeError(msg)
        for name, pipe in sources.items():
            if not isinstance(name, str):
                msg = f"a source's name must be a str (got {name!r})"
                raise TypeError(msg)
            require_pipeline(pipe, f"mix (source {name!r})")
            takes_samples(pipe, f"mix (source {name!r})", _RECIPES, batches=False)
        if isinstance(seed, bool) or not isinstance(seed, int):
            msg = f"seed must be an int (got {seed!r})"
            raise TypeError(msg)
        super().__init__()
        self.mixed = dict(sources)  # not `sources`: the protocol's method
        self.weights = check_weights(list(self.mixed), weights)
        self.seed = seed
        self.epoch_size = epoch_size
        self.resample = bool(resample)
        self.clock = EpochClock()
        self._draws: MixDraws | None = None
        self._yielded = 0  # samples yielded in the current epoch, by this worker
        self._loaded: Mapping[str, Any] | None = None  # draws the next epoch starts from

    @override
    def sources(self) -> list[Stage]:
        return [as_stage(pipe) for pipe in self.mixed.values()]

    # -- the protocol -------------------------------------------------------------------------

    def set_epoch(self, epoch: int, *, given: bool = True) -> None:
        """Set the epoch of the next iteration: the draws' and every source's."""
        self.clock.set(epoch, given=given)
        super().set_epoch(epoch, given=given)

    exact = True

    @override
    def next_pass(self) -> None:
        self.clock.next_pass()
        self._draws = self._loaded = None
        self._yielded = 0
        super().next_pass()

    @override
    @property
    def endless(self) -> bool:
        return self.resample

    def state(self) -> dict[str, Any]:
        """The draws' position, and every source's state."""
        draws = self._draws.state() if self._draws is not None else None
        if self._loaded is not None:
            draws = self._loaded["draws"]
        return {
            "sources": {name: as_stage(pipe).state() for name, pipe in self.mixed.items()},
            **self.clock.state(),
            "draws": draws,
            "yielded": self._yielded,
            "seed": self.seed,
            "weights": dict(self.weights),
            "epoch_size": self.epoch_size,
        }

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """Set up the next iteration: the draws' start, or a saved position.

        Raises:
            ValueError: The state is of another set of sources, seed, weights or
                ``epoch_size``.
        """
        self._fresh, self._draws = True, None
        if state is None:
            self.clock.restart()
        else:
            self._check(state)
            self.clock.load(dict(state), "mix")
        self._loaded = state
        self._yielded = 0 if state is None else int(state.get("yielded", 0))
        for name, pipe in self.mixed.items():
            as_stage(pipe).reset(None if state is None else state["sources"][name])

    def _check(self, state: Any) -> None:
        loaded_state(state, "mix", "sources")
        names = list(state["sources"])
        if sorted(names) != sorted(self.mixed):
            msg = f"the state was saved for a mix of {names}, this one mixes {list(self.mixed)}"
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

    # -- iteration ----------------------------------------------------------------------------

    def draw_seed(self, epoch: int, worker: int, pass_: int = 0) -> str:
        """The seed of global worker ``worker``'s draws in ``epoch`` (and pass)."""
        return f"{self.seed}:{epoch}:{worker}" + (f":{pass_}" if pass_ else "")

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
        return share(self.epoch_size, total, worker, even=self.even)

    def _mix(self, opened: Callable[[str], Iterator[Any]]) -> Iterator[Any]:
        total, worker = self.placement()
        quota = self._quota(total, worker)
        draws = MixDraws(self.weights, self.draw_seed(self.clock.epoch, worker, self.clock.pass_))
        loaded, self._loaded = self._loaded, None
        if loaded is not None and loaded["draws"] is not None:
            draws.restore(loaded["draws"])
        self.clock.start()
        self._draws = draws
        streams: dict[str, Iterator[Any]] = {}  # a source is begun when first drawn
        try:
            pairs = mixed(draws, lambda name: self._next(streams, name, opened))
            left = None if quota is None else max(quota - self._yielded, 0)
            for name, sample in itertools.islice(pairs, left):  # no draw past the quota
                if not isinstance(sample, dict):
                    msg = (
                        f"mix takes sample dicts; source {name!r} gave a "
                        f"{type(sample).__name__}: mix before to_tuple, batch or collate"
                    )
                    raise TypeError(msg)
                sample["__source__"] = name
                self._yielded += 1
                yield sample
            if self.resample or (quota is not None and self._yielded < quota):
                msg = (
                    f"the sources ran out of samples ({', '.join(self.mixed)}: a whole pass "
                    f"of each gave this worker none) after {self._yielded}, so epoch_size= or "
                    "resample= cannot be met"
                )
                raise ValueError(msg)
        finally:
            for stream in streams.values():
                getattr(stream, "close", lambda: None)()

    def _next(
        self, streams: dict[str, Iterator[Any]], name: str, opened: Callable[[str], Iterator[Any]]
    ) -> Any | None:
        """The next sample of source ``name``; ``None`` when it has run out.

        With ``epoch_size`` or ``resample``, a source that runs out starts its next pass
        (``None`` only if that pass is empty too).
        """
        if name not in streams:
            streams[name] = opened(name)
        try:
            return next(streams[name])
        except StopIteration:
            if self.epoch_size is None and not self.resample:
                return None
        as_stage(self.mixed[name]).next_pass()
        streams[name] = opened(name)
        return next(streams[name], None)  # None: a pass with nothing for this worker

    def _iterate(self) -> Iterator[Any]:
        return self._mix(lambda name: iter(self.mixed[name]))

    def _references(self) -> Iterator[Any]:
        return self._mix(lambda name: as_stage(self.mixed[name]).references())

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        """The samples of these references, each from its ``__source__``."""
        for name, group in itertools.groupby(refs, key=lambda ref: ref["__source__"]):
            for sample in as_stage(self.mixed[name]).fetch(group):
                sample["__source__"] = name
                yield sample

    def length(self, total: int, worker: int | None) -> int:
        """Samples this mix yields in an epoch (see :class:`~shardpipes._core.stage.Stage`)."""
        if self.resample:
            no_length(self, "resample=True: its epoch never ends")
        if self.epoch_size is not None:
            if worker is None:
                return sum(self.length(total, w) for w in range(total))
            return self._quota(total, worker)  # type: ignore[return-value]
        return sum(
            as_stage(source).length(total, worker)
            for name, source in self.mixed.items()
            if self.weights[name] > 0
        )


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
