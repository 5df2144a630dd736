"""The ``tensors`` recipe: a map-style dataset over paired data and targets in memory.

It reproduces the notebook's ``CustomTensorDataset``, with two fixes: the lengths of data
and targets are checked up front, and labels come out as Python ``int`` (so they collate
the same whether the targets were a tensor, a NumPy array or a list).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch.utils.data import Dataset

__all__ = ["TensorPairs", "tensors"]


class _Indexable(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...


class TensorPairs(Dataset[tuple[Any, int]]):
    """Map-style dataset of ``(data[i], int(targets[i]))`` pairs.

    Args:
        data: Anything with ``len`` and integer indexing: a tensor (indexed on its first
            dimension), a NumPy array, a list.
        targets: Labels, one per item of ``data``; each must convert with ``int()``.
        transform: Applied to ``data[i]`` on every access, if given.

    Raises:
        ValueError: ``data`` and ``targets`` differ in length.
        TypeError: ``transform`` is not callable.

    Example:
        >>> import torch
        >>> ds = TensorPairs(torch.zeros(4, 3), torch.tensor([0, 1, 0, 1]))
        >>> len(ds), ds[1][1]
        (4, 1)
    """

    def __init__(
        self,
        data: _Indexable,
        targets: _Indexable,
        *,
        transform: Callable[[Any], Any] | None = None,
    ) -> None:
        if len(data) != len(targets):
            msg = f"data and targets must have the same length (got {len(data)} and {len(targets)})"
            raise ValueError(msg)
        if transform is not None and not callable(transform):
            msg = f"transform must be callable or None (got {transform!r})"
            raise TypeError(msg)
        self.data = data
        self.targets = targets
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        item = self.data[index]
        if self.transform is not None:
            item = self.transform(item)
        return item, int(self.targets[index])


def tensors(
    data: _Indexable,
    targets: _Indexable,
    *,
    transform: Callable[[Any], Any] | None = None,
) -> TensorPairs:
    """Map-style dataset over in-memory data and labels (the notebook's ``CustomTensorDataset``).

    Args:
        data: Inputs, indexed on the first dimension: a tensor, a NumPy array, a list.
        targets: One label per input; returned as a Python ``int``.
        transform: Applied to each input when it is read.

    Returns:
        A :class:`TensorPairs` whose item ``i`` is ``(transform(data[i]), int(targets[i]))``.

    Raises:
        ValueError: ``data`` and ``targets`` differ in length.

    Example:
        >>> import torch
        >>> ds = tensors(torch.ones(3, 2), torch.tensor([2, 0, 1]), transform=lambda x: x * 2)
        >>> ds[0]
        (tensor([2., 2.]), 2)
    """
    return TensorPairs(data, targets, transform=transform)
