"""The ``prefetch_items`` stage: the stages upstream run in a thread, ``size`` items ahead."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.prefetch import Prefetch
from shardpipes._core.stage import checked_int, loaded_state, on_items
from shardpipes.pipes._stage import Pipe, functional_form

__all__ = ["ItemPrefetcher"]


@functional_form("prefetch_items")
class ItemPrefetcher(Pipe):
    """Keep ``size`` finished items ready, made in a background thread (``prefetch_items``).

    torchdata's ``.prefetch(n)``: the stages upstream (reading, decoding, batching…) run
    in a thread, up to ``size`` items ahead of the consumer, so that a training step and
    the next items' preparation overlap, with or without DataLoader workers. Resumable:
    the thread takes its source's state with its first item, every ``size``-th and its
    last; this stage's state is the newest of those delivered plus how many items
    (fewer than ``size``) to skip after it, which a resumed run reads again and drops.
    Errors raised upstream are raised here, as they were.

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
        self.size: int = checked_int(size, "size")
        self._run: Prefetch | None = None
        self._skip = 0  # items a resumed run drops before its first one
        self._loaded: Any = None  # the source's state the next run starts from

    def state(self) -> dict[str, Any]:
        """The source's state at the newest snapshot delivered, and the items since."""
        on_items(self, "prefetch_items")
        run = self._run
        if run is None or self._fresh:
            return {"source": self.sources()[0].state(), "skip": self._skip}
        skip = run.behind() + (self._skip if run.mark[0] == 0 else 0)
        return {"source": run.mark[1], "skip": skip}

    @override
    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        state = loaded_state(state, "prefetch_items", "skip")
        self._stop()
        self._skip = 0 if state is None else int(state["skip"])
        self._fresh = True
        self.sources()[0].reset(None if state is None else state["source"])

    def _stop(self) -> None:
        if self._run is not None:  # a loop left early, its iterator still held: stop it
            self._run.close()
            self._run = None

    def _iterate(self) -> Iterator[Any]:
        self._stop()
        source = self.sources()[0]
        mark = (0, source.state())  # nothing runs the source yet
        items: Iterator[Any] = iter(self.source_datapipe)
        if self._skip:
            items = itertools.islice(items, self._skip, None)
        self._run = Prefetch(items, self.size, source.state, mark)
        return iter(self._run)

    def _references(self) -> Iterator[Any]:
        return itertools.islice(self.sources()[0].references(), self._skip, None)

    def __getstate__(self) -> Any:
        state = {**self.__dict__, "_run": None}  # a thread: the next iteration makes its own
        if IterDataPipe.getstate_hook is not None:
            return IterDataPipe.getstate_hook(state)
        return state
