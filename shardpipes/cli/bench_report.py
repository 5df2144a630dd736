"""What ``shardpipes bench`` measured (:class:`StageResult`) and how it is shown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardpipes._core.policy import Stats


@dataclass(frozen=True)
class StageResult:
    """What one stage of ``shardpipes bench`` did.

    Attributes:
        stage: ``"read"``, ``"tar"``, ``"decode"`` or ``"batch"``.
        seconds: Wall time from creating the ``DataLoader`` iterator to the last item.
        samples: Samples that reached the main process (``None`` for ``read``).
        nbytes: Shard bytes read (``read``) or member bytes (``tar``); else ``None``.
        first_seconds: Time to the first item (1 MiB for ``read``, a sample, or a batch).
        capped: Stopped early by ``max_samples``.
        ragged: Some batches held images of different sizes, left as lists.
        error: Why the stage failed (``batch`` only: a batch that cannot be collated).
        stats: What the stage's pipeline read and skipped (``shardpipes.Stats`` as a dict),
            summed over the workers; ``None`` for ``read``.
    """

    stage: str
    seconds: float
    samples: int | None = None
    nbytes: int | None = None
    first_seconds: float | None = None
    capped: bool = False
    ragged: bool = False
    error: str | None = None
    stats: dict[str, Any] | None = None

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second, or ``None`` where not counted."""
        return None if self.samples is None or self.seconds <= 0 else self.samples / self.seconds

    @property
    def mb_per_s(self) -> float | None:
        """Megabytes (10**6 bytes) per second, or ``None`` where not counted."""
        return (
            None if self.nbytes is None or self.seconds <= 0 else self.nbytes / self.seconds / 1e6
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the fields and both rates, for JSON."""
        return {**asdict(self), "samples_per_s": self.samples_per_s, "mb_per_s": self.mb_per_s}


def costs(results: Sequence[StageResult]) -> dict[str, float]:
    """Return the seconds per sample that each stage adds to the stages before it.

    A stage's cumulative cost is its wall time over its samples (``read`` is divided by
    the ``tar`` stage's samples: it reads the same shards, or about the same bytes); its
    own cost is how much that exceeds the highest cumulative cost before it. Failed
    stages are left out, and everything when the ``tar`` stage counted no samples.
    """
    tar = next((r for r in results if r.stage == "tar" and r.error is None), None)
    if tar is None or not tar.samples:
        return {}
    own, before = {}, 0.0
    for r in results:
        n = tar.samples if r.stage == "read" else r.samples
        if r.error is None and n:
            own[r.stage] = max(0.0, r.seconds / n - before)
            before = max(before, r.seconds / n)
    return own


def slowest(results: Sequence[StageResult]) -> str | None:
    """Return a line naming the stage that costs most per sample, or ``None``."""
    own = costs(results)
    total = sum(own.values())
    if total <= 0:
        return None
    stage = max(own, key=own.__getitem__)
    return (
        f"{stage} costs {own[stage] / total:.0%} of the time per sample "
        f"({own[stage] * 1e3:.3g} of {total * 1e3:.3g} ms)"
    )


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def format_table(results: Sequence[StageResult]) -> str:
    """Return the results as a table, with notes and the :func:`slowest` line."""
    lines = [f"{'stage':<8}{'samples':>10}{'seconds':>10}{'samples/s':>12}{'MB/s':>10}"
             f"{'first (s)':>11}"]  # fmt: skip
    for r in results:
        if r.error is not None:
            lines.append(f"{r.stage:<8}{'failed':>10}")
            continue
        lines.append(f"{r.stage:<8}{_cell(r.samples, ',', 10)}{r.seconds:>10.2f}"
                     f"{_cell(r.samples_per_s, ',.0f', 12)}{_cell(r.mb_per_s, '.1f', 10)}"
                     f"{_cell(r.first_seconds, '.2f', 11)}")  # fmt: skip
    if any(r.capped for r in results):
        lines.append("stopped early by max_samples (read: after about as many shard bytes)")
    if any(r.ragged for r in results):
        lines.append("batch: images of different sizes were kept as lists, not stacked")
    counted = [r for r in results if r.stats is not None]
    if counted:  # the last stage that read: what the data held
        lines.append(f"data: {Stats(**counted[-1].stats)}")  # type: ignore[arg-type]
    line = slowest(results)
    return "\n".join([*lines, line] if line else lines)


def to_json(results: Sequence[StageResult]) -> dict[str, Any]:
    """Return the results as a JSON-ready dict: ``stages`` and ``slowest``."""
    own = costs(results)
    stages = [{**r.to_dict(), "own_seconds_per_sample": own.get(r.stage)} for r in results]
    return {"stages": stages, "slowest": max(own, key=own.__getitem__) if own else None}
