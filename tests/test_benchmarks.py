"""Smoke test of the side-by-side benchmark: ``benchmarks/run.py --quick`` runs, all correct.

Not a timing test: it checks that every row (ours, the peers, the limits) runs on tiny
data in its own process and delivers every sample exactly once, and that the report is
written. The ``torchdata09`` rows need a venv of their own; the first run makes it
(``benchmarks/.venv-td09``, about a minute), later runs reuse it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_run_is_correct_on_every_row(tmp_path: Path) -> None:
    out = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick"]
    cmd += ["--data", str(tmp_path / "data"), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=880, check=False)
    assert done.returncode == 0, done.stderr[-3000:]

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from run import ROWS, WORKERS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    report = json.loads((out / "latest.json").read_text())
    expected = {(k, str(w), name) for name, kinds, _ in ROWS for k in kinds for w in WORKERS}
    got = {
        (kind, workers, name): row
        for kind, by_workers in report["table"].items()
        for workers, rows in by_workers.items()
        for name, row in rows.items()
    }
    assert set(got) == expected
    for (kind, _, name), row in got.items():
        assert row.get("correct") == "yes", (kind, name, row)
        assert row["samples"] == row["copies"] * report["counts"][kind], (kind, name)
        assert row["median"] > 0
    text = (out / "latest.md").read_text()
    assert "| shardpipes | 2 |" in text and "### Targets" in text
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
