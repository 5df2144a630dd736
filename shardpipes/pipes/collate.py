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
from torch.utils.data._utils.collate import default_collate_fn_map

from shardpipes._core.fields import either
from shardpipes._core.samples import SampleTuple, ShardSample

__all__ = ["Batch", "BatchDict", "collate_samples"]

_NUMERIC_KINDS = "biufc"
# tensors up to this size travel inside the pickle between processes; larger ones go
# through shared memory, which costs a segment, a file descriptor and an mmap per tensor
_INLINE_BYTES = 64 * 1024


def _pack(value: Any) -> tuple[bool, Any]:
    """``(True, array)`` for a small plain CPU tensor, sent by value; else ``(False, value)``."""
    if (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.requires_grad
        and value.dtype not in _NO_NUMPY
        and value.untyped_storage().nbytes() <= _INLINE_BYTES
    ):
        return True, value.numpy()
    return False, value


_NO_NUMPY = frozenset({torch.bfloat16, torch.complex32, torch.float8_e4m3fn, torch.float8_e5m2})


def _unpack(packed: tuple[bool, Any]) -> Any:
    inline, value = packed
    return torch.from_numpy(value) if inline else value


def _rebuild(cls: type[Any], items: Any) -> Any:
    if issubclass(cls, dict):
        return cls({key: _unpack(value) for key, value in items})
    return cls(_unpack(value) for value in items)


class _Copied:
    """A shallow copy of a batch is a batch of the same type."""

    def __copy__(self) -> Any:
        return type(self)(self)  # type: ignore[call-arg]


class Batch(_Copied, list[Any]):
    """A batch of fields (from tuple samples), as returned by :func:`collate_samples`.

    A ``list`` — what a ``DataLoader`` hands over for a tuple anyway — that crosses from a
    worker to the main process cheaply: small tensors (labels, sizes; up to 64 KiB) are
    sent inside the pickle instead of one shared-memory segment each.
    """

    def __reduce_ex__(self, protocol: object) -> tuple[Any, ...]:
        return _rebuild, (type(self), [_pack(value) for value in self])


class BatchDict(_Copied, dict[str, Any]):
    """A batch of fields (from dict samples), as returned by :func:`collate_samples`.

    A ``dict`` that crosses between processes as :class:`Batch` does.
    """

    def __reduce_ex__(self, protocol: object) -> tuple[Any, ...]:
        return _rebuild, (type(self), [(key, _pack(value)) for key, value in self.items()])


def collate_samples(batch: Sequence[Any]) -> Any:
    """Collate a list of samples (dicts or tuples) into one batch.

    Field by field: ``PIL.Image`` values become uint8 CHW tensors (modes other than
    ``L``, ``RGB`` and ``RGBA`` are converted to RGB first) and numeric numpy arrays
    become tensors, then tensors are stacked; ``int`` values become a 1-D int64 tensor;
    ``str`` and ``bytes`` values, dicts and lists without arrays (decoded ``json``) are
    kept as a list of the samples' values, as WebDataset's ``batched`` keeps them;
    anything else goes to ``torch.utils.data.default_collate``. Use it as
    ``pipe.batch(n).collate(collate_samples)`` or as a ``DataLoader``'s ``collate_fn``.

    Args:
        batch: Samples, all dicts with the same fields or all tuples of the same length.

    Returns:
        A :class:`BatchDict` (for dict samples) or a :class:`Batch` list (for tuple
        samples) of batched fields: a ``dict`` and a ``list`` that move from DataLoader
        workers to the main process faster than plain ones.

    Raises:
        ValueError: For an empty batch, samples with different fields, or tensors of
            different shapes in one field (resize them in a ``map()`` before ``batch()``),
            or values ``default_collate`` cannot batch (the error, of its type, names
            the field).

    Example:
        >>> import PIL.Image
        >>> samples = [{"__key__": f"k{i}", "jpg": PIL.Image.new("RGB", (4, 2)), "cls": i}
        ...            for i in range(3)]
        >>> batch = collate_samples(samples)
        >>> batch["__key__"], batch["jpg"].shape, batch["cls"]
        (['k0', 'k1', 'k2'], torch.Size([3, 3, 2, 4]), tensor([0, 1, 2]))
        >>> collate_samples([("a", 1), ("b", 2)])
        [['a', 'b'], tensor([1, 2])]
    """
    if not batch:
        msg = "batch must hold at least one sample (got an empty batch)"
        raise ValueError(msg)
    first = batch[0]
    if isinstance(first, Mapping):
        for sample in batch:
            if set(sample) != set(first):
                raise ValueError(_other_fields(sorted(first), sorted(sample)))
        return BatchDict(
            {field: _collate_field(field, [s[field] for s in batch]) for field in first}
        )
    if isinstance(first, (tuple, list)):
        for sample in batch:
            if len(sample) != len(first):
                msg = (
                    "samples of one batch must have the same lengths "
                    f"(got {len(first)} and {len(sample)})"
                )
                raise ValueError(msg)
        return Batch(
            _collate_field(i, list(column)) for i, column in enumerate(zip(*batch, strict=True))
        )
    return default_collate(list(batch))


def _other_fields(expected: list[str], got: list[str]) -> str:
    """The error of a batch whose samples hold different fields, with the way out."""
    msg = f"samples of one batch must have the same fields (got {expected} and {got})"
    lacking = [name for name in expected if name not in got]
    hint = either(lacking, got) if lacking else ""
    return msg + hint + " before .batch()" if hint else msg


def _collate_field(field: str | int, values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, (str, bytes, dict)) or (isinstance(first, list) and _plain(values)):
        return values
    if isinstance(first, int) and not isinstance(first, bool):
        return torch.tensor(values, dtype=torch.int64)
    image = isinstance(first, PIL.Image.Image)
    if image:
        values = [_image_to_tensor(value) for value in values]
    elif isinstance(first, numpy.ndarray) and first.dtype.kind in _NUMERIC_KINDS:
        values = [_array_to_tensor(value) for value in values]
    if isinstance(values[0], torch.Tensor):
        shape = values[0].shape
        for value in values:
            if value.shape != shape:
                raise ValueError(_unequal(field, tuple(shape), tuple(value.shape), image))
    try:
        return default_collate(values)
    except (RuntimeError, TypeError) as exc:
        msg = (
            f"field {field!r}: cannot batch its values ({type(first).__name__}): {exc}; make "
            "them one shape in a map() before batching, or collate with a function of yours"
        )
        raise type(exc)(msg) from exc


def _plain(values: list[Any]) -> bool:
    """Whether lists hold no array or tensor (decoded ``json``): kept as they are.

    Lists of arrays (``.ten``) go to ``default_collate``, which stacks them position by
    position.
    """
    return not any(
        isinstance(item, (numpy.ndarray, torch.Tensor)) for value in values for item in value
    )


def _unequal(field: str | int, one: tuple[int, ...], other: tuple[int, ...], image: bool) -> str:
    """The error for tensors of different shapes in one field of a batch."""
    problem = f"field {field!r}: cannot batch tensors of shapes {one} and {other}"
    if image or (len(one) == 3 and one[0] in (1, 3, 4)):
        return (
            f"{problem}: images of different sizes. Decode them to one size with "
            "resize= and crop= on the recipe (tar_shards(..., resize=256, crop=224)) or on "
            'decode (.decode("torch", resize=256, crop=224)); or resize them in a map() '
            "before batching"
        )
    return f"{problem}; make them one shape in a map() before batching"


def _collate_samples_fn(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s entry for shardpipes' samples: :func:`collate_samples`."""
    return collate_samples(batch)


def _batched_twice(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """``default_collate``'s entry for shardpipes' batches: they are batched already."""
    first = batch[0]
    values = first.values() if isinstance(first, Mapping) else first
    inner = next((len(v) for v in values if hasattr(v, "__len__")), "?")
    msg = (
        f"the pipe yields batches already (of {inner} samples) and the DataLoader batches "
        f"them again (it gathered {len(batch)} of them for one batch): give the DataLoader "
        "batch_size=None, or take batch_size off the pipe"
    )
    raise ValueError(msg)


# a DataLoader with batch_size=N collates with default_collate, which looks up the type of
# the items in this table (torch documents extending it in place)
default_collate_fn_map.update(
    {
        SampleTuple: _collate_samples_fn,
        ShardSample: _collate_samples_fn,
        Batch: _batched_twice,
        BatchDict: _batched_twice,
    }
)


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
