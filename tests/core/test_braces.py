"""Brace expansion of shard patterns."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.braces import expand_braces


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("plain.tar", ["plain.tar"]),
        ("t-{000..002}.tar", ["t-000.tar", "t-001.tar", "t-002.tar"]),
        ("t-{8..11}", ["t-8", "t-9", "t-10", "t-11"]),
        ("t-{08..11}", ["t-08", "t-09", "t-10", "t-11"]),
        ("{3..1}", ["3", "2", "1"]),
        ("{0..10..5}", ["0", "5", "10"]),
        ("{a..c}", ["a", "b", "c"]),
        ("{a,b,c}.tar", ["a.tar", "b.tar", "c.tar"]),
        ("{a,b}-{0..1}", ["a-0", "a-1", "b-0", "b-1"]),
        ("{a,b{1,2}}", ["a", "b1", "b2"]),
        (
            "s3://b/{train,val}-{00..01}.tar",
            [
                "s3://b/train-00.tar",
                "s3://b/train-01.tar",
                "s3://b/val-00.tar",
                "s3://b/val-01.tar",
            ],
        ),
        ("{x}", ["{x}"]),
        ("a\\{1,2\\}", ["a{1,2}"]),
        ("{-02..02}", ["-02", "-01", "000", "001", "002"]),
        ("{-05..1}", ["-05", "-04", "-03", "-02", "-01", "000", "001"]),
        ("{007..10}", ["007", "008", "009", "010"]),
        ("{9..010}", ["009", "010"]),
        ("{10..0..5}", ["10", "5", "0"]),
        ("{0..10..-5}", ["0", "5", "10"]),
        ("{0..0}", ["0"]),
        ("{a..g..3}", ["a", "d", "g"]),
        ("{g..a..3}", ["g", "d", "a"]),
        ("{e..a}", ["e", "d", "c", "b", "a"]),
        ("{a..a}", ["a"]),
        ("{x,{{a,b},c}}", ["x", "a", "b", "c"]),
        ("{{a,b}}", ["{a}", "{b}"]),
        ("{,a}", ["", "a"]),
        ("{}", ["{}"]),
        ("x{a\\},b}", ["xa}", "xb"]),
        ("{a,b}\\}", ["a}", "b}"]),
        ("\\{a\\}{1,2}", ["{a}1", "{a}2"]),
    ],
)
def test_table(pattern: str, expected: list[str]) -> None:
    """Known patterns expand as bash and braceexpand do."""
    assert expand_braces(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "expected"), [("{1..-2}", ["1", "0", "-1", "-2"]), ("{-3..-1}", ["-3", "-2", "-1"])]
)
def test_negative_bounds_without_padding(pattern: str, expected: list[str]) -> None:
    """Negative bounds without zero padding count through zero as bash does (was a crash)."""
    assert expand_braces(pattern) == expected


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("a{b", "unbalanced '{'"),
        ("{a,{b}", "unbalanced '{'"),
        ("a}b", "unbalanced '}'"),
        ("{a,b}}", "unbalanced '}'"),
        ("{0..4..0}", "brace range step must not be 0"),
        ("{a..c..0}", "brace range step must not be 0"),
        ("{a,{0..4..0}}", "brace range step must not be 0"),  # in an alternative
        ("{{0..4..0}}", "brace range step must not be 0"),  # in a literal group
    ],
)
def test_bad_patterns(pattern: str, problem: str) -> None:
    """Unbalanced braces and zero steps are refused, quoting the pattern."""
    with pytest.raises(ValueError, match=re.escape(problem) + ".*" + re.escape(repr(pattern))):
        expand_braces(pattern)


def naive(groups: list[list[str]], seps: list[str]) -> list[str]:
    """Reference: the product of the groups, joined by the literal separators."""
    out = []
    for combo in itertools.product(*groups):
        s = seps[0]
        for choice, sep in zip(combo, seps[1:], strict=True):
            s += choice + sep
        out.append(s)
    return out


literal = st.text(alphabet="abcxyz-_./:", max_size=5)
word = st.text(alphabet="abcxyz", min_size=1, max_size=4)


@st.composite
def group(draw: st.DrawFn) -> tuple[str, list[str]]:
    if draw(st.booleans()):
        lo, hi = draw(st.integers(0, 120)), draw(st.integers(0, 120))
        width = draw(st.integers(1, 4))
        a, b = f"{lo:0{width}d}", f"{hi:0{width}d}"
        padded = width > 1 and (a[0] == "0" or b[0] == "0")
        w = max(len(a), len(b)) if padded else 0
        nums = range(lo, hi + 1) if lo <= hi else range(lo, hi - 1, -1)
        return "{" + a + ".." + b + "}", [f"{n:0{w}d}" for n in nums]
    words = draw(st.lists(word, min_size=2, max_size=4))
    return "{" + ",".join(words) + "}", words


@given(st.lists(group(), max_size=3), st.data())
def test_matches_naive_product(groups: list[tuple[str, list[str]]], data: st.DataObject) -> None:
    """Any mix of ranges and alternatives is the product of the groups, in order."""
    seps = [data.draw(literal) for _ in range(len(groups) + 1)]
    pattern = seps[0] + "".join(g + s for (g, _), s in zip(groups, seps[1:], strict=True))
    assert expand_braces(pattern) == naive([choices for _, choices in groups], seps)
