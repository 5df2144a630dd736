"""How random is the order? ``python benchmarks/shuffle_quality.py`` (issue 14 §4).

Shards written in class order, as ``shardpipes write`` makes them from an ImageNet-style
folder: 10 classes, 2 shards each, 10,000 small samples (500 per shard). Each row reads
them with 2 DataLoader workers in batches of 64, over 2 epochs (seeds differ per epoch),
and is scored by two numbers, each as a fraction of what an iid shuffle of the same
samples gives (1.0: as random as a perfect shuffle):

- **class entropy**: the mean, over batches, of the Shannon entropy of the batch's class
  counts (bits); an iid shuffle's is computed by drawing 200 random permutations.
- **neighbour spread**: for samples written next to each other (``i`` and ``i + 1``), the
  mean distance between their delivered positions, as a fraction of the epoch; an iid
  shuffle's is 1/3. A shard shuffle alone moves every sample far from where it was
  written (so plain displacement says little), but keeps a shard's samples together,
  which this sees.

Rows: ``shardpipes`` (``tar_shards(..., buffer_size=B)``: shard order shuffled, a buffer of
``B`` samples per worker), ``shardpipes block_shuffle=16`` (every shard cut into blocks of
16 samples, dealt to the workers at random: see ``split_blocks``), and ``webdataset`` 1.0.2
(``WebDataset(urls, shardshuffle=100).shuffle(B)``), for ``B`` in 500, 1,000 and 5,000
(10 %, 20 % and 100 % of a worker's 5,000 samples). Memory: the buffer holds ``B``
undecoded samples per worker in every row; blocks add no buffer, one ranged read each.
Writes ``results/shuffle_quality.{md,json}``.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import math
import os
import platform
import random
import statistics
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLASSES, SHARDS_PER_CLASS, PER_SHARD = 10, 2, 500
BATCH, WORKERS, EPOCHS = 64, 2, 2


def write_class_ordered(root: Path) -> list[str]:
    """20 shards in class order (shard 2c and 2c+1 hold class c); sample i has key i."""
    paths, index = [], 0
    for shard in range(CLASSES * SHARDS_PER_CLASS):
        label = shard // SHARDS_PER_CLASS
        path = root / f"train-{shard:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for _ in range(PER_SHARD):
                for ext, data in (("bin", os.urandom(64)), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{index:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                index += 1
        paths.append(str(path))
    return paths


def entropy(labels: list[int]) -> float:
    counts = Counter(labels)
    n = len(labels)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def scores(order: list[tuple[int, int]]) -> tuple[float, float]:
    """(mean per-batch class entropy, neighbour spread) of a delivered ``(index, label)`` order."""
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    mean_entropy = statistics.fmean(entropy([label for _, label in b]) for b in batches)
    n = len(order)
    where = {index: pos for pos, (index, _) in enumerate(order)}
    spread = statistics.fmean(abs(where[i + 1] - where[i]) / n for i in range(n - 1))
    return mean_entropy, spread


def iid_entropy(rounds: int = 200) -> float:
    labels = [
        i // (SHARDS_PER_CLASS * PER_SHARD) for i in range(CLASSES * SHARDS_PER_CLASS * PER_SHARD)
    ]
    rng = random.Random(0)
    values = []
    for _ in range(rounds):
        rng.shuffle(labels)
        values.append(
            statistics.fmean(entropy(labels[i : i + BATCH]) for i in range(0, len(labels), BATCH))
        )
    return statistics.fmean(values)


def shardpipes_epochs(
    paths: list[str], buffer: int, blocks: int | None = None
) -> Iterator[list[tuple[int, int]]]:
    from torch.utils.data import DataLoader

    import shardpipes as sp

    pipe = sp.recipes.tar_shards(
        paths, fields=("__key__", "cls"), buffer_size=buffer, seed=7, batch_size=BATCH,
        block_shuffle=blocks,
    )  # fmt: skip
    loader = DataLoader(pipe, batch_size=None, num_workers=WORKERS)
    for _ in range(EPOCHS):
        order = []
        for keys, labels in loader:
            order += [(int(k), int(c)) for k, c in zip(keys, labels.tolist(), strict=True)]
        yield order


def webdataset_epochs(paths: list[str], buffer: int) -> Iterator[list[tuple[int, int]]]:
    import webdataset as wds
    from torch.utils.data import DataLoader

    dataset = (
        wds.WebDataset(paths, shardshuffle=100, seed=7)
        .shuffle(buffer)
        .to_tuple("__key__", "cls")
        .batched(BATCH)
    )
    loader = DataLoader(dataset, batch_size=None, num_workers=WORKERS)
    for _ in range(EPOCHS):
        order = []
        for keys, labels in loader:
            order += [(int(k), int(c)) for k, c in zip(keys, labels, strict=True)]
        yield order


ROWS: dict[str, Callable[[list[str], int], Iterator[list[tuple[int, int]]]]] = {
    "shardpipes": shardpipes_epochs,
    "shardpipes block_shuffle=16": functools.partial(shardpipes_epochs, blocks=16),
    "webdataset": webdataset_epochs,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffers", default="500,1000,5000")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--out", default=str(HERE / "results" / "shuffle_quality"))
    args = parser.parse_args()
    total = CLASSES * SHARDS_PER_CLASS * PER_SHARD
    iid = iid_entropy()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_class_ordered(Path(tmp))
        for buffer in map(int, args.buffers.split(",")):
            for row in args.rows.split(","):
                entropies, displacements = [], []
                for order in ROWS[row](paths, buffer):
                    assert sorted(i for i, _ in order) == list(range(total)), row
                    e, d = scores(order)
                    entropies.append(e)
                    displacements.append(d)
                results.append({
                    "row": row, "buffer": buffer,
                    "entropy": statistics.fmean(entropies) / iid,
                    "displacement": statistics.fmean(displacements) / (1 / 3),
                })  # fmt: skip
                print(results[-1], flush=True)
    lines = [
        f"{total:,} samples in {CLASSES * SHARDS_PER_CLASS} class-ordered shards ({CLASSES} "
        f"classes × {SHARDS_PER_CLASS} shards), {WORKERS} workers, batches of {BATCH}, "
        f"{EPOCHS} epochs each; iid per-batch class entropy {iid:.3f} bits. Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs.",
        "",
        "| loader | buffer (samples per worker) | class entropy / iid | neighbour spread / iid |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r['row']} | {r['buffer']:,} | {r['entropy']:.2f} | {r['displacement']:.2f} |"
        for r in results
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"iid_entropy": iid, "rows": results}, indent=2))
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
