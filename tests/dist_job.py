"""One rank of the torchrun job in ``test_distributed.py``: read every case, write what it saw.

Run as ``torchrun --nproc_per_node=N tests/dist_job.py CASES.json OUT_DIR``. Each case names
a recipe and its options, a DataLoader ``num_workers`` (``None``: iterate the pipe with no
DataLoader), epochs, and maybe ``resumable`` (``sp.Resumable`` under a StatefulDataLoader,
its workers started by ``context``); the rank writes ``OUT_DIR/rank{r}.json`` with, per
case and epoch, the labels (sample ids) it saw in order and its number of batches.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from tests.torchrun import arm_stack_dump


def labels_of(batch: Any) -> list[int]:
    """The labels (unique sample ids here) of a batch or of one sample: the second field."""
    label = batch[1]
    return label.tolist() if isinstance(label, torch.Tensor) else [label]


def loader(pipe: Any, case: dict[str, Any]) -> Any:
    """The case's loader: none, a DataLoader, or a StatefulDataLoader over ``Resumable``."""
    workers = case["num_workers"]
    if workers is None:
        return pipe
    if case.get("resumable"):
        context = case.get("context")
        return StatefulDataLoader(
            pipe, batch_size=None, num_workers=workers, multiprocessing_context=context
        )
    return DataLoader(pipe, batch_size=None, num_workers=workers)


def run_case(case: dict[str, Any]) -> list[dict[str, Any]]:
    pipe = sp.recipes.load(case["recipe"], **case["options"])
    if case.get("resumable"):
        pipe = sp.Resumable(pipe)
    epochs = []
    for epoch in range(case.get("epochs", 1)):
        pipe.set_epoch(epoch)
        batches = loader(pipe, case)
        seen, count = [], 0
        for batch in batches:
            seen += labels_of(batch)
            count += 1
        epochs.append({"keys": seen, "batches": count})
    return epochs


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(1)
    arm_stack_dump()
    # a rank that fails leaves the other in a collective: fail it too, before the test's deadline
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "cases": {name: run_case(case) for name, case in cases.items()},
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
