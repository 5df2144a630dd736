"""``Resumable``: the root of a pipeline, with the methods a training loop calls on a pipe.

A chain that ends in torch's ``batch`` or ``collate`` has no ``state_dict``, ``set_epoch``
or ``stats`` (they are torch's stages): this root gives them, reaching the stages below
through their one protocol. The recipes return one, the loader's wrapper uses one, and
``sp.resume_from`` returns one holding the rest of an epoch begun on another topology.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.shuffle import pack, unpack
from shardpipes._core.split import block
from shardpipes._core.stage import is_rest
from shardpipes.pipes._stage import Pipe
from shardpipes.pipes._torch import require_pipeline

__all__ = ["Resumable", "deal", "flatten", "undelivered"]

T = TypeVar("T")


class Resumable(Pipe):
    """A pipeline with ``state_dict``, ``load_state_dict``, ``set_epoch``, ``stats`` and ``len``.

    It holds nothing of its own, except after ``sp.resume_from``: then its next epoch is
    the rest of one begun on another topology, and until that epoch is over its state
    is what is left (every worker's share, and the items this worker delivered of its
    own). The plain ``StatefulDataLoader(pipe)`` uses one inside, so the two agree on
    every seed and state.

    Args:
        pipe: The pipeline.
        check: Refuse now a pipeline that cannot be resumed (torch's ``shuffle``…), naming
            the stage; a DataLoader's wrapper checks only when a state is asked.

    Example:
        >>> import shardpipes as sp
        >>> chain = sp.list_shards("data/train-*.tar").split_shards(seed=1).open_tar()
        >>> pipe = sp.Resumable(chain.batch(4))
        >>> pipe.set_epoch(3)
        >>> pipe.state_dict()["epoch"]
        3
    """

    @classmethod
    def of(cls, pipe: IterDataPipe[Any], *, check: bool = True) -> Resumable:
        """``pipe`` if it is one already, else a :class:`Resumable` of it."""
        return pipe if isinstance(pipe, cls) else cls(pipe, check=check)

    def __init__(self, pipe: IterDataPipe[T], *, check: bool = True) -> None:
        super().__init__()
        self.source_datapipe = require_pipeline(pipe, "Resumable")
        self._rest: dict[str, Any] | None = None  # resume_from's: the rest of an epoch
        self._done = 0  # items this worker delivered of its share of the rest
        self._running = False  # the rest's epoch has begun here
        if check:
            self.state()  # a stage that cannot describe its state raises, naming itself

    @property
    def pipe(self) -> Any:
        """The pipeline."""
        return self.source_datapipe

    def resume(self, refs: Sequence[Any], *, epoch: int, even: bool) -> None:
        """Make the next iteration the rest of ``epoch``: ``refs``, dealt over the workers."""
        self._rest = {**pack(refs, "resume_from"), "epoch": epoch, "even": even}
        self._done, self._running, self._fresh = 0, False, True

    # -- the protocol, with a rest --------------------------------------------------------

    @override
    @property
    def epoch(self) -> int:
        return self._rest["epoch"] if self._rest is not None else super().epoch

    @override
    def set_epoch(self, epoch: int, *, given: bool = True) -> None:
        if self._rest is not None and epoch != self._rest["epoch"]:
            self._rest = None  # another epoch: the rest is over
        super().set_epoch(epoch, given=given)

    @override
    def begun(self) -> bool:
        return self._running if self._rest is not None else super().begun()

    @override
    def hand_out(self) -> None:
        if self._rest is not None:
            self._running = True
        else:
            super().hand_out()

    @override
    def advance(self) -> None:
        if self._rest is not None and self._running:  # the rest is over
            epoch, self._rest = self._rest["epoch"], None
            super().set_epoch(epoch + 1, given=False)
            return
        super().advance()

    def state(self) -> Any:
        """The pipeline's state; during a rest, what is left of it."""
        if self._rest is None:
            return super().state()
        return {"rest": self._rest, "done": self._done}

    @override
    def reset(self, state: Any = None) -> None:
        self._fresh, self._running = True, False
        if is_rest(state):
            self._rest, self._done = dict(state["rest"]), int(state["done"])
            return
        if state is not None:
            self._rest = None
        self._done = 0
        super().reset(state)

    def _share(self, total: int, worker: int) -> Sequence[Any]:
        assert self._rest is not None
        return deal(unpack(self._rest), total, worker, even=self._rest["even"])

    def _iterate(self) -> Iterator[Any]:
        if self._rest is None:
            return iter(self.source_datapipe)
        return self._rest_items()

    def _rest_items(self) -> Iterator[Any]:
        self._running = True
        source = self.sources()[0]
        for item in source.fetch(undelivered(source, self._share(*self.placement()), self._done)):
            self._done += 1
            yield item

    def _references(self) -> Iterator[Any]:
        if self._rest is None:
            return self.sources()[0].references()
        share = self._share(*self.placement())
        return itertools.islice(self.sources()[0].regroup(share), self._done, None)

    @override
    def length(self, total: int, worker: int | None) -> int:
        if self._rest is None:
            return super().length(total, worker)
        if worker is None:
            return sum(self.length(total, w) for w in range(total))
        return sum(1 for _ in self.sources()[0].regroup(self._share(total, worker)))


def flatten(items: Iterable[Any]) -> list[Any]:
    """The sample references in items made of references (samples, tuples, batches)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            out.append(item)
        elif isinstance(item, list | tuple):
            out += flatten(item)
    return out


def undelivered(stage: Any, share: Sequence[Any], done: int) -> Sequence[Any]:
    """The references of ``share`` left after the first ``done`` items ``stage`` makes of it."""
    return share[len(flatten(itertools.islice(stage.regroup(share), done))) :]


def deal(refs: Sequence[Any], total: int, worker: int, *, even: bool) -> Sequence[Any]:
    """Worker ``worker`` of ``total``'s share of a rest: ``n // total`` each with ``even``."""
    if even:
        each = len(refs) // total
        return refs[worker * each : (worker + 1) * each]
    mine = block(len(refs), worker, total)
    return refs[mine.start : mine.stop]
