"""Tests of the ``tensors`` recipe (the notebook's ``CustomTensorDataset``)."""

from __future__ import annotations

import pickle
import re
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardpipes.recipes.tensors import TensorPairs, tensors


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class TestTensorPairs:
    @pytest.mark.parametrize(
        ("data", "targets"),
        [
            (torch.arange(6.0).reshape(3, 2), torch.tensor([2, 0, 1])),
            (np.arange(6.0).reshape(3, 2), np.array([2, 0, 1])),
            ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [2, 0, 1]),
            (torch.arange(6.0).reshape(3, 2), torch.tensor([2.0, 0.0, 1.0])),
        ],
    )
    def test_items_and_int_labels(self, data: Any, targets: Any) -> None:
        """Item i is (data[i], int(targets[i])) for tensors, arrays and lists."""
        ds = tensors(data, targets)
        assert len(ds) == 3
        for i in range(3):
            item, label = ds[i]
            assert type(label) is int
            assert label == [2, 0, 1][i]
            assert list(map(float, item)) == [2.0 * i, 2.0 * i + 1]

    def test_transform_applied(self) -> None:
        """The transform maps each input, not the label."""
        ds = tensors(torch.ones(4, 3), torch.zeros(4, dtype=torch.long), transform=_double)
        item, label = ds[3]
        assert torch.equal(item, torch.full((3,), 2.0))
        assert label == 0

    def test_no_transform_returns_input(self) -> None:
        """Without a transform the input comes back unchanged."""
        data = torch.randn(5, 2)
        ds = tensors(data, torch.arange(5))
        assert torch.equal(ds[4][0], data[4])

    @pytest.mark.parametrize(("n_data", "n_targets"), [(100, 99), (0, 1), (3, 5)])
    def test_length_mismatch(self, n_data: int, n_targets: int) -> None:
        """Different lengths are refused with both lengths in the message."""
        msg = f"data and targets must have the same length (got {n_data} and {n_targets})"
        with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
            tensors(torch.zeros(n_data, 2), torch.zeros(n_targets))

    def test_transform_must_be_callable(self) -> None:
        """A non-callable transform is a TypeError naming it."""
        with pytest.raises(TypeError, match=r"transform must be callable or None \(got 3\)"):
            tensors([1], [0], transform=3)  # type: ignore[arg-type]

    def test_index_out_of_range(self) -> None:
        """Indexing past the end raises IndexError; negative indices count from the end."""
        ds = tensors([1, 2], [0, 1])
        with pytest.raises(IndexError):
            ds[2]
        assert ds[-1] == (2, 1)

    def test_pickles(self) -> None:
        """The dataset survives a pickle round trip."""
        ds = tensors(torch.arange(4), torch.arange(4), transform=_double)
        clone = pickle.loads(pickle.dumps(ds))
        assert isinstance(clone, TensorPairs)
        assert [(int(clone[i][0]), clone[i][1]) for i in range(4)] == [(2 * i, i) for i in range(4)]


class TestTensorsDataLoader:
    @pytest.mark.parametrize(
        ("num_workers", "batch_size"),
        [
            (0, None),
            (0, 4),
            pytest.param(2, None, marks=pytest.mark.slow),
            pytest.param(2, 4, marks=pytest.mark.slow),
        ],
    )
    def test_each_item_exactly_once(self, num_workers: int, batch_size: int | None) -> None:
        """Over one epoch every (input, label) pair arrives exactly once."""
        n = 23
        data = torch.arange(n).unsqueeze(1)
        targets = torch.arange(n) % 5
        loader = DataLoader(tensors(data, targets), batch_size=batch_size, num_workers=num_workers)
        pairs: list[tuple[int, int]] = []
        for x, y in loader:
            ids = x.reshape(-1).tolist()
            labels = [y] if isinstance(y, int) else y.tolist()
            pairs.extend(zip(ids, labels, strict=True))
        assert sorted(pairs) == [(i, i % 5) for i in range(n)]
