"""Smoke test of ``benchmarks/mixing.py``: it runs on small data, every sample once.

Not a timing test: the report is written, every sample came exactly once, and the shares
over windows of 1,000 stayed within the issue's 3 % (a property of the draws, not of speed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_small_run(tmp_path: Path) -> None:
    out = tmp_path / "mixing"
    argv = ["--repeats", "1", "--per-shard", "100", "--out", str(out)]
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mixing.py"), *argv],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    report = json.loads(Path(f"{out}.json").read_text())
    assert report["exactly_once"] is True and report["samples"] == 6000
    assert max(report["worst_share_error"].values()) <= 0.03
    assert "| `sp.mix` of the 3 sources |" in Path(f"{out}.md").read_text()
