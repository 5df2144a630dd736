"""Under the trainers users run: PyTorch Lightning's ``Trainer.fit`` and accelerate.

Each job (``tests/trainer_job.py``) runs in a process of its own, as a user's script does:
240 samples in 6 shards, a ``StatefulDataLoader`` with 2 workers over ``tar_shards(...,
seed=3, batch_size=8)``. A run stopped mid-epoch and resumed from its checkpoint must train
on exactly the batches the uninterrupted run trained on after that point, in its order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardpipes as sp
from tests.conftest import write_tar
from tests.torchrun import accelerate_launch, torchrun

JOB = Path(__file__).with_name("trainer_job.py")
SAMPLES, PER_SHARD = 240, 40

pytestmark = pytest.mark.slow


def write_shards(folder: Path, *, index: bool, gzip: bool = False) -> str:
    """240 samples, each one's ``bin`` its number, in 6 shards written in class order."""
    folder.mkdir()
    if gzip:  # as tar -z writes them
        for s in range(SAMPLES // PER_SHARD):
            members = []
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                members += [(f"{i:04d}.bin", str(i).encode()), (f"{i:04d}.cls", b"%d" % (i // 24))]
            write_tar(str(folder / f"train-{s:02d}.tar.gz"), members)
        return str(folder)
    with sp.ShardWriter(str(folder / "train-%02d.tar"), maxcount=PER_SHARD, index=index) as w:
        for i in range(SAMPLES):
            w.write({"__key__": f"{i:04d}", "bin": str(i).encode(), "cls": i * 10 // SAMPLES})
    return str(folder)


def batches(out: Path, rank: int = 0) -> list[list[int]]:
    return json.loads((out / f"rank{rank}.json").read_text())


def job(*args: str, launch: bool = False) -> str:
    """Run the job (under ``accelerate launch``, 2 processes); its stderr."""
    done = accelerate_launch(JOB, args) if launch else torchrun(JOB, args, ranks=None)
    assert done.returncode == 0, done.stderr[-6000:]
    return done.stderr


@pytest.mark.parametrize("index", [False, True], ids=["no-sidecars", "sidecars"])
def test_lightning_resumes_a_checkpoint_mid_epoch_exactly(tmp_path: Path, index: bool) -> None:
    """``fit(ckpt_path=)`` from the step-10 checkpoint trains on the rest, nothing lost.

    Lightning fetches a batch ahead of a loader without ``len()``, and the loader's state
    it saves counts that batch: local shards have a ``len()`` with or without sidecars.
    """
    shards = write_shards(tmp_path / "shards", index=index)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    job("lightning", shards, str(full))
    everything = batches(full)
    assert sorted(n for batch in everything for n in batch) == list(range(SAMPLES))
    assert len(everything) == SAMPLES // 8
    checkpoint = full / "ckpt" / "epoch=0-step=10.ckpt"
    job("lightning", shards, str(resumed), "--resume", str(checkpoint))
    assert batches(resumed) == everything[10:]


def test_lightning_warns_where_a_loader_has_no_length(tmp_path: Path) -> None:
    """Gzip shards without sidecars have no cheap count: the checkpoint's batch is named."""
    shards = write_shards(tmp_path / "shards", index=False, gzip=True)
    err = job("lightning", shards, str(tmp_path / "full"))
    assert "PyTorch Lightning fetches a batch ahead of a loader without len()" in err
    assert "shardpipes index URL" in err


def test_accelerate_save_and_load_state_mid_epoch_exactly_once(tmp_path: Path) -> None:
    """2 processes: ``save_state`` at step 4, ``load_state`` in a new job, nothing twice."""
    shards = write_shards(tmp_path / "shards", index=False)
    full, first, resumed = tmp_path / "full", tmp_path / "first", tmp_path / "resumed"
    job("accelerate", shards, str(full), launch=True)
    job("accelerate", shards, str(first), "--stop", "4", launch=True)
    job("accelerate", shards, str(resumed), "--resume", str(first / "ckpt"), launch=True)
    whole = [batches(full, rank) for rank in range(2)]
    assert len(whole[0]) == len(whole[1]), "even=True: as many batches on each rank"
    numbers = sorted(n for rank in whole for batch in rank for n in batch)
    assert numbers == list(range(SAMPLES)), "every sample once across the processes"
    for rank in range(2):
        before, after = batches(first, rank), batches(resumed, rank)
        assert len(before) == 4
        assert before + after == whole[rank], f"rank {rank}: before + after = uninterrupted"


def test_accelerate_prepare_of_the_loader_is_refused_naming_the_way(tmp_path: Path) -> None:
    """``prepare(loader)`` would deal the batches out again: refused, not half the data."""
    shards = write_shards(tmp_path / "shards", index=True)
    script = tmp_path / "prepared.py"
    script.write_text(
        "from accelerate import Accelerator\n"
        "from tests.trainer_job import make_loader\n"
        f"Accelerator(cpu=True).prepare(make_loader({shards!r}))\n"
    )
    done = accelerate_launch(script)
    assert done.returncode != 0
    assert "Prepare the model and optimizer, not the loader" in done.stderr
