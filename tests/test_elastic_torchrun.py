"""Elastic resumption for real (issue 14 §3): a torchrun job stopped, resumed on another size.

A ``torchrun --nproc_per_node=2`` job (2 DataLoader workers per rank) is stopped mid-epoch;
one process with one worker resumes it from rank 0's state alone; and the other way round,
one process with 2 workers is stopped and a 2-rank job resumes it. Every sample of the
epoch is seen exactly once, apart from fewer than (old + new workers) left out.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Dataset
from tests.torchrun import torchrun

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("elastic_job.py")
SIZES = [37, 52, 18, 44, 29, 61, 33, 40]  # 314 samples, keys in shard (class) order


def run(spec: dict[str, Any], out: Path, ranks: int | None) -> list[list[str]]:
    """Run the job on ``ranks`` torchrun ranks (None: plain python); each rank's keys."""
    out.mkdir()
    path = out / "spec.json"
    path.write_text(json.dumps({**spec, "out": str(out)}))
    done = torchrun(SCRIPT, [str(path)], ranks=ranks)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"keys{r}.json").read_text()) for r in range(ranks or 1)]


@pytest.mark.parametrize(("old", "new"), [((2, 2), (None, 1)), ((None, 2), (2, 1))])
def test_a_stopped_job_resumes_on_another_size(
    make_shards: Callable[..., Dataset],
    tmp_path: Path,
    old: tuple[int | None, int],
    new: tuple[int | None, int],
) -> None:
    data = make_shards(len(SIZES), SIZES)
    (old_ranks, old_workers), (new_ranks, new_workers) = old, new
    before = run(
        {"urls": data.urls, "num_workers": old_workers, "stop_after": 9}, tmp_path / "a", old_ranks
    )
    assert {len(keys) for keys in before} == {36}  # 9 batches of 4 on every rank
    state = tmp_path / "a" / "state0.pt"  # rank 0's alone
    after = run({"urls": data.urls, "num_workers": new_workers, "resume": str(state)},
                tmp_path / "b", new_ranks)  # fmt: skip
    seen = Counter(key for keys in before + after for key in keys)
    assert [key for key, n in seen.items() if n > 1] == []
    total_workers = (old_ranks or 1) * old_workers + (new_ranks or 1) * new_workers
    assert 0 <= len(data.keys) - len(seen) < total_workers
    assert len({len(keys) for keys in after}) == 1  # the new ranks deliver as many
