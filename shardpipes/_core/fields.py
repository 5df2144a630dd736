"""Picking fields of a sample: ``"jpg;png"`` takes ``jpg`` if the sample has it, else ``png``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardpipes._core.images import IMAGE_EXTENSIONS
from shardpipes._core.samples import SampleTuple, placed_like
from shardpipes.errors import MissingFieldError

Alternatives = tuple[tuple[str, ...], ...]  # each field's names, in order of preference


def _parse_field(field: object) -> tuple[str, ...]:
    if not isinstance(field, str):
        msg = f"fields must be strings (got {type(field).__name__})"
        raise TypeError(msg)
    alternatives = tuple(field.split(";"))
    if not all(alternatives):
        msg = f"fields must be names separated by ';' (got {field!r})"
        raise ValueError(msg)
    return alternatives


def parse_fields(fields: tuple[object, ...]) -> Alternatives:
    """Split each field spec (``"jpg;png"``) into its alternatives, checking them.

    As in WebDataset, whitespace separates fields within one spec: ``"jpg;png cls"`` is
    the two fields ``"jpg;png"`` and ``"cls"``.

    Example:
        >>> parse_fields(("jpg;png cls",))
        (('jpg', 'png'), ('cls',))
    """
    specs: list[object] = []
    for field in fields:
        if isinstance(field, str):
            specs += re.sub(r"\s*;\s*", ";", field).split() or [field]
        else:
            specs.append(field)
    return tuple(_parse_field(spec) for spec in specs)


def pick(sample: Mapping[str, Any], alternatives: tuple[str, ...]) -> str:
    """The first of ``alternatives`` that ``sample`` has.

    Raises:
        MissingFieldError: The sample has none of them.
    """
    for name in alternatives:
        if name in sample:
            return name
    wanted = " or ".join(repr(name) for name in alternatives)
    present = sorted(name for name in sample if not name.startswith("__"))
    problem = f"no field {wanted}; the sample has {present}{either(alternatives, present)}"
    raise MissingFieldError(
        problem,
        url=sample.get("__url__"),
        key=sample.get("__key__"),
        offset=getattr(sample, "offset", None),  # a ShardSample knows where it starts
    )


def either(wanted: Sequence[str], present: Sequence[str]) -> str:
    """A hint, when samples hold one image field under different names (a PNG among JPEGs).

    Example:
        >>> either(["jpg"], ["cls", "png"])
        "; images come as jpg or png: name both, 'jpg;png' (e.g. .rename_fields(image='jpg;png'))"
    """
    if not any(name in IMAGE_EXTENSIONS for name in wanted):
        return ""
    others = [name for name in present if name in IMAGE_EXTENSIONS and name not in wanted]
    if not others:
        return ""
    names = ";".join(dict.fromkeys([*wanted, *others]))
    shown = " or ".join(names.split(";"))
    return f"; images come as {shown}: name both, {names!r} (e.g. .rename_fields(image={names!r}))"


def pick_tuple(sample: Mapping[str, Any], fields: Alternatives) -> SampleTuple:
    """The sample's values of ``fields`` (from :func:`parse_fields`), in order.

    Raises:
        MissingFieldError: The sample has none of one field's alternatives.

    Example:
        >>> pick_tuple({"png": 1, "cls": 2}, parse_fields(("jpg;png", "cls")))
        (1, 2)
    """
    return SampleTuple(sample[pick(sample, names)] for names in fields)


def rename(
    sample: Mapping[str, Any], names: Mapping[str, tuple[str, ...]], *, keep: bool = True
) -> dict[str, Any]:
    """``sample`` with fields renamed: each new name takes the first alternative it has.

    The fields taken leave under their old names; with ``keep=False`` only the new ones
    (and ``__key__``, ``__url__``…) are left.

    Raises:
        MissingFieldError: The sample has none of one new name's alternatives.

    Example:
        >>> rename({"__key__": "a", "png": 1, "cls": 2, "txt": 3}, {"image": ("jpg", "png")})
        {'__key__': 'a', 'cls': 2, 'txt': 3, 'image': 1}
    """
    chosen = {new: pick(sample, alternatives) for new, alternatives in names.items()}
    taken = set(chosen.values())
    out = {
        name: value
        for name, value in sample.items()
        if name.startswith("__") or (keep and name not in taken)
    }
    out.update((new, sample[old]) for new, old in chosen.items())
    return placed_like(out, sample)


def map_fields(
    sample: Mapping[str, Any], functions: Mapping[str, Callable[[Any], Any]]
) -> dict[str, Any]:
    """``sample`` with ``functions[name]`` applied to its field ``name``, for each name.

    Raises:
        MissingFieldError: The sample lacks one of the fields.

    Example:
        >>> map_fields({"__key__": "a", "cls": b"3"}, {"cls": int})
        {'__key__': 'a', 'cls': 3}
    """
    out = dict(sample)
    for name, function in functions.items():
        out[name] = function(sample[pick(sample, (name,))])
    return placed_like(out, sample)
