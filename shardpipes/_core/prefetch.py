"""A bounded background prefetch of finished items, with the position a checkpoint needs.

:class:`Prefetch` runs an iterator in a thread that keeps up to ``size`` of its items
ready for the consumer. The producer is ahead of what was delivered, so its live state
is not the state of the pipeline the consumer sees; instead it takes a **snapshot** of
its state (``snapshot()``, called in the thread) after its first item, after every
``size``-th one and at the end, and sends it along with that item. The consumer keeps the
newest snapshot it has reached, :attr:`Prefetch.mark` ``= (j, state)``: the state after
``j`` items, with ``delivered - j`` (fewer than ``size``) items delivered since. A
checkpoint is that state plus the count to skip: resuming loads the state and drops that
many items, so nothing is lost or repeated, and a snapshot costs one state per ``size``
items, not one per item.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from shardpipes._core.stage import checked_int

_END: Any = object()  # the producer's source ran out
_FAILED: Any = object()  # the producer's source raised


class Prefetch:
    """``items``, produced in a thread up to ``size`` ahead of their consumer.

    Iterate it once. Closing the iteration (``break``, an error, garbage collection) stops
    the thread, waits for it, and closes ``items`` there.

    Args:
        items: The items; once iteration starts, only the thread touches it.
        size: Items kept ready (at least 1).
        snapshot: The producer's state, called in the thread between two items.
        mark: The snapshot before the first item: ``(0, state)`` taken before the thread
            starts (when nothing else runs ``items``).
    """

    def __init__(
        self,
        items: Iterator[Any],
        size: int,
        snapshot: Callable[[], Any],
        mark: tuple[int, Any],
    ) -> None:
        checked_int(size, "size")
        self.items, self.size, self.snapshot = items, size, snapshot
        self.mark = mark
        self.delivered = 0
        self._queue: queue.Queue[tuple[Any, int, Any]] = queue.Queue(size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _produce(self) -> None:
        made = 0
        try:
            for item in self.items:
                made += 1
                due = made == 1 or made % self.size == 0
                self._queue.put((item, made, self.snapshot() if due else None))
                if self._stop.is_set():
                    return
            self._queue.put((_END, made, self.snapshot()))
        except BaseException as exc:  # handed to the consumer, raised there
            self._queue.put((_FAILED, made, exc))
        finally:
            close = getattr(self.items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[Any]:
        if self._thread is not None:
            msg = "a Prefetch is iterated once"
            raise RuntimeError(msg)
        self._thread = threading.Thread(
            target=self._produce, daemon=True, name="shardpipes-prefetch"
        )
        self._thread.start()
        try:
            while True:
                item, made, extra = self._queue.get()
                if item is _FAILED:
                    raise extra
                if extra is not None:
                    self.mark = (made, extra)
                if item is _END:
                    return
                self.delivered = made
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer and wait for it (it closes ``items``)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._stop.set()
        # after the stop, the producer puts at most one more item: emptied, the queue has
        # room for it, so a producer blocked on a full queue puts, sees the stop and returns
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        thread.join()

    def behind(self) -> int:
        """Items delivered since the snapshot of :attr:`mark`."""
        return self.delivered - self.mark[0]
