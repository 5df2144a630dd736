"""The splitter at internet scale, simulated: ``python benchmarks/split_sim.py [--json]``.

Evaluates :func:`shardpipes.split_plan` for every worker of every rank of two jobs — 1,024
ranks × 8 DataLoader workers over 100,000 shards, and 8 ranks × 8 workers over 3 indexed
shards — in the default split and the even split, then checks that every sample is read
exactly once (the even split: all but the last ``N % workers``), reports the balance
(max − min samples per worker) and how long one worker takes to compute its plan (cold:
what each worker pays at the start of an epoch). Shard sizes are drawn from a fixed seed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from shardpipes._core.split import SplitPlanner, part_samples, split_plan

JOBS = {
    "1024x8 over 100,000 shards": {"world_size": 1024, "num_workers": 8, "shards": 100_000},
    "8x8 over 3 indexed shards": {"world_size": 8, "num_workers": 8, "shards": 3},
}


def shard_sizes(n: int, seed: int = 0) -> list[int]:
    """Samples per shard: about 1,000 each for many shards, about 10,000 for a few."""
    rng = random.Random(seed)
    mean = 1_000 if n > 100 else 10_000
    return [rng.randint(mean * 8 // 10, mean * 12 // 10) for _ in range(n)]


def coverage(
    plans: list[list[Any]], sizes: dict[str, int]
) -> tuple[dict[str, list[tuple[int, int]]], list[int]]:
    """Each shard's sample intervals over all workers, and each worker's sample count."""
    intervals: dict[str, list[tuple[int, int]]] = defaultdict(list)
    loads = []
    for plan in plans:
        load = 0
        for part in plan:
            mine = part_samples(sizes[part.url], part)
            if mine:
                intervals[part.url].append((mine.start, mine.stop))
            load += len(mine)
        loads.append(load)
    return intervals, loads


def check_exactly_once(
    intervals: dict[str, list[tuple[int, int]]], sizes: dict[str, int], order: list[str], kept: int
) -> None:
    """Every sample of the first ``kept`` (in the epoch's shard order) once, no other."""
    left = kept
    for url in order:
        want = min(sizes[url], max(left, 0))
        left -= sizes[url]
        got = sorted(intervals.get(url, []))
        at = 0
        for start, stop in got:
            if start != at:
                msg = f"{url}: samples {min(start, at)}..{max(start, at)} read twice or never"
                raise AssertionError(msg)
            at = stop
        if at != want:
            msg = f"{url}: {at} samples read, {want} expected"
            raise AssertionError(msg)


def simulate(name: str, *, even: bool, seed: int = 0, epoch: int = 0) -> dict[str, Any]:
    job = JOBS[name]
    world_size, num_workers, n = job["world_size"], job["num_workers"], job["shards"]
    urls = [f"s3://bucket/train-{i:06d}.tar" for i in range(n)]
    counts = shard_sizes(n)
    sizes = dict(zip(urls, counts, strict=True))
    timings = []
    for rank in (0, world_size // 2, world_size - 1):  # cold, as each worker plans alone
        t0 = time.perf_counter()
        split_plan(
            urls, shuffle=True, seed=seed, epoch=epoch, world_size=world_size, rank=rank,
            num_workers=num_workers, worker_id=num_workers - 1, counts=counts if even else None,
        )  # fmt: skip
        timings.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    planner = SplitPlanner(
        urls, shuffle=True, seed=seed, epoch=epoch, counts=counts if even else None
    )
    plans = [
        planner.plan(world_size, rank, num_workers, worker_id)
        for rank in range(world_size)
        for worker_id in range(num_workers)
    ]
    every = time.perf_counter() - t0
    intervals, loads = coverage(plans, sizes)
    total, samples = world_size * num_workers, sum(counts)
    kept = samples - samples % total if even else samples
    check_exactly_once(intervals, sizes, [planner.url(i) for i in range(n)], kept)
    return {
        "job": name,
        "split": "even" if even else "default",
        "workers": total,
        "shards": n,
        "samples": samples,
        "read": sum(loads),
        "dropped": samples - sum(loads),
        "exactly_once": True,
        "samples_per_worker": {"min": min(loads), "max": max(loads)},
        "imbalance": max(loads) - min(loads),
        "plan_ms_one_worker": round(1e3 * statistics.median(timings), 2),
        "plan_s_all_workers": round(every, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = [simulate(name, even=even) for name in JOBS for even in (False, True)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| job | split | samples | dropped | per worker (min–max) | plan, one worker | all |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        load = r["samples_per_worker"]
        print(
            f"| {r['job']} | {r['split']} | {r['samples']:,} | {r['dropped']:,} "
            f"| {load['min']:,}–{load['max']:,} | {r['plan_ms_one_worker']} ms "
            f"| {r['plan_s_all_workers']} s |"
        )


if __name__ == "__main__":
    main()
