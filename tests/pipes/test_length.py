"""``len()`` of pipes and loaders (issue 14 §2): exact where the counts are known, else why not."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from tests.conftest import Dataset

COUNTS = [13, 7, 20, 9, 11]  # unequal shards: what each worker reads depends on the split


@pytest.fixture
def indexed(make_shards: Callable[..., Dataset]) -> Dataset:
    data = make_shards(len(COUNTS), COUNTS)
    for url in data.urls:
        sp.write_index(url)
    return data


def pipes(urls: list[str]) -> dict[str, Callable[[], Any]]:
    half = len(urls) // 2
    return {
        "recipe, batches of 4": lambda: sp.recipes.tar_shards(
            urls, fields=("__key__", "cls"), batch_size=4, seed=3
        ),
        "chain, batches of 3, drop_last": lambda: (
            sp.list_shards(urls).split_shards(shuffle=True, seed=5).open_tar()
            .shuffle_samples(buffer_size=8).to_tuple("__key__", "cls").batch(3, drop_last=True)
        ),
        "mix, batches of 5": lambda: sp.mix({
            "a": sp.list_shards(urls[:half]).split_shards(shuffle=False).open_tar(),
            "b": sp.list_shards(urls[half:]).split_shards(shuffle=False).open_tar(),
        }).batch(5),
        "mix, epoch_size=37": lambda: sp.mix(
            {"a": sp.list_shards(urls).split_shards(shuffle=False).open_tar()}, epoch_size=37
        ).batch(5),
        "even": lambda: sp.recipes.tar_shards(urls, fields=("__key__",), batch_size=4, even=True),
        "one list, epoch_size=50": lambda: sp.recipes.tar_shards(
            urls, fields=("__key__",), batch_size=6, epoch_size=50, seed=1
        ),
    }  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_loader_length_is_what_it_yields(indexed: Dataset, workers: int) -> None:
    """len(DataLoader) equals the batches it then yields, for both loaders and every pipe."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    for name, make in pipes(indexed.urls).items():
        for kind in (DataLoader, StatefulDataLoader):
            loader = kind(make(), batch_size=None, num_workers=workers)
            assert len(loader) == sum(1 for _ in loader), (name, kind.__name__)
        if workers == 0:
            assert len(make()) == sum(1 for _ in make()), name


def test_every_worker_counted_once(indexed: Dataset) -> None:
    """Over the workers of any split, the counts add up to every sample once."""
    pipe = sp.list_shards(indexed.urls).split_shards(shuffle=True, seed=2).open_tar()
    for total in (1, 2, 3, 6, 8):  # 8 workers: fewer shards than workers, split by sample
        assert sum(pipe.length(total, w) for w in range(total)) == sum(COUNTS)


def test_local_shards_without_sidecars_are_counted_from_their_headers(
    make_shards: Callable[..., Dataset], indexed: Dataset
) -> None:
    """A local plain tar without ``.idx`` (webdataset's, ``tar``'s) has an exact len()."""
    plain = make_shards(3, [5, 2, 4], base=str(Path(indexed.urls[0]).parent.parent / "plain"))
    assert not any(Path(url + ".idx").exists() for url in plain.urls)
    pipe = sp.recipes.tar_shards(plain.urls, fields=("txt", "cls"), seed=1, batch_size=2)
    loader = DataLoader(pipe, batch_size=None, num_workers=2)
    assert len(loader) == sum(1 for _ in loader) == 6  # any split of 5, 2, 4 in two: 6 batches


def test_unknown_lengths_say_why(make_shards: Callable[..., Dataset], indexed: Dataset) -> None:
    packed = make_shards(
        2, 5, base=str(Path(indexed.urls[0]).parent.parent / "packed"), suffix=".tar.gz"
    )
    loader = DataLoader(sp.recipes.tar_shards(packed.urls), batch_size=None, num_workers=2)
    with pytest.raises(
        TypeError, match=r"sample count of .*train-000000\.tar\.gz is not known \(a remote or gzip"
    ):
        len(loader)
    unseeded = sp.recipes.tar_shards(indexed.urls, batch_size=4)  # shuffled by the loader
    with pytest.raises(TypeError, match=r"give split_shards .* a seed="):
        len(DataLoader(unseeded, batch_size=None, num_workers=2))
    filtered = sp.list_shards(indexed.urls).split_shards().open_tar().filter(bool)
    with pytest.raises(TypeError, match=r"Filter.* cannot count"):
        len(DataLoader(filtered, batch_size=None, num_workers=2))


def test_resample_is_endless_and_deterministic(indexed: Dataset) -> None:
    """resample=True: passes without end, each sample once per pass; no len()."""

    def make() -> sp.Mixer:
        return sp.mix(
            {"a": sp.list_shards(indexed.urls).split_shards(shuffle=True, seed=4).open_tar()},
            resample=True,
        )

    total = sum(COUNTS)
    keys = [s["__key__"] for s in itertools.islice(make(), 3 * total + 10)]
    assert all(
        Counter(keys[i * total : (i + 1) * total]) == Counter(indexed.keys) for i in range(3)
    )
    assert keys[:total] != keys[total : 2 * total]  # a new order each pass
    assert keys == [s["__key__"] for s in itertools.islice(make(), 3 * total + 10)]
    with pytest.raises(TypeError, match="never ends"):
        len(make())
    with pytest.raises(ValueError, match="not both"):
        sp.mix({"a": sp.list_shards(indexed.urls).open_tar()}, epoch_size=5, resample=True)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_samples_need_no_seed(indexed: Dataset, workers: int) -> None:
    """Unbatched, the loader's total is every sample whatever the shard order (issue 24 §5)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    unseeded = {
        "recipe": lambda: sp.recipes.tar_shards(indexed.urls, fields=("__key__",)),
        "chain": lambda: sp.list_shards(indexed.urls).split_shards().open_tar(),
    }
    for name, make in unseeded.items():
        for kind in (DataLoader, StatefulDataLoader):
            loader = kind(make(), batch_size=None, num_workers=workers)
            assert len(loader) == sum(COUNTS) == sum(1 for _ in loader), (name, kind.__name__)
        assert len(make()) == sum(COUNTS), name
