"""``block_shuffle`` (issue 14 §4): blocks of every shard dealt out at random, exactly once.

Shards written in class order (shard ``s`` holds class ``s // 2``), as ``shardpipes
write`` makes them from an ImageNet-style folder; 2 DataLoader workers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from shardpipes._core.blocks import split_blocks
from tests.conftest import Dataset, write_tar

CLASSES, PER_SHARD = 5, 60  # 10 shards, 2 per class


@pytest.fixture
def ordered(tmp_path: Path) -> list[str]:
    """10 shards in class order; a sample's key is ``{class}-{index}``."""
    urls = []
    for shard in range(2 * CLASSES):
        label = shard // 2
        members = []
        for i in range(PER_SHARD):
            key = f"{label}-{shard * PER_SHARD + i:05d}"
            members += [(f"{key}.cls", str(label).encode())]
        url = str(tmp_path / f"train-{shard:03d}.tar")
        write_tar(url, members)
        sp.write_index(url)  # len() counts from the sidecars
        urls.append(url)
    return urls


def recipe(urls: list[str], **options: Any) -> Any:
    options = {"seed": 11, "buffer_size": 30, "block_shuffle": 6, **options}
    return sp.recipes.tar_shards(urls, fields=("__key__", "cls"), batch_size=20, **options)


def keys_of(batches: Any) -> list[str]:
    return [key for keys, _ in batches for key in keys]


def batch_entropy(batches: list[list[str]]) -> float:
    """Mean Shannon entropy (bits) of each batch's class counts."""
    total = 0.0
    for keys in batches:
        counts = Counter(key.split("-")[0] for key in keys)
        total -= sum(c / len(keys) * math.log2(c / len(keys)) for c in counts.values())
    return total / len(batches)


def test_blocks_cover_every_sample_once_and_even_is_even() -> None:
    counts = [13, 7, 20, 1]
    for even in (False, True):
        parts = [
            split_blocks(
                ["a", "b", "c", "d"], counts, 4, seed=1, epoch=0, total=3, worker=w, even=even
            )
            for w in range(3)
        ]
        samples = [(p.url, i) for mine in parts for p in mine for i in range(p.start, p.stop)]
        assert len(samples) == len(set(samples))
        assert len(samples) == (sum(counts) // 3 * 3 if even else sum(counts))
        if even:
            assert {sum(p.stop - p.start for p in mine) for mine in parts} == {sum(counts) // 3}
    one = split_blocks(["a", "b"], [8, 8], 2, seed=1, epoch=0, total=1, worker=0)
    assert one == split_blocks(["a", "b"], [8, 8], 2, seed=1, epoch=0, total=1, worker=0)
    assert one != split_blocks(["a", "b"], [8, 8], 2, seed=1, epoch=1, total=1, worker=0)


def test_every_worker_sees_every_class(ordered: list[str]) -> None:
    """Batches mix the classes as an iid draw would, where shard order alone cannot."""
    blocks = [keys for keys, _ in DataLoader(recipe(ordered), batch_size=None, num_workers=2)]
    assert Counter(k for keys in blocks for k in keys) == Counter(
        f"{s // 2}-{s * PER_SHARD + i:05d}" for s in range(10) for i in range(PER_SHARD)
    )
    plain = DataLoader(recipe(ordered, block_shuffle=None), batch_size=None, num_workers=2)
    whole = [keys for keys, _ in plain]
    iid = math.log2(CLASSES)  # about what 20 iid draws of 5 classes reach, at most
    assert batch_entropy(blocks) > 0.8 * iid > batch_entropy(whole)


def test_resumes_exactly_and_counts_its_length(ordered: list[str]) -> None:
    """StatefulDataLoader stopped after 4 batches: before + after = uninterrupted."""
    whole = keys_of(StatefulDataLoader(recipe(ordered), batch_size=None, num_workers=2))
    loader = StatefulDataLoader(recipe(ordered), batch_size=None, num_workers=2)
    batches = iter(loader)
    before = keys_of(next(batches) for _ in range(4))
    state = loader.state_dict()
    del batches
    again = StatefulDataLoader(recipe(ordered), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert before + keys_of(again) == whole
    assert len(StatefulDataLoader(recipe(ordered), batch_size=None, num_workers=2)) == len(
        list(StatefulDataLoader(recipe(ordered), batch_size=None, num_workers=2))
    )
    elsewhere = sp.resume_from(recipe(ordered, even=True), _state_after(ordered, 3))
    rest = keys_of(StatefulDataLoader(elsewhere, batch_size=None, num_workers=1))
    first = keys_of(_first_batches(ordered, 3))
    seen = Counter(first + rest)
    assert max(seen.values()) == 1
    assert len(seen) > 10 * PER_SHARD - 2 - 1 - 2


def _first_batches(urls: list[str], n: int) -> list[Any]:
    loader = StatefulDataLoader(recipe(urls, even=True), batch_size=None, num_workers=2)
    batches = iter(loader)
    return [next(batches) for _ in range(n)]


def _state_after(urls: list[str], n: int) -> Any:
    loader = StatefulDataLoader(recipe(urls, even=True), batch_size=None, num_workers=2)
    batches = iter(loader)
    for _ in range(n):
        next(batches)
    return loader.state_dict()


def test_compressed_shards_are_refused(make_shards: Callable[..., Dataset]) -> None:
    data = make_shards(2, 5, suffix=".tar.gz")
    pipe = sp.recipes.tar_shards(data.urls, fields=("__key__",), block_shuffle=4)
    with pytest.raises(ValueError, match=r"train-000000\.tar\.gz: block_shuffle reads blocks"):
        list(pipe)
    with pytest.raises(ValueError, match="block_shuffle must be None or an int"):
        sp.recipes.tar_shards(data.urls, block_shuffle=0)
