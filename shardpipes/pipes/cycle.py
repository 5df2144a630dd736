"""The ``cycle_epochs`` stage: the source read again and again, a new order each pass."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.stage import checked_int, loaded_state, no_length, on_items
from shardpipes.pipes._stage import Pipe, functional_form

__all__ = ["EpochCycler"]


@functional_form("cycle_epochs")
class EpochCycler(Pipe):
    """Read the source again and again (functional name: ``cycle_epochs``).

    torchdata's ``.cycle()`` and webdataset's ``.repeat()``: ``count`` passes over the
    source (``None``: without end), each pass a new shard order and shuffle (the
    ``split_shards`` pass, a field of its state), every sample once per pass. The pass is
    in this stage's state. Each DataLoader worker cycles its own share, so the workers'
    passes need not line up.

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
        self.count: int | None = checked_int(count, "count", optional=True)
        self._pass = 0
        self._resumed = False  # the first pass is a loaded one: it may have nothing left

    def state(self) -> dict[str, Any]:
        """The source's state, the pass this worker is in, and ``count``."""
        on_items(self, "cycle_epochs")
        return {"source": self.sources()[0].state(), "pass": self._pass, "count": self.count}

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """Set up the next iteration: its first pass, or a saved one.

        Raises:
            ValueError: A state of another stage, or of another ``count``.
        """
        state = loaded_state(state, "cycle_epochs", "pass", count=self.count)
        self._pass = 0 if state is None else int(state["pass"])
        self._resumed, self._fresh = state is not None, True
        self.sources()[0].reset(None if state is None else state["source"])

    @override
    @property
    def endless(self) -> bool:
        return self.count is None

    def _cycled(self, items: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        first = True
        while self.count is None or self._pass < self.count:
            if not first:
                self.sources()[0].next_pass()
            given = 0
            for item in items():
                given += 1
                yield item
            if self.count is None and given == 0 and not (first and self._resumed):
                msg = (
                    "cycle_epochs(): a whole pass over the source gave this worker no item "
                    "(its share of the shards, or of a limit_samples before the cycle, is "
                    "empty), so an endless cycle would spin: give count=, or more data (or "
                    "a larger limit) per worker"
                )
                raise ValueError(msg)
            first = False
            self._pass += 1

    def _iterate(self) -> Iterator[Any]:
        return self._cycled(lambda: iter(self.source_datapipe))

    def _references(self) -> Iterator[Any]:
        return self._cycled(self.sources()[0].references)

    @override
    def length(self, total: int, worker: int | None) -> int:
        if self.count is None:
            no_length(self, "cycle_epochs() without count never ends")
        return self.count * self.sources()[0].length(total, worker)
