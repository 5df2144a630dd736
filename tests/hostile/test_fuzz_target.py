"""``make fuzz`` keeps working: its atheris target runs a few hundred mutations cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_fuzz_target_runs(tmp_path: Path) -> None:
    """500 inputs from the seeds (the corpus folder starts empty): no crash, exit 0."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "fuzz_tar.py"), "-runs=500", "-timeout=5", "-seed=1",
         str(corpus)],
        cwd=tmp_path, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Done 500 runs" in result.stderr
    assert len(list(corpus.iterdir())) >= 4  # the seeds, and what the run added
    assert not list(tmp_path.glob("crash-*"))
