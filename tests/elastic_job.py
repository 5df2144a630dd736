"""A job of ``test_elastic_torchrun.py``: stop an epoch part way, or resume it from a state.

Run as ``python tests/elastic_job.py SPEC.json`` or under ``torchrun``. The spec names the
shards, the DataLoader's ``num_workers``, and either ``"stop_after"`` (batches read before
the rank saves ``state{rank}.pt`` with ``torch.save``) or ``"resume"`` (the state file to
resume from, with ``sp.resume_from``). Each rank writes the keys it saw to ``keys{rank}.json``.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from tests.torchrun import arm_stack_dump


def main() -> None:
    spec: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    torch.set_num_threads(1)
    arm_stack_dump()
    distributed = "RANK" in __import__("os").environ
    if distributed:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank() if distributed else 0
    pipe = sp.recipes.tar_shards(
        spec["urls"], fields=("__key__",), seed=7, buffer_size=16, even=True
    )
    if "resume" in spec:
        pipe = sp.resume_from(pipe, torch.load(spec["resume"], weights_only=False))
    loader = StatefulDataLoader(pipe, batch_size=4, num_workers=spec["num_workers"])
    keys: list[str] = []
    for step, batch in enumerate(loader, start=1):
        keys += batch[0]
        if step == spec.get("stop_after"):
            torch.save(loader.state_dict(), out / f"state{rank}.pt")
            break
    (out / f"keys{rank}.json").write_text(json.dumps(keys))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
