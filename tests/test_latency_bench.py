"""Smoke test of the latency benchmark: ``benchmarks/latency.py --quick`` runs, all correct.

Not a timing test: on tiny data behind the shaping proxy, every row (shardpipes over HTTP
and S3, webdataset over HTTP) runs in its own process and delivers every sample exactly
once, and the report is written. The benchmark runs in a session of its own, killed as a
group at the end, so that no server it started can outlive it (and hold a pipe open).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("shardpipes_http", "shardpipes_s3", "webdataset_http")


def run_in_session(cmd: list[str], log: Path, timeout: float) -> int:
    """Run ``cmd`` in a session of its own, stderr to ``log``; kill what is left of it after."""
    with log.open("w") as stderr:  # a file, not a pipe: nothing left running can block it
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
        try:
            return proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_run_delivers_every_sample_once(tmp_path: Path) -> None:
    """Each row of the quick run delivers every sample exactly once; JSON and Markdown written."""
    out, log = tmp_path / "latency", tmp_path / "stderr.txt"
    script = ROOT / "benchmarks" / "latency.py"
    argv = ["--quick", "--data", str(tmp_path / "data"), "--out", str(out)]
    assert run_in_session([sys.executable, str(script), *argv], log, timeout=100) == 0, (
        log.read_text()[-3000:]
    )

    report = json.loads(Path(f"{out}.json").read_text())
    count = report["data"]["count"]
    [cell] = report["table"].values()
    assert set(cell) == {*ROWS, "ideal"}
    for row in ROWS:
        assert cell[row]["exactly_once"] is True, (row, cell[row])
        assert cell[row]["samples"] == count, row
        assert cell[row]["connections"] >= 1, row
    assert {c["connections"] for c in report["proxy_check"]} == {1, 2}
    assert "| 20ms/100MB | 2 | `shardpipes_http` |" in Path(f"{out}.md").read_text()
