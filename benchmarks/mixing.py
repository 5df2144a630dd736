"""Weighted mixing, measured: ``python benchmarks/mixing.py`` (issue 14 §1).

Three sources of small samples (weights 5 : 3 : 2; 30,000, 18,000 and 12,000 samples in
shards of 1,000, by default), mixed by ``sp.mix`` and read by a ``DataLoader`` with 2 workers in
batches of 64. Reported:

- **shares**: over every window of 1,000 consecutive samples (the order the loader gives,
  starting every 100 samples, while every source still has samples), the largest
  difference between a source's share and its weight's (the issue's bound: 3 %);
- **cost**: samples per second of the mix against one ``open_tar`` chain over the same
  60,000 samples (one source), in the same process tree, medians of the repeats.

Writes ``results/mixing.{md,json}``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WEIGHTS = {"a": 5, "b": 3, "c": 2}
WINDOW, STEP, BATCH = 1000, 100, 64


def write_sources(root: Path, scale: int, per_shard: int) -> dict[str, list[str]]:
    """Shards of ``per_shard`` samples of 200 bytes and a ``.cls``: name -> paths."""
    sources = {}
    for name, weight in WEIGHTS.items():
        folder = root / name
        folder.mkdir(parents=True)
        paths, count = [], weight * 6 * scale
        for s in range(count):
            path = folder / f"train-{s:06d}.tar"
            with tarfile.open(path, "w") as tar:
                for i in range(per_shard):
                    for ext, data in (("bin", os.urandom(200)), ("cls", str(i % 10).encode())):
                        info = tarfile.TarInfo(f"{name}{s:04d}-{i:04d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            paths.append(str(path))
        sources[name] = paths
    return sources


def chain(paths: list[str], seed: int) -> Any:
    import shardpipes as sp

    return (
        sp.list_shards(paths)
        .split_shards(shuffle=True, seed=seed)
        .open_tar()
        .shuffle_samples(buffer_size=1000)
    )


def run_mix(sources: dict[str, list[str]]) -> tuple[list[str], set[str], float]:
    from torch.utils.data import DataLoader

    import shardpipes as sp

    pipe = sp.mix(
        {name: chain(paths, i) for i, (name, paths) in enumerate(sources.items())},
        weights=WEIGHTS,
        seed=17,
    ).batch(BATCH)
    start, names, keys = time.perf_counter(), [], set()
    for batch in DataLoader(pipe, batch_size=None, num_workers=2):
        names += [sample["__source__"] for sample in batch]
        keys.update(sample["__key__"] for sample in batch)
    return names, keys, time.perf_counter() - start


def run_single(paths: list[str]) -> tuple[int, float]:
    from torch.utils.data import DataLoader

    pipe = chain(paths, 0).batch(BATCH)
    start, count = time.perf_counter(), 0
    for batch in DataLoader(pipe, batch_size=None, num_workers=2):
        count += len(batch)
    return count, time.perf_counter() - start


def worst_window(names: list[str]) -> dict[str, float]:
    """Each source's largest share error over the windows where every source is left."""
    total = sum(WEIGHTS.values())
    last = min(max(i for i, n in enumerate(names) if n == name) for name in WEIGHTS)
    worst = dict.fromkeys(WEIGHTS, 0.0)
    for start in range(0, last - WINDOW + 1, STEP):
        window = names[start : start + WINDOW]
        for name, weight in WEIGHTS.items():
            error = abs(window.count(name) / WINDOW - weight / total)
            worst[name] = max(worst[name], error)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=int, default=1, help="shards × this")
    parser.add_argument("--per-shard", type=int, default=1000, help="samples per shard")
    parser.add_argument("--out", default=str(HERE / "results" / "mixing"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sources = write_sources(Path(tmp), args.scale, args.per_shard)
        everything = [p for paths in sources.values() for p in paths]
        mixes, singles, names, keys = [], [], [], set()
        for _ in range(args.repeats):
            names, keys, seconds = run_mix(sources)
            mixes.append(len(names) / seconds)
            count, seconds = run_single(everything)
            singles.append(count / seconds)
    expected = sum(len(p) for p in sources.values()) * args.per_shard
    worst = worst_window(names)
    result = {
        "samples": len(names),
        "exactly_once": len(names) == len(keys) == expected,
        "worst_share_error": worst,
        "mix_samples_per_s": statistics.median(mixes),
        "single_samples_per_s": statistics.median(singles),
        "repeats": args.repeats,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=2))
    lines = [
        f"{len(names):,} samples of 3 sources (weights 5 : 3 : 2), 2 workers, batches of "
        f"{BATCH}; {args.repeats} repeats on {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}.",
        "",
        "| source | weight's share | worst share over windows of 1,000 (error) |",
        "|---|---:|---:|",
    ]
    total = sum(WEIGHTS.values())
    for name, weight in WEIGHTS.items():
        lines.append(f"| {name} | {weight / total:.3f} | ±{worst[name] * 100:.2f} % |")
    ratio = result["mix_samples_per_s"] / result["single_samples_per_s"]
    lines += [
        "",
        "| reader | samples/s (median) |",
        "|---|---:|",
        f"| `sp.mix` of the 3 sources | {result['mix_samples_per_s']:,.0f} |",
        f"| one `open_tar` chain over all the shards | {result['single_samples_per_s']:,.0f} |",
        f"| ratio | {ratio:.2f} |",
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not result["exactly_once"]:
        sys.exit(f"expected {expected} samples once each, got {len(names)} ({len(keys)} keys)")


if __name__ == "__main__":
    main()
