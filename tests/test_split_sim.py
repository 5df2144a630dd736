"""The splitter simulation of ``benchmarks/split_sim.py``: 1,024 ranks × 8 workers, and 3 shards."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shardpipes._core.split import ShardPart


def load_sim() -> ModuleType:
    path = Path(__file__).parent.parent / "benchmarks" / "split_sim.py"
    spec = importlib.util.spec_from_file_location("split_sim", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["split_sim"] = module
    spec.loader.exec_module(module)
    return module


sim = load_sim()


@pytest.mark.parametrize("even", [False, True])
@pytest.mark.parametrize("job", list(sim.JOBS))
def test_simulated_jobs_read_every_sample_once(job: str, even: bool) -> None:
    """Every worker of every rank plans alone; together: exactly once, balanced."""
    row = sim.simulate(job, even=even)  # raises AssertionError on a sample read twice/never
    n, workers = row["shards"], row["workers"]
    sizes = sim.shard_sizes(n)
    assert row["exactly_once"]
    if even:
        assert row["imbalance"] == 0
        assert row["dropped"] == row["samples"] % workers < workers
    elif n >= workers:  # whole shards: a worker's shard count differs by at most one
        assert row["dropped"] == 0
        assert row["samples_per_worker"]["max"] <= -(-n // workers) * max(sizes)
        assert row["samples_per_worker"]["min"] >= n // workers * min(sizes)
    else:  # shared shards: blocks of one shard differ by one; shards have 21 or 22 readers
        assert row["dropped"] == 0
        assert row["samples_per_worker"]["max"] <= max(sizes) // (workers // n) + 1
        assert row["samples_per_worker"]["min"] >= min(sizes) // -(-workers // n)


def test_the_check_catches_a_sample_read_twice() -> None:
    """The simulation's check is not a rubber stamp: a duplicated or missing part fails it."""
    sizes = {"a": 10, "b": 5}
    twice = [[ShardPart("a", 0, 2), ShardPart("b")], [ShardPart("a", 0, 2)]]
    intervals, _ = sim.coverage(twice, sizes)
    with pytest.raises(AssertionError, match="read twice or never"):
        sim.check_exactly_once(intervals, sizes, ["a", "b"], 15)
    missing = [[ShardPart("a", 0, 2)], [ShardPart("b")]]
    intervals, _ = sim.coverage(missing, sizes)
    with pytest.raises(AssertionError, match="5 samples read, 10 expected"):
        sim.check_exactly_once(intervals, sizes, ["a", "b"], 15)
