"""The shuffle-quality metrics of ``benchmarks/shuffle_quality.py`` mean what they say.

Not a run of the benchmark (it takes a minute): its scores on orders whose answer is
known — the written order scores lowest, an iid shuffle about 1 on both.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType


def load() -> ModuleType:
    path = Path(__file__).parent.parent / "benchmarks" / "shuffle_quality.py"
    spec = importlib.util.spec_from_file_location("shuffle_quality", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["shuffle_quality"] = module
    spec.loader.exec_module(module)
    return module


sq = load()


def test_scores_of_known_orders() -> None:
    total = sq.CLASSES * sq.SHARDS_PER_CLASS * sq.PER_SHARD
    written = [(i, i // (sq.SHARDS_PER_CLASS * sq.PER_SHARD)) for i in range(total)]
    entropy, spread = sq.scores(written)
    assert entropy < 0.1 and spread == 1 / total  # one class a batch; neighbours adjacent
    shuffled = written[:]
    random.Random(3).shuffle(shuffled)
    entropy, spread = sq.scores(shuffled)
    assert abs(entropy / sq.iid_entropy(rounds=20) - 1) < 0.02
    assert abs(spread / (1 / 3) - 1) < 0.05
