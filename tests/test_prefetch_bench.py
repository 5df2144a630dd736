"""``benchmarks/prefetch.py --quick`` runs, every row sees every sample, and it writes its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run(tmp_path: Path) -> None:
    out = tmp_path / "prefetch"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "prefetch.py"), "--quick", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["rows"]) == {"load only", "no prefetch", "prefetch_items(2)"}
    assert {row["samples"] for row in result["rows"].values()} == {64}
    assert "| prefetch_items(2) |" in out.with_suffix(".md").read_text()
