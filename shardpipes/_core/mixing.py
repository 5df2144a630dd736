"""Weighted mixing of sources: which source each next sample comes from.

:class:`MixDraws` draws source names in proportion to their weights, deterministically
from a seed, and so that the proportions hold over short windows, not only on average:
draws come in blocks of :data:`BLOCK`, each holding every source's share of the block
(by largest remainder, carried over from block to block so the counts never drift by
more than one from the weights), in a random order. Independent draws would stray by
±2.2 % (one standard deviation at a weight of 3/4) over a window of 1,000 samples; these
stay within about ``BLOCK / window``.

A source that runs out is dropped (:meth:`MixDraws.exhausted`): the others go on in
proportion to their own weights. The draws' position is small plain data
(:meth:`MixDraws.state`), restored exactly by :meth:`MixDraws.restore`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

BLOCK = 20  #: draws per block: every source's share of it, in a random order


def check_weights(names: list[str], weights: Mapping[str, float] | None) -> dict[str, float]:
    """The weight of every source (1 each by default), checked.

    Raises:
        ValueError: A weight is negative, not a finite number, names no source, or all
            are zero; or a source has none.
        TypeError: ``weights`` is not a mapping.
    """
    if not names:
        msg = "mixing needs at least one source"
        raise ValueError(msg)
    if weights is None:
        return dict.fromkeys(names, 1.0)
    if not isinstance(weights, Mapping):
        msg = (
            f"weights must be a dict of source name -> weight, e.g. "
            f"{{{names[0]!r}: 3, ...}} (got a {type(weights).__name__})"
        )
        raise TypeError(msg)
    unknown = sorted(map(str, set(weights) - set(names)))
    if unknown:
        msg = f"weights name no source: {', '.join(unknown)} (the sources: {', '.join(names)})"
        raise ValueError(msg)
    missing = [name for name in names if name not in weights]
    if missing:
        msg = f"no weight for source(s) {', '.join(missing)}"
        raise ValueError(msg)
    out = {}
    for name in names:
        value = weights[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            msg = f"the weight of {name!r} must be a finite number (got {value!r})"
            raise ValueError(msg)
        if value < 0:
            msg = f"the weight of {name!r} is negative ({value})"
            raise ValueError(msg)
        out[name] = float(value)
    if not any(out.values()):
        msg = "the weights are all zero: no source would ever be drawn"
        raise ValueError(msg)
    return out


class MixDraws:
    """The sequence of sources to draw from, for one worker's epoch.

    Args:
        weights: Each source's weight (:func:`check_weights`); a source of weight 0 is
            never drawn.
        seed: The seed, e.g. a function of the mix's seed, the epoch and the worker.
    """

    def __init__(self, weights: Mapping[str, float], seed: int | str) -> None:
        self.weights = {name: w for name, w in weights.items() if w > 0}
        digest = hashlib.sha256(f"shardpipes-mix:{seed}".encode()).digest()
        self.rng = random.Random(int.from_bytes(digest[:8], "little"))
        self.block: list[str] = []  # the current block, drawn from its end
        self.drawn = dict.fromkeys(self.weights, 0)  # since the weights last changed
        self.count = 0  # draws in all

    def next(self) -> str:
        """The source of the next sample.

        Raises:
            IndexError: No source is left.
        """
        if not self.block:
            self.block = self._new_block()
        self.count += 1
        name = self.block.pop()
        self.drawn[name] += 1
        return name

    def exhausted(self, name: str) -> None:
        """``name`` ran out (its draw is void): the rest are drawn by their own weights."""
        self.weights.pop(name, None)
        self.drawn = dict.fromkeys(self.weights, 0)
        self.block = []  # the next block is of the weights left

    def _new_block(self) -> list[str]:
        if not self.weights:
            msg = "every source ran out"
            raise IndexError(msg)
        total = sum(self.weights.values())
        done = sum(self.drawn.values())
        # each source's due after this block, by largest remainder: counts stay within
        # one of the weights' shares
        exact = {n: (done + BLOCK) * w / total for n, w in self.weights.items()}
        due = {n: math.floor(x) for n, x in exact.items()}
        short = done + BLOCK - sum(due.values())
        for name in sorted(exact, key=lambda n: (due[n] - exact[n], n))[:short]:
            due[name] += 1
        block = [n for n in self.weights for _ in range(max(0, due[n] - self.drawn[n]))]
        self.rng.shuffle(block)
        return block

    def state(self) -> dict[str, Any]:
        """The position, as plain data."""
        version, internal, gauss = self.rng.getstate()
        return {
            "weights": dict(self.weights),
            "block": list(self.block),
            "drawn": dict(self.drawn),
            "count": self.count,
            "rng": [version, list(internal), gauss],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go back to a :meth:`state`."""
        # in this mix's order, not the state's: a checkpoint may have sorted its keys, and
        # a block is made in the order of the weights
        self.weights = {
            n: float(state["weights"][n]) for n in self.weights if n in state["weights"]
        }
        self.block = [str(n) for n in state["block"]]
        self.drawn = {n: int(state["drawn"][n]) for n in self.weights}
        self.count = int(state["count"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def mixed(draws: MixDraws, take: Callable[[str], T | None]) -> Iterator[tuple[str, T]]:
    """``(source, item)`` in the draws' order until every source ran out.

    ``take(name)`` gives source ``name``'s next item, or ``None`` once it has run out
    (that draw is void, and the source dropped).
    """
    while draws.weights:  # a source is left
        name = draws.next()
        item = take(name)
        if item is None:
            draws.exhausted(name)
            continue
        yield name, item
