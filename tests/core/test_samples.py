"""Grouping members into samples."""

from __future__ import annotations

import itertools
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.handlers import ShardpipesWarning
from shardpipes._core.samples import PartFilter, group_samples, split_name
from shardpipes._core.tar import Member
from shardpipes.errors import TarFormatError


def members(*names: str) -> list[Member]:
    return [Member(n, n.encode(), i * 1024, i * 1024 + 1024) for i, n in enumerate(names)]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jpg", ("a", "jpg")),
        ("dir/x.y/abc.seg.PNG", ("dir/x.y/abc", "seg.png")),
        ("abc.", ("abc", "")),
        ("dir.d/README", None),
    ],
)
def test_split_name(name: str, expected: tuple[str, str] | None) -> None:
    """Key is the path up to the first dot of the basename; extension lower-cased."""
    assert split_name(name) == expected


class TestGroupSamples:
    def test_consecutive_members_group(self) -> None:
        """Members with one key become one sample, with __key__ and __url__."""
        got = list(group_samples(members("a.jpg", "a.cls", "b.jpg"), url="u"))
        assert got == [
            {"__key__": "a", "__url__": "u", "jpg": b"a.jpg", "cls": b"a.cls"},
            {"__key__": "b", "__url__": "u", "jpg": b"b.jpg"},
        ]

    def test_key_seen_again_starts_a_new_sample(self) -> None:
        """A key that comes back later is a new sample, not merged."""
        got = list(group_samples(members("a.jpg", "b.jpg", "a.cls"), url="u"))
        assert [(s["__key__"], sorted(s)) for s in got] == [
            ("a", ["__key__", "__url__", "jpg"]),
            ("b", ["__key__", "__url__", "jpg"]),
            ("a", ["__key__", "__url__", "cls"]),
        ]

    def test_members_without_extension_are_passed_over(self) -> None:
        """A member with no dot in its basename belongs to no sample."""
        got = list(group_samples(members("README", "a.jpg"), url="u"))
        assert [s["__key__"] for s in got] == ["a"]

    def test_duplicate_extension_raises(self) -> None:
        """One extension twice in a sample is an error naming the member."""
        with pytest.raises(TarFormatError, match=r"duplicate extension 'jpg'.*'a.JPG'"):
            list(group_samples(members("a.jpg", "a.JPG"), url="u"))

    def test_duplicate_extension_skipped_with_warn(self) -> None:
        """With handler='warn' the bad sample is dropped and the rest kept."""
        with pytest.warns(ShardpipesWarning, match="duplicate"):
            got = list(
                group_samples(members("a.jpg", "a.jpg", "a.cls", "b.jpg"), url="u", handler="warn")
            )
        assert [s["__key__"] for s in got] == ["b"]

    def test_declined_members_close_the_sample(self) -> None:
        """A declined member of another key ends the current sample (no merge across it)."""
        ms = members("a.jpg", "b.jpg", "a.cls")
        ms[1] = ms[1]._replace(data=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = list(group_samples(ms, url="u"))
        assert [s["__key__"] for s in got] == ["a", "a"]


def test_part_filter_counts_samples_not_members() -> None:
    """PartFilter keeps whole samples: all members of sample i go to part i % parts."""
    keep = PartFilter(1, 2)
    names = ["a.jpg", "a.cls", "b.jpg", "b.cls", "README", "c.jpg", "a.txt"]
    assert [n for n in names if keep(n)] == ["b.jpg", "b.cls", "a.txt"]


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["jpg", "cls", "txt"])), max_size=30)
)
def test_grouping_property(names: list[tuple[str, str]]) -> None:
    """Samples are the runs of equal keys; a run with a repeated extension raises."""
    ms = members(*(f"{k}.{e}" for k, e in names))
    runs = [list(g) for _, g in itertools.groupby(names, key=lambda n: n[0])]
    if any(len({e for _, e in run}) < len(run) for run in runs):
        with pytest.raises(TarFormatError, match="duplicate extension"):
            list(group_samples(ms, url="u"))
        return
    got = list(group_samples(ms, url="u"))
    assert [s["__key__"] for s in got] == [run[0][0] for run in runs]
    assert [sorted(s)[2:] for s in got] == [sorted(e for _, e in run) for run in runs]


item = st.one_of(
    st.tuples(st.just("member"), st.sampled_from("abc"), st.sampled_from(["jpg", "cls", "txt"])),
    st.tuples(st.just("bad"), st.sampled_from("abc"), st.just("jpg")),  # a marked bad member
    st.tuples(st.just("bad"), st.just(""), st.just("")),  # a bad header with no name
)


@given(st.lists(item, max_size=30))
def test_grouping_with_bad_members_property(items: list[tuple[str, str, str]]) -> None:
    """Skipping: no sample that lost a member is ever yielded.

    Every run of equal keys is yielded whole unless it held a duplicate extension or a
    marked bad member; a nameless mark drops the run it follows and the next one.
    """
    ms, runs, run_of = [], [], []  # run_of[i]: the run index of item i (None if nameless)
    for i, (kind, key, ext) in enumerate(items):
        if kind == "member":
            ms.append(Member(f"{key}.{ext}", b"x", i * 1024, i * 1024 + 1024))
        else:
            ms.append(Member(f"{key}.{ext}" if key else "", None, i * 1024, -1))
        if not key:
            run_of.append(None)
            continue
        if not runs or runs[-1]["key"] != key:
            runs.append({"key": key, "exts": [], "bad": False})
        run = runs[-1]
        run["bad"] = run["bad"] or kind == "bad" or ext in run["exts"]
        run["exts"].append(ext)
        run_of.append(len(runs) - 1)
    for i, index in enumerate(run_of):
        if index is None:  # the run before it (if any) and the next one
            before = next((r for r in reversed(run_of[:i]) if r is not None), None)
            for j in (before, (-1 if before is None else before) + 1):
                if j is not None and j < len(runs):
                    runs[j]["bad"] = True
    got = list(group_samples(ms, url="u", handler="ignore"))
    assert [s["__key__"] for s in got] == [r["key"] for r in runs if not r["bad"]]
