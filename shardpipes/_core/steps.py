"""What happens to a sample after reading — decode, pick fields, transform, batch — as plain code.

Each chained stage (``decode``, ``to_tuple``) runs one of these steps over its source
through :func:`guarded`, which gives a bad sample to the error policy; the recipes' fused
stage runs the same steps composed in one function (:class:`Finisher`) through the same
:func:`guarded`. So the two agree by construction, and each step exists once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shardpipes._core.fields import Alternatives
from shardpipes._core.handlers import Handler, handle
from shardpipes.errors import DecodeError, MissingFieldError

SKIPPED: Any = object()  # what a guarded step gives for a sample the handler skipped


def wanted(fields: Alternatives) -> frozenset[str]:
    """Every name the fields may take: the only ones worth decoding before picking them."""
    return frozenset(name for names in fields for name in names)


def skip_or_raise(handler: Handler, exc: DecodeError | MissingFieldError) -> None:
    """Give a bad sample's error to the handler: returns if it skips, else raises."""
    if isinstance(exc, MissingFieldError):
        handle(handler, exc, stage="to_tuple", url=exc.url, key=exc.key)
    else:
        handle(handler, exc, stage="decode", url=exc.url, member=exc.member, key=exc.key)


def guard(step: Callable[[Any], Any], handler: Handler) -> Callable[[Any], Any]:
    """``step`` that gives :data:`SKIPPED` for a sample the handler skipped."""

    def guarded_step(item: Any) -> Any:
        try:
            return step(item)
        except (DecodeError, MissingFieldError) as exc:
            skip_or_raise(handler, exc)
            return SKIPPED

    return guarded_step


def guarded(items: Iterable[Any], step: Callable[[Any], Any], handler: Handler) -> Iterator[Any]:
    """``step`` over ``items``; a bad sample (decode, missing field) goes to ``handler``."""
    return (out for out in map(guard(step, handler), items) if out is not SKIPPED)


class InFlight:
    """The items :func:`threaded` has taken and not yet given out: ``chunk[done:]``."""

    def __init__(self) -> None:
        self.chunk: list[Any] = []
        self.done = 0

    def pending(self) -> list[Any]:
        """The items taken but not yet given out."""
        return self.chunk[self.done :]


def threaded(
    items: Iterator[Any],
    step: Callable[[Any], Any],
    threads: int,
    chunk: int,
    flight: InFlight | None = None,
) -> Iterator[Any]:
    """``step`` (a :func:`guard`-ed one) on a pool of ``threads``, in order, ``chunk`` at a time.

    ``flight`` is kept up to date, so that a state taken between two items knows which
    items are in flight (taken from ``items``, not yet given out).
    """
    flight = flight if flight is not None else InFlight()
    with ThreadPoolExecutor(threads, thread_name_prefix="shardpipes-decode") as pool:
        while taken := list(itertools.islice(items, chunk)):
            flight.chunk, flight.done = taken, 0
            for out in pool.map(step, taken):
                flight.done += 1
                if out is not SKIPPED:
                    yield out
            flight.chunk = []
