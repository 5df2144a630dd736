"""Brace expansion for shard patterns, as in bash and WebDataset's ``braceexpand``.

* ``{000..127}``: a numeric range; zero padding is kept (the width is that of the longer
  bound when either bound has a leading zero), descending ranges count down, and an
  optional third part is a step: ``{0..10..2}``.
* ``{a..e}``: a range of single characters.
* ``{a,b,c}``: alternatives, which may themselves hold braces.
* Several groups in one string expand to their product, leftmost varying slowest.

A ``{`` or ``}`` preceded by a backslash is literal. ``{x}`` (one item, no range) is literal,
as in bash.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(
    r"^(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?$|^([a-zA-Z])\.\.([a-zA-Z])(?:\.\.(-?\d+))?$"
)


def expand_braces(pattern: str) -> list[str]:
    """Expand every brace group in ``pattern``.

    Args:
        pattern: A string such as ``"train-{000..002}.tar"``.

    Returns:
        The expansions in order.

    Raises:
        ValueError: On unbalanced braces or a zero step.

    Example:
        >>> expand_braces("s3://b/train-{08..10}.{tar,idx}")  # doctest: +NORMALIZE_WHITESPACE
        ['s3://b/train-08.tar', 's3://b/train-08.idx', 's3://b/train-09.tar',
         's3://b/train-09.idx', 's3://b/train-10.tar', 's3://b/train-10.idx']
    """
    return [_unescape(s) for s in _expand(pattern, pattern)]


def _unescape(s: str) -> str:
    return s.replace("\\{", "{").replace("\\}", "}")


# an escaped character (passed over) or a brace or comma that counts
_MARKS = re.compile(r"\\.|[{},]", re.DOTALL)


def _find_group(s: str, whole: str) -> tuple[int, int] | None:
    """Return (start, end) of the first top-level brace group, end inclusive."""
    depth = start = 0
    for mark in _MARKS.finditer(s):
        if mark.group() == "{":
            if depth == 0:
                start = mark.start()
            depth += 1
        elif mark.group() == "}":
            if depth == 0:
                msg = f"unbalanced '}}' in pattern {whole!r}"
                raise ValueError(msg)
            depth -= 1
            if depth == 0:
                return start, mark.start()
    if depth:
        msg = f"unbalanced '{{' in pattern {whole!r}"
        raise ValueError(msg)
    return None


def _split_top(body: str) -> list[str]:
    """Split a group's body on top-level commas."""
    parts, depth, last = [], 0, 0
    for mark in _MARKS.finditer(body):
        if mark.group() == "{":
            depth += 1
        elif mark.group() == "}":
            depth -= 1
        elif mark.group() == "," and depth == 0:
            parts.append(body[last : mark.start()])
            last = mark.end()
    parts.append(body[last:])
    return parts


def _expand(s: str, whole: str) -> list[str]:
    group = _find_group(s, whole)
    if group is None:
        return [s]
    start, end = group
    head, body, tail = s[:start], s[start + 1 : end], s[end + 1 :]
    choices = _choices(body, whole)
    tails = _expand(tail, whole)
    return [head + c + t for c, t in itertools.product(choices, tails)]


def _choices(body: str, whole: str) -> list[str]:
    m = _RANGE.match(body)
    if m:
        return _range(m, whole)
    parts = _split_top(body)
    if len(parts) == 1:  # "{x}" is literal, as in bash
        return ["{" + e + "}" for e in _expand(body, whole)]
    return [e for p in parts for e in _expand(p, whole)]


def _range(m: re.Match[str], whole: str) -> list[str]:
    step = int(m.group(3) or m.group(6) or 1)
    if step == 0:
        msg = f"brace range step must not be 0 (got pattern {whole!r})"
        raise ValueError(msg)
    step = abs(step)
    if m.group(1) is not None:
        a, b = m.group(1), m.group(2)
        lo, hi = int(a), int(b)
        padded = any(len(x.lstrip("-")) > 1 and x.lstrip("-")[0] == "0" for x in (a, b))
        width = max(len(a), len(b)) if padded else 0
        numbers = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [f"{n:0{width}d}" if n >= 0 else f"-{-n:0{max(width - 1, 0)}d}" for n in numbers]
    lo, hi = ord(m.group(4)), ord(m.group(5))
    codes = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
    return [chr(c) for c in codes]
