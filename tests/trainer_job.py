"""A training job under PyTorch Lightning or Hugging Face accelerate, as a user writes one.

Run by ``tests/test_trainers.py`` in a process of its own (``python``, or ``accelerate
launch`` for two processes): it trains a one-weight model on batches of
``tar_shards(urls, fields=("bin", "cls"), image="bytes", seed=3, batch_size=8)`` in a
``StatefulDataLoader`` with 2 workers, and writes the sample numbers of every batch it
trained on, in order, to ``OUT/rank<R>.json``. Each sample's ``bin`` member is its number.

    python tests/trainer_job.py lightning SHARDS OUT [--resume CKPT]
    accelerate launch ... tests/trainer_job.py accelerate SHARDS OUT [--stop N] [--resume DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp


def make_loader(shards: str, *, even: bool = False) -> StatefulDataLoader:
    urls = sorted(url for url in glob.glob(f"{shards}/*") if url.endswith((".tar", ".tar.gz")))
    pipe = sp.recipes.tar_shards(
        urls, fields=("bin", "cls"), image="bytes", seed=3, batch_size=8, even=even
    )
    return StatefulDataLoader(pipe, batch_size=None, num_workers=2)


def numbers(batch: list[bytes]) -> list[int]:
    return [int(b) for b in batch]


def lightning(args: argparse.Namespace) -> None:
    import lightning as L  # noqa: N812 - Lightning's own name for it
    from lightning.pytorch.callbacks import ModelCheckpoint

    seen: list[list[int]] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Linear(1, 1)

        def training_step(
            self, batch: tuple[list[bytes], torch.Tensor], index: int
        ) -> torch.Tensor:
            data, labels = batch
            seen.append(numbers(data))
            return self.weight(labels.float()[:, None]).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    every = ModelCheckpoint(dirpath=args.out / "ckpt", every_n_train_steps=10, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, callbacks=[every], logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Model(), make_loader(args.shards), ckpt_path=args.resume)
    (args.out / "rank0.json").write_text(json.dumps(seen))


def accelerate(args: argparse.Namespace) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    loader = make_loader(args.shards, even=True)  # not prepared: shardpipes splits by rank
    rank, ckpt = accelerator.process_index, Path(args.resume or args.out / "ckpt")
    if args.resume:
        accelerator.load_state(ckpt)
        loader.load_state_dict(torch.load(ckpt / f"loader-{rank}.pt"))
    seen: list[list[int]] = []
    for step, (data, labels) in enumerate(loader, start=1):
        seen.append(numbers(data))
        loss = model(labels.float()[:, None]).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == args.stop:
            accelerator.save_state(ckpt)
            torch.save(loader.state_dict(), ckpt / f"loader-{rank}.pt")
            break  # the job stops here
    (args.out / f"rank{rank}.json").write_text(json.dumps(seen))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer", choices=["lightning", "accelerate"])
    parser.add_argument("shards")
    parser.add_argument("out", type=Path)
    parser.add_argument("--resume", help="the checkpoint (Lightning) or folder (accelerate)")
    parser.add_argument("--stop", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    {"lightning": lightning, "accelerate": accelerate}[args.trainer](args)


if __name__ == "__main__":
    main()
