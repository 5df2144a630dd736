"""Does ``prefetch_items`` overlap loading with training? ``python benchmarks/prefetch.py``.

A training loop in one process (``num_workers=0``, where a DataLoader has nobody to load
ahead) over the benchmark's JPEG shards (``data.py``: 300-500 px, decoded and resized to
224, batches of 32), with a training step stood in for by ``time.sleep(step)`` (a GPU
step leaves the CPU and the GIL free while it runs). Rows, each timed over one epoch
after a warm-up epoch, best of ``--repeats``:

- ``load only``: the loop without a step (what loading costs);
- ``no prefetch``: loading and the step, one after the other;
- ``prefetch_items(2)``: the same pipeline with two batches made ahead in a thread.

A perfect overlap takes ``max(load, steps)``; no overlap ``load + steps``. The step is
set to the measured loading time per batch (``--step auto``), where overlap matters
most. Writes ``results/prefetch.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import data as bench_data  # noqa: E402

BATCH = 32


def pipeline(shards: list[str], *, prefetch: bool) -> Any:
    """The recipe the rows read: shuffled shards, decoded and resized JPEG batches."""
    import shardpipes as sp

    pipe = sp.recipes.tar_shards(
        shards, seed=0, image="torch", resize=224, crop=224, batch_size=BATCH, buffer_size=64
    )
    return pipe.prefetch_items(2) if prefetch else pipe


def epoch(make: Callable[[], Any], step: float) -> tuple[float, int]:
    """Seconds for one epoch of the loop, and the samples it saw."""
    from torch.utils.data import DataLoader

    loader = DataLoader(make(), batch_size=None, num_workers=0)
    seen, start = 0, time.perf_counter()
    for _, labels in loader:
        seen += len(labels)
        if step:
            time.sleep(step)
    return time.perf_counter() - start, seen


def measure(shards: list[str], step: float | None, repeats: int) -> dict[str, Any]:
    """Each row's best epoch time (after a warm-up), and the samples each saw."""
    rows: dict[str, Any] = {}
    load = min(epoch(lambda: pipeline(shards, prefetch=False), 0)[0] for _ in range(repeats + 1))
    samples = epoch(lambda: pipeline(shards, prefetch=False), 0)[1]
    batches = -(-samples // BATCH)
    step = load / batches if step is None else step
    rows["load only"] = {"seconds": load, "samples": samples}
    for name, prefetch in (("no prefetch", False), ("prefetch_items(2)", True)):
        times = []
        for _ in range(repeats):
            seconds, seen = epoch(lambda p=prefetch: pipeline(shards, prefetch=p), step)
            assert seen == samples, f"{name} saw {seen} samples of {samples}"
            times.append(seconds)
        rows[name] = {"seconds": min(times), "samples": samples}
    steps = step * batches
    return {
        "step_seconds": step,
        "batches": batches,
        "steps_seconds": steps,
        "ideal_seconds": max(load, steps),
        "serial_seconds": load + steps,
        "rows": rows,
    }


def report(result: dict[str, Any]) -> str:
    """A Markdown table of the rows."""
    lines = [
        f"One process, {result['batches']} batches of {BATCH}, a step of "
        f"{result['step_seconds'] * 1000:.1f} ms; no overlap takes "
        f"{result['serial_seconds']:.2f} s, a perfect one {result['ideal_seconds']:.2f} s.",
        "",
        "| row | seconds | of no overlap | of a perfect overlap |",
        "|---|---:|---:|---:|",
    ]
    for name, row in result["rows"].items():
        seconds = row["seconds"]
        lines.append(
            f"| {name} | {seconds:.2f} | {seconds / result['serial_seconds']:.2f} | "
            f"{seconds / result['ideal_seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 images, one repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step", default="auto", help="seconds per step, or auto")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "prefetch")
    args = parser.parse_args(argv)
    root = HERE / (".data-quick" if args.quick else ".data")
    layout = bench_data.ensure(root, quick=args.quick)
    step = None if args.step == "auto" else float(args.step)
    result = measure(layout["paths"]["image_shards"], step, 1 if args.quick else args.repeats)
    result["machine"] = {"python": platform.python_version(), "cpus": platform.machine()}
    table = report(result)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
