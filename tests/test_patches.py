"""``shardpipes._patches``: the changes made to torch and torchdata, per version."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardpipes._patches import version


def test_version_reads_installed_packages() -> None:
    import torch

    assert version("torch")[:2] == tuple(int(x) for x in torch.__version__.split(".")[:2])
    assert version("no-such-package-here") == ()


@pytest.mark.slow
def test_stateful_dataloader_warns_no_set_vital() -> None:
    """No set_vital warning: torchdata 0.11 gave one on every loader (issue 24 §8)."""
    code = (
        "import warnings; warnings.simplefilter('default')\n"
        "{imports}\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader\n"
        "StatefulDataLoader([1, 2, 3])\n"
    )
    runs = {}
    for name, imports in (("plain", "import torch"), ("shardpipes", "import shardpipes")):
        done = subprocess.run(
            [sys.executable, "-c", code.format(imports=imports)],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        runs[name] = done.stderr
    if version("torchdata")[:2] == (0, 11):
        assert "set_vital" in runs["plain"]  # the warning is there to silence
    assert "set_vital" not in runs["shardpipes"]
