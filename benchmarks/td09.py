"""A venv of its own for the ``torchdata09`` rows: ``python benchmarks/td09.py [--path P]``.

torchdata 0.9 (the last release with DataPipes) and 0.11 (what the project's venv has)
cannot share a venv, so the ``torchdata09`` rows run ``rows.py`` with this venv's Python.
``ensure_venv`` makes it once and reuses it while its stamp matches and it still imports;
it prints, and returns, the venv's Python.

torch is pinned to 2.13.0, the CPU build on this machine's disk (an unpinned torch would
pull a CUDA build of several GB); Pillow and NumPy to the versions of the Python that calls
``ensure_venv``, so both sides of the table decode JPEGs with the same Pillow.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE / ".venv-td09"
STAMP = "shardpipes-td09.json"
CHECK = "import torch, torchdata, PIL, numpy; from torchdata.datapipes.iter import FileOpener"


def requirements() -> list[str]:
    """The pins of the td09 venv."""
    return [
        "torch==2.13.0",
        "torchdata==0.9.0",
        f"pillow=={metadata.version('pillow')}",
        f"numpy=={metadata.version('numpy')}",
    ]


def _imports(python: Path) -> bool:
    done = subprocess.run(
        [str(python), "-W", "ignore", "-c", CHECK], capture_output=True, check=False
    )
    return done.returncode == 0


def ensure_venv(path: Path = DEFAULT) -> Path:
    """Make (or reuse) the torchdata 0.9 venv at ``path``; return its Python executable.

    Idempotent: a venv whose stamp lists the same pins and that still imports torch,
    torchdata's DataPipes, Pillow and NumPy is reused as it is. Otherwise it is made
    anew with ``python -m venv --clear`` and ``pip install`` (about a minute, offline
    for torch, whose CPU wheel is on this machine's disk).

    Raises:
        RuntimeError: when pip fails, or the new venv does not import.
    """
    python = path / "bin" / "python"
    stamp = path / STAMP
    pins = requirements()
    reusable = python.exists() and stamp.exists() and json.loads(stamp.read_text()) == pins
    if reusable and _imports(python):
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run([*pip, *pins], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        msg = f"{path}: pip install {' '.join(pins)} failed:\n{done.stderr[-4000:]}"
        raise RuntimeError(msg)
    if not _imports(python):
        msg = f"{path}: the new venv does not import torchdata 0.9's DataPipes ({CHECK!r})"
        raise RuntimeError(msg)
    stamp.write_text(json.dumps(pins))  # last: a half-made venv is never reused
    return python


def main(argv: list[str] | None = None) -> int:
    """Make or reuse the venv and print its Python."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=DEFAULT)
    args = parser.parse_args(argv)
    print(ensure_venv(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
