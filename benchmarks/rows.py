"""One benchmark row in this process: ``python benchmarks/rows.py ROW --kind K --workers W``.

Prints one JSON object: samples, seconds, rate, first-batch latency, peak RSS of the main
process and of the DataLoader workers, and whether every sample came exactly once.
``run.py`` starts each row in a fresh process of its own (the ``torchdata09`` rows in a
venv of their own) and aggregates the repeats.

A loader row is a function ``(data, kind, workers) -> iterable of (payload, labels)``
batches; ``payload`` is a uint8 ``(B, 3, 224, 224)`` tensor for ``images`` and the
samples' bytes for ``small``; ``labels`` the sample indices. A limit row measures
itself and returns ``{"samples", "seconds", "labels"}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if __name__ == "__main__":  # the row modules register into this module, not a second copy
    sys.modules.setdefault("rows", sys.modules[__name__])

import data as bench_data  # noqa: E402

BATCH = 64
RESIZE, CROP = 256, 224

Loader = Callable[[dict[str, Any], str, int], Iterable[Any]]
LOADERS: dict[str, tuple[tuple[str, ...], Loader]] = {}
# rows that read the data set several times over in one epoch (their URL list repeated)
COPIES: dict[str, int] = {}
LIMITS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any], str, int], dict[str, Any]]]] = {}


def loader(name: str, kinds: tuple[str, ...] = ("images", "small")) -> Callable[[Loader], Loader]:
    """Register a loader row."""

    def register(fn: Loader) -> Loader:
        LOADERS[name] = (kinds, fn)
        return fn

    return register


def limit(name: str, kinds: tuple[str, ...] = ("images", "small")) -> Callable[[Any], Any]:
    """Register a limit row (it measures itself)."""

    def register(fn: Any) -> Any:
        LIMITS[name] = (kinds, fn)
        return fn

    return register


def peer_transform(image: Any) -> Any:
    """What the peers' users write (torchvision's Resize(256), CenterCrop(224), PILToTensor).

    Written with Pillow and numpy, as torchvision does for PIL images, because
    torchvision does not import beside this torch build.
    """
    import numpy as np
    import torch

    image = image.convert("RGB")
    width, height = image.size  # torchvision's size rule: the longer side is truncated
    if width <= height:
        size = (RESIZE, int(RESIZE * height / width))
    else:
        size = (int(RESIZE * width / height), RESIZE)
    image = image.resize(size, resample=2)  # BILINEAR, antialiased as torchvision's
    left, top = round((size[0] - CROP) / 2), round((size[1] - CROP) / 2)
    image = image.crop((left, top, left + CROP, top + CROP))
    return torch.from_numpy(np.array(image, copy=True)).permute(2, 0, 1)


def _labels(labels: Any) -> list[int]:
    if hasattr(labels, "tolist"):
        labels = labels.tolist()
    return [int(v) for v in labels]


def _check_payload(kind: str, payload: Any, n: int) -> None:
    if kind == "images":
        shape, dtype = tuple(payload.shape), str(payload.dtype)
        if shape != (n, 3, CROP, CROP) or dtype != "torch.uint8":
            msg = f"images batch is {shape} {dtype}, not ({n}, 3, {CROP}, {CROP}) uint8"
            raise AssertionError(msg)
    elif len(payload) != n or len(payload[0]) != 1024:
        msg = f"small batch has {len(payload)} payloads of {len(payload[0])} bytes"
        raise AssertionError(msg)


def measure_loader(fn: Loader, layout: dict[str, Any], kind: str, workers: int) -> dict[str, Any]:
    """Iterate a loader row once, timing it from construction to the last batch."""
    start = time.perf_counter()
    first = None
    labels: list[int] = []
    for payload, batch_labels in fn(layout, kind, workers):
        got = _labels(batch_labels)
        if first is None:
            first = time.perf_counter() - start
            _check_payload(kind, payload, len(got))
        labels.extend(got)
    return {"seconds": time.perf_counter() - start, "first_batch_s": first, "labels": labels}


def correctness(labels: list[int], count: int, copies: int = 1) -> str:
    """``"yes"`` when ``labels`` is ``range(count)``, each ``copies`` times; else what is wrong."""
    seen = Counter(labels)
    dups = sum(n - copies for n in seen.values() if n > copies)
    missing = sum(copies - seen[i] for i in range(count) if seen[i] < copies)
    extra = sum(1 for v in seen if not 0 <= v < count)
    if not (dups or missing or extra):
        return "yes"
    return f"no ({dups} duplicated, {missing} missing, {extra} unknown)"


def _rss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row")
    parser.add_argument("--kind", choices=("images", "small"), required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # as DataLoader workers do; see the README's pitfalls
    if args.row.startswith("shardpipes"):
        import ours  # noqa: F401  (registers our rows)
    else:
        import peers  # noqa: F401  (registers the peer rows; torchdata09 runs in its own venv)

    layout = bench_data.layout(args.data)
    count = layout["counts"][args.kind]
    result: dict[str, Any] = {"row": args.row, "kind": args.kind, "workers": args.workers}
    try:
        if args.row in LOADERS:
            out = measure_loader(LOADERS[args.row][1], layout, args.kind, args.workers)
        else:
            out = LIMITS[args.row][1](layout, args.kind, args.workers)
        labels = out.pop("labels")
        copies = COPIES.get(args.row, 1)
        result.update(out)
        result["samples"], result["copies"] = len(labels), copies
        result["rate"] = len(labels) / out["seconds"]
        result["correct"] = correctness(labels, count, copies)
    except Exception as exc:  # reported in the table, not fatal to the run
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    result["rss_main_mb"] = round(_rss_mb(resource.RUSAGE_SELF), 1)
    result["rss_worker_mb"] = round(_rss_mb(resource.RUSAGE_CHILDREN), 1) if args.workers else None
    result["python"] = sys.executable
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
