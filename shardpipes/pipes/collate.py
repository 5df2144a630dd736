"""Collation of decoded samples into batches: :func:`collate_samples`.

What torch core already does (verified with torch 2.13): ``pipe.batch(4).collate()``
applies ``torch.utils.data.default_collate`` to each list of sample dicts, which gives a
dict of stacked tensors for ints and numeric numpy arrays and lists for ``str``/``bytes``
fields (``__key__``, ``__url__``), but raises ``TypeError`` on a ``PIL.Image`` field and a
bare ``RuntimeError: stack expects each tensor to be equal size`` that names no field.
:func:`collate_samples` fills those two gaps; pass it as ``.collate(collate_samples)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy
import PIL.Image
import torch
from torch.utils.data import default_collate

__all__ = ["collate_samples"]

_NUMERIC_KINDS = "biufc"


def collate_samples(batch: Sequence[Any]) -> Any:
    """Collate a list of samples (dicts or tuples) into one batch.

    Field by field: ``PIL.Image`` values become uint8 CHW tensors (modes other than
    ``L``, ``RGB`` and ``RGBA`` are converted to RGB first) and numeric numpy arrays
    become tensors, then tensors are stacked; ``int`` values become a 1-D int64 tensor;
    ``str`` and ``bytes`` values are kept as a list; anything else goes to
    ``torch.utils.data.default_collate``. Use it as ``pipe.batch(n).collate(collate_samples)``
    or as a ``DataLoader``'s ``collate_fn``.

    Args:
        batch: Samples, all dicts with the same fields or all tuples of the same length.

    Returns:
        A dict (for dict samples) or a tuple (for tuple samples) of batched fields.

    Raises:
        ValueError: For an empty batch, samples with different fields, or tensors of
            different shapes in one field (resize them in a ``map()`` before ``batch()``).

    Example:
        >>> import PIL.Image
        >>> samples = [{"__key__": f"k{i}", "jpg": PIL.Image.new("RGB", (4, 2)), "cls": i}
        ...            for i in range(3)]
        >>> batch = collate_samples(samples)
        >>> batch["__key__"], batch["jpg"].shape, batch["cls"]
        (['k0', 'k1', 'k2'], torch.Size([3, 3, 2, 4]), tensor([0, 1, 2]))
        >>> collate_samples([("a", 1), ("b", 2)])
        (['a', 'b'], tensor([1, 2]))
    """
    if not batch:
        msg = "batch must hold at least one sample (got an empty batch)"
        raise ValueError(msg)
    first = batch[0]
    if isinstance(first, Mapping):
        for sample in batch:
            _check_same(set(first), set(sample), "fields")
        return {field: _collate_field(field, [s[field] for s in batch]) for field in first}
    if isinstance(first, (tuple, list)):
        for sample in batch:
            _check_same(len(first), len(sample), "lengths")
        return tuple(
            _collate_field(i, list(column)) for i, column in enumerate(zip(*batch, strict=True))
        )
    return default_collate(list(batch))


def _check_same(expected: object, got: object, what: str) -> None:
    if got != expected:
        msg = f"samples of one batch must have the same {what} (got {expected} and {got})"
        raise ValueError(msg)


def _collate_field(field: str | int, values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, (str, bytes)):
        return values
    if isinstance(first, int) and not isinstance(first, bool):
        return torch.tensor(values, dtype=torch.int64)
    if isinstance(first, PIL.Image.Image):
        values = [_image_to_tensor(value) for value in values]
    elif isinstance(first, numpy.ndarray) and first.dtype.kind in _NUMERIC_KINDS:
        values = [_array_to_tensor(value) for value in values]
    if isinstance(values[0], torch.Tensor):
        shape = values[0].shape
        for value in values:
            if value.shape != shape:
                msg = (
                    f"field {field!r}: cannot stack tensors of shapes {tuple(shape)} and "
                    f"{tuple(value.shape)}; resize in a map() before batch()"
                )
                raise ValueError(msg)
    return default_collate(values)


def _image_to_tensor(image: PIL.Image.Image) -> torch.Tensor:
    if image.mode not in ("L", "RGB", "RGBA"):
        image = image.convert("RGB")
    array = numpy.array(image, dtype=numpy.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1)


def _array_to_tensor(array: numpy.ndarray[Any, Any]) -> torch.Tensor:
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)
