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

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardpipes._core.handlers import Handler, check_handler, handle
from shardpipes._core.shared import ROWS, SharedTable
from shardpipes.errors import (
    DecodeError,
    MissingFieldError,
    TarFormatError,
    TooManyErrorsError,
    UnsafeDataError,
)

REASONS = ("tar", "decode", "unsafe", "missing_field", "storage", "other")
_COLUMNS = ("read", "dropped", "errors", "shards", "shards_failed", *REASONS, "runs", "ended")
_COL = {name: i for i, name in enumerate(_COLUMNS)}
_WIDTH = len(_COLUMNS)
_KINDS = (  # in order: an UnsafeDataError is a DecodeError
    (TarFormatError, "tar"),
    (UnsafeDataError, "unsafe"),
    (DecodeError, "decode"),
    (MissingFieldError, "missing_field"),
    (OSError, "storage"),
)


def reason(exc: BaseException) -> str:
    """The counter an error is skipped under: one of :data:`REASONS`."""
    return next((name for kind, name in _KINDS if isinstance(exc, kind)), "other")


@dataclass(frozen=True)
class Stats:
    """What one epoch of a pipeline read and skipped, over all its DataLoader workers.

    Attributes:
        read: Samples read whole from the shards.
        yielded: Samples that went on past every stage (``read`` minus those skipped
            after reading, by ``decode``, ``to_tuple``…).
        errors: Errors the handler skipped (each one bad member, sample or shard).
        skipped: Those errors by reason (:data:`REASONS`), zeros left out.
        shards: Shards opened: a shard that several workers read in parts counts once.
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
            f"{self.yielded} sample{'' if self.yielded == 1 else 's'} yielded of {self.read} read; "
            f"{self.errors} skipped"
            + (f" ({why})" if why else "")
            + f"; {self.shards} shard{'' if self.shards == 1 else 's'}, "
            f"{self.shards_failed} failed"
        )


class _Counters:
    """The counters in a :class:`SharedTable`: one row per DataLoader worker.

    Each row also holds how many epochs its worker has begun (``runs``) and whether the
    current one has ended, so that the last worker to end knows that it is the last.
    The header row holds how many workers the current run has.
    """

    def __init__(self) -> None:
        self._table = SharedTable(_WIDTH)

    def add(self, row: int, column: str, n: int = 1) -> None:
        self._table.add(row, _COL[column], n)

    def get(self, row: int, column: str) -> int:
        return self._table.get(row, _COL[column])

    def begin(self, row: int, workers: int) -> None:
        """Clear ``row``'s counts for a new epoch; record how many rows the run uses."""
        runs = self.get(row, "runs")
        self._table.clear(row)
        self._table.set(row, _COL["runs"], runs + 1)
        self._table.set(ROWS, 0, workers)

    def workers(self) -> int:
        return max(1, min(ROWS, self._table.get(ROWS, 0)))

    def total(self, column: str) -> int:
        return sum(self.get(r, column) for r in range(self.workers()))

    def end(self, row: int) -> bool:
        """Mark ``row``'s epoch ended; whether every worker of the run has now ended it."""
        self._table.set(row, _COL["ended"], 1)
        runs = self.get(row, "runs")
        return all(
            self.get(r, "ended") and self.get(r, "runs") == runs for r in range(self.workers())
        )


class ErrorPolicy:
    """A handler, an error budget per epoch, and counters, for every stage of a pipeline.

    Args:
        handler: ``"raise"`` (default), ``"warn"`` (skip, with a warning naming the bad
            item), ``"ignore"`` (skip silently), or a callable ``(exc, context) -> bool``
            returning ``True`` to skip.
        max_errors: The budget of skipped errors per epoch, past which the pipeline raises
            :class:`~shardpipes.errors.TooManyErrorsError`: an ``int`` (that many errors
            are allowed, summed over the DataLoader workers: checked at each error), or a
            ``float`` in (0, 1), a fraction of the items seen (samples read plus errors),
            checked at the end of the epoch on the counts summed over all the workers
            (by the last worker to end), so that the outcome does not depend on the
            number of workers. ``None`` (default): no budget.

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

    def begin(self, worker: int = 0, workers: int = 1) -> None:
        """Start an epoch in this process (a source stage calls it from ``__iter__``).

        Args:
            worker: This DataLoader worker's id (0 without workers).
            workers: How many DataLoader workers share the counts.
        """
        self._row = worker % ROWS
        self._counters.begin(self._row, workers)

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
        if isinstance(budget, int):  # a fraction is decided at the end (see end())
            errors = counters.total("errors")
            if errors > budget:
                raise TooManyErrorsError(_budget_problem(errors, budget, exc)) from exc

    def end(self) -> None:
        """At the end of this worker's epoch: a fractional budget, once every worker ended.

        The last worker to end decides on the counts summed over all of them, so the
        outcome is the same for any number of DataLoader workers.
        """
        last = self._counters.end(self._row)
        budget = self.max_errors
        if not isinstance(budget, float) or not last:
            return
        errors = self._counters.total("errors")
        seen = self._counters.total("read") + errors
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
