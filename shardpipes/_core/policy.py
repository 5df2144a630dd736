"""The error policy of a pipeline: its handler, the epoch's error budget, and the counters.

One :class:`ErrorPolicy` serves every stage of a pipeline (the recipes make one from
their ``handler=`` and ``max_errors=``; chains can pass one object to each stage). Each
stage gives it the errors it meets; the policy applies the handler, counts what was
skipped and why, and raises :class:`~shardpipes.errors.TooManyErrorsError` once the
epoch's budget is spent, so that a bucket full of garbage fails loudly instead of
training on nothing.

The counters live in shared memory, one row per DataLoader worker, so the process that
made the pipeline reads them summed over its workers after the epoch (:meth:`stats`),
with ``fork``, ``spawn`` and ``forkserver`` workers alike. Each worker clears its own row
when its epoch begins. Ranks of a distributed job each count their own workers.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

from torch.utils.data import get_worker_info

from shardpipes._core.handlers import Handler, check_handler, handle
from shardpipes.errors import (
    DecodeError,
    MissingFieldError,
    TarFormatError,
    TooManyErrorsError,
    UnsafeDataError,
)

__all__ = ["REASONS", "ErrorPolicy", "Stats", "as_policy", "reason"]

REASONS = ("tar", "decode", "unsafe", "missing_field", "storage", "other")
_COLUMNS = ("read", "dropped", "errors", "shards", "shards_failed", *REASONS)
_COL = {name: i for i, name in enumerate(_COLUMNS)}
_WIDTH = len(_COLUMNS)
_ROWS = 1024  # DataLoader workers per process; row _ROWS holds the latest run's worker count
_BYTES = (_ROWS + 1) * _WIDTH * 8


def reason(exc: BaseException) -> str:
    """The counter an error is skipped under: one of :data:`REASONS`."""
    if isinstance(exc, TarFormatError):
        return "tar"
    if isinstance(exc, UnsafeDataError):
        return "unsafe"
    if isinstance(exc, DecodeError):
        return "decode"
    if isinstance(exc, MissingFieldError):
        return "missing_field"
    if isinstance(exc, OSError):
        return "storage"
    return "other"


@dataclass(frozen=True)
class Stats:
    """What one epoch of a pipeline read and skipped, over all its DataLoader workers.

    Attributes:
        read: Samples read whole from the shards.
        yielded: Samples that went on past every stage (``read`` minus those skipped
            after reading, by ``decode``, ``to_tuple``…).
        errors: Errors the handler skipped (each one bad member, sample or shard).
        skipped: Those errors by reason (:data:`REASONS`), zeros left out.
        shards: Shards (or shard parts) opened.
        shards_failed: Shards abandoned before their end (unreadable, truncated).
    """

    read: int = 0
    yielded: int = 0
    errors: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    shards: int = 0
    shards_failed: int = 0

    def __add__(self, other: Stats) -> Stats:
        reasons = {r: self.skipped.get(r, 0) + other.skipped.get(r, 0) for r in REASONS}
        return Stats(
            read=self.read + other.read,
            yielded=self.yielded + other.yielded,
            errors=self.errors + other.errors,
            skipped={r: n for r, n in reasons.items() if n},
            shards=self.shards + other.shards,
            shards_failed=self.shards_failed + other.shards_failed,
        )

    def __str__(self) -> str:
        why = ", ".join(f"{k} {v}" for k, v in self.skipped.items())
        return (
            f"{self.yielded} samples yielded of {self.read} read; {self.errors} skipped"
            + (f" ({why})" if why else "")
            + f"; {self.shards} shards, {self.shards_failed} failed"
        )


class _Counters:
    """A table of int64 counters in shared memory: one row per DataLoader worker.

    Pickled (for ``spawn`` workers) as the segment's name; a ``fork`` worker uses the
    inherited mapping. Where shared memory is unavailable the table is private to each
    process (the counts of workers are then not seen by the parent).
    """

    def __init__(self) -> None:
        try:
            shm = shared_memory.SharedMemory(create=True, size=_BYTES)
        except OSError:
            self._name, self._view = None, _private()
            return
        self._name = shm.name
        self._attach(shm, owner=True)

    def _attach(self, shm: shared_memory.SharedMemory, *, owner: bool) -> None:
        buf = shm.buf
        assert buf is not None  # an open segment
        self._view = buf.cast("q")
        weakref.finalize(self, _release, self._view, shm, owner)

    def __getstate__(self) -> dict[str, Any]:
        if self._name is None:
            return {"name": None, "data": self._view.tobytes()}
        return {"name": self._name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._name = state["name"]
        if self._name is None:
            self._view = _private(state["data"])
            return
        try:
            shm = shared_memory.SharedMemory(name=self._name)
        except OSError:  # gone (its owner was collected): count privately
            self._name, self._view = None, _private()
            return
        self._attach(shm, owner=False)

    def add(self, row: int, column: str, n: int = 1) -> None:
        # released: a reading generator closed after its pipe was collected
        with contextlib.suppress(ValueError):
            self._view[row * _WIDTH + _COL[column]] += n

    def get(self, row: int, column: str) -> int:
        return int(self._view[row * _WIDTH + _COL[column]])

    def begin(self, row: int, workers: int) -> None:
        """Clear ``row`` and record how many rows the current run uses."""
        base = row * _WIDTH
        for i in range(_WIDTH):
            self._view[base + i] = 0
        self._view[_ROWS * _WIDTH] = workers

    def total(self, column: str) -> int:
        workers = max(1, min(_ROWS, int(self._view[_ROWS * _WIDTH])))
        return sum(int(self._view[r * _WIDTH + _COL[column]]) for r in range(workers))


def _private(data: bytes = bytes(_BYTES)) -> memoryview:
    """A table in this process's memory only (no shared memory, or it is gone)."""
    return memoryview(bytearray(data)).cast("q")


def _release(view: memoryview, shm: shared_memory.SharedMemory, owner: bool) -> None:
    view.release()
    shm.close()
    if owner:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()


class ErrorPolicy:
    """A handler, an error budget per epoch, and counters, for every stage of a pipeline.

    Args:
        handler: ``"raise"`` (default), ``"warn"`` (skip, with a warning naming the bad
            item), ``"ignore"`` (skip silently), or a callable ``(exc, context) -> bool``
            returning ``True`` to skip.
        max_errors: The budget of skipped errors per epoch, past which the pipeline raises
            :class:`~shardpipes.errors.TooManyErrorsError`: an ``int`` (that many errors
            are allowed, summed over the DataLoader workers), or a ``float`` in (0, 1), a
            fraction of the items seen (samples read plus errors). A fraction is checked
            at each error once the counts cover ``1 / max_errors`` items, and by each
            worker at the end of its epoch on its own counts (so a worker that read
            nothing but errors fails). ``None`` (default): no budget.

    Example:
        >>> policy = ErrorPolicy("ignore", max_errors=1)  # doctest: +ELLIPSIS
        >>> policy.begin()
        >>> policy.handle(ValueError("bad"), stage="decode")
        >>> policy.stats().errors
        1
        >>> policy.handle(ValueError("worse"), stage="decode")
        Traceback (most recent call last):
        ...
        shardpipes.errors.TooManyErrorsError: 2 errors skipped this epoch, over max_errors=1; ...
    """

    def __init__(
        self, handler: Handler = "raise", *, max_errors: int | float | None = None
    ) -> None:
        if isinstance(handler, ErrorPolicy):
            msg = "handler is already an ErrorPolicy: give max_errors to it"
            raise TypeError(msg)
        self.handler = check_handler(handler)
        self.max_errors = _check_budget(max_errors)
        self._counters = _Counters()
        self._row = 0
        self._lock = threading.Lock()  # decode threads report errors concurrently

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def begin(self) -> None:
        """Start an epoch in this process (a source stage calls it from ``__iter__``)."""
        info = get_worker_info()
        self._row = 0 if info is None else info.id % _ROWS
        self._counters.begin(self._row, 1 if info is None else info.num_workers)

    def count(self, column: str, n: int = 1) -> None:
        """Add ``n`` to one of this worker's counters (``read``, ``shards``…)."""
        self._counters.add(self._row, column, n)

    def handle(self, exc: BaseException, **context: Any) -> None:
        """Apply the handler to ``exc`` (raise it, or count it skipped) and check the budget.

        Args:
            exc: The error.
            **context: ``stage``, ``url``, ``member``, ``key``; a ``stage`` other than
                ``open_tar`` means the sample had been read (it is not yielded).
        """
        handle(self.handler, exc, **context)
        counters, row = self._counters, self._row
        with self._lock:
            counters.add(row, "errors")
            counters.add(row, reason(exc))
            if context.get("stage", "open_tar") != "open_tar":
                counters.add(row, "dropped")
        budget = self.max_errors
        if budget is None:
            return
        errors = counters.total("errors")
        if isinstance(budget, int):
            if errors > budget:
                raise TooManyErrorsError(_budget_problem(errors, budget, exc)) from exc
            return
        seen = counters.total("read") + errors
        if seen * budget >= 1 and errors > budget * seen:
            raise TooManyErrorsError(_budget_problem(errors, budget, exc, seen)) from exc

    def end(self) -> None:
        """At the end of this worker's epoch: a fractional budget, on its own counts."""
        budget = self.max_errors
        if not isinstance(budget, float):
            return
        errors = self._counters.get(self._row, "errors")
        seen = self._counters.get(self._row, "read") + errors
        if errors > budget * seen:
            raise TooManyErrorsError(_budget_problem(errors, budget, None, seen))

    def stats(self) -> Stats:
        """The counts of the current (or last) epoch, summed over the DataLoader workers."""
        total = self._counters.total
        read, dropped = total("read"), total("dropped")
        return Stats(
            read=read,
            yielded=max(0, read - dropped),
            errors=total("errors"),
            skipped={r: n for r in REASONS if (n := total(r))},
            shards=total("shards"),
            shards_failed=total("shards_failed"),
        )


def as_policy(handler: Handler | ErrorPolicy, max_errors: int | float | None = None) -> ErrorPolicy:
    """The policy a stage uses: ``handler`` itself if it is one, else a new one."""
    if isinstance(handler, ErrorPolicy):
        if max_errors is not None:
            msg = "give max_errors to the ErrorPolicy, not beside it"
            raise ValueError(msg)
        return handler
    return ErrorPolicy(handler, max_errors=max_errors)


def _check_budget(max_errors: int | float | None) -> int | float | None:
    if max_errors is None:
        return None
    if isinstance(max_errors, bool) or not isinstance(max_errors, int | float):
        msg = f"max_errors must be an int, a float in (0, 1), or None (got {max_errors!r})"
        raise TypeError(msg)
    if isinstance(max_errors, int) and max_errors >= 0:
        return max_errors
    if isinstance(max_errors, float) and 0 < max_errors < 1:
        return max_errors
    msg = f"max_errors must be an int >= 0 or a float in (0, 1) (got {max_errors!r})"
    raise ValueError(msg)


def _budget_problem(
    errors: int, budget: int | float, last: BaseException | None, seen: int | None = None
) -> str:
    over = f"max_errors={budget}" if seen is None else f"max_errors={budget} of {seen} items"
    tail = f"; the last: {last}" if last is not None else ""
    return f"{errors} errors skipped this epoch, over {over}{tail}"
