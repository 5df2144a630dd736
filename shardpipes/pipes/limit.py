"""The ``limit_samples`` stage: at most ``n`` items an epoch, over all workers and ranks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.split import share
from shardpipes._core.stage import checked_int, loaded_state, on_items
from shardpipes.pipes._stage import Pipe, functional_form

__all__ = ["SampleLimiter"]


@functional_form("limit_samples")
class SampleLimiter(Pipe):
    """At most ``n`` items an epoch over all workers and ranks (functional: ``limit_samples``).

    webdataset's ``.slice(n)`` and torchdata's ``.header(n)``, counted over the whole
    epoch rather than per DataLoader worker: each of the ``T`` workers × ranks gives
    ``n // T`` items, the first ``n % T`` one more (fewer if its share of the data runs
    out first); with ``split_shards(even=True)`` upstream, ``n // T`` each, as DDP
    needs. It stops reading there; the next epoch starts again from the top. Its count is
    in its state, so a resumed epoch stops at the same place.

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
        self.n: int = checked_int(n, "n")
        self._given = 0

    def quota(self, total: int, worker: int) -> int:
        """The items global worker ``worker`` of ``total`` gives in an epoch, at most.

        With ``split_shards(even=True)`` upstream (DDP), ``n // total`` for every worker:
        ranks that gave different counts would hang a collective.
        """
        return share(self.n, total, worker, even=self.sources()[0].even)

    def state(self) -> dict[str, Any]:
        """The source's state, the items given this epoch by this worker, and ``n``."""
        on_items(self, "limit_samples")
        return {"source": self.sources()[0].state(), "given": self._given, "n": self.n}

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """Set up the next iteration: none given yet, or a saved count.

        Raises:
            ValueError: A state of another stage, or of another ``n`` (its epoch was cut
                by the saved one).
        """
        state = loaded_state(state, "limit_samples", "given", n=self.n)
        self._given, self._fresh = 0 if state is None else int(state["given"]), True
        self.sources()[0].reset(None if state is None else state["source"])

    @override
    def next_pass(self) -> None:
        self._given = 0  # a cycle_epochs after it: n per pass
        super().next_pass()

    endless = False  # it ends at its count

    def _limited(self, items: Iterator[Any]) -> Iterator[Any]:
        quota = self.quota(*self.sources()[0].placement())
        if self._given >= quota:  # its epoch is over: the source stays unread
            self.sources()[0].check_loaded()
            return
        try:
            for item in items:
                self._given += 1
                yield item
                if self._given >= quota:
                    return
        finally:
            getattr(items, "close", lambda: None)()

    def _iterate(self) -> Iterator[Any]:
        return self._limited(iter(self.source_datapipe))

    def _references(self) -> Iterator[Any]:
        if not self.sources()[0].exact:
            msg = (
                "limit_samples counts the items of a filter, which a replay on references "
                "cannot know: put limit_samples before filter, or resume on the same "
                "number of ranks and workers"
            )
            raise ValueError(msg)
        return self._limited(self.sources()[0].references())

    @override
    def length(self, total: int, worker: int | None) -> int:
        if worker is None:
            return sum(self.length(total, w) for w in range(total))
        quota = self.quota(total, worker)
        source = self.sources()[0]
        if source.endless:
            return quota
        return min(quota, source.length(total, worker))
