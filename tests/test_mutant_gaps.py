"""Two behaviours that mutation testing found untested: the loader's seed, the end-of-epoch budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import shardpipes as sp
from tests.conftest import sample_members, write_tar

URLS = [f"memory://gaps/train-{i:03d}.tar" for i in range(24)]


def shard_order(seed: int, how: str, workers: int) -> list[str]:
    """The shard URLs a fresh ``split_shards(shuffle=True)`` pipe gives under a DataLoader."""
    pipe = sp.list_shards(URLS, check_exists=False).split_shards(shuffle=True)
    kwargs: dict[str, Any] = {}
    if how == "generator":
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    else:
        torch.manual_seed(seed)
    loader = DataLoader(pipe, batch_size=None, num_workers=workers, **kwargs)
    return [part.url for part in loader]


class TestLoaderSeedPicksTheShardOrder:
    @pytest.mark.parametrize(
        "workers", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["main", "2-workers"]
    )
    @pytest.mark.parametrize("how", ["generator", "manual_seed"])
    def test_same_seed_same_order_other_seed_other_order(self, how: str, workers: int) -> None:
        """Without seed=, the DataLoader's seed decides the order: same seed, same order."""
        orders = {seed: shard_order(seed, how, workers) for seed in (1, 2, 3)}
        assert shard_order(2, how, workers) == orders[2]
        assert all(sorted(order) == URLS for order in orders.values())
        assert len({tuple(order) for order in orders.values()}) == 3


def junk_shards(tmp_path: Path, n: int) -> list[str]:
    """``n`` files that are not tars: each is one bad item for ``open_tar``."""
    urls = []
    for i in range(n):
        path = tmp_path / f"junk-{i}.tar"
        path.write_bytes(b"junk" * 300)
        urls.append(str(path))
    return urls


def good_shard(tmp_path: Path, samples: int) -> str:
    """A valid shard of ``samples`` text samples."""
    url = str(tmp_path / "good.tar")
    members = [m for i in range(samples) for m in sample_members(f"k{i:03d}", 1, i, images=False)]
    write_tar(url, members)
    return url


def drain(pipe: Any, workers: int) -> int:
    return sum(1 for _ in DataLoader(pipe, batch_size=None, num_workers=workers))


class TestFractionalBudgetAtTheEnd:
    @pytest.mark.parametrize(
        "workers", [0, pytest.param(2, marks=pytest.mark.slow)], ids=["main", "2-workers"]
    )
    def test_worker_with_only_bad_items_fails_at_its_end(
        self, tmp_path: Path, workers: int
    ) -> None:
        """Only bad items (fewer than 1 / max_errors), one bad shard per worker: the end raises."""
        shards = sp.list_shards(junk_shards(tmp_path, 2)).split_shards()
        pipe = shards.open_tar(handler="ignore", max_errors=0.1)
        with pytest.raises(
            sp.TooManyErrorsError, match=r"errors skipped this epoch, over max_errors=0\.1"
        ):
            drain(pipe, workers)

    def test_under_the_fraction_passes(self, tmp_path: Path) -> None:
        """1 bad item in 41 with max_errors=0.1: the epoch ends without an error."""
        urls = [good_shard(tmp_path, 40), *junk_shards(tmp_path, 1)]
        pipe = sp.list_shards(urls).split_shards().open_tar(handler="ignore", max_errors=0.1)
        assert drain(pipe, 0) == 40
        assert pipe.stats().errors == 1
