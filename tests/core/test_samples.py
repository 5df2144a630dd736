"""Grouping members into samples."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardpipes._core.handlers import ShardpipesWarning
from shardpipes._core.samples import Located, PartFilter, ShardSample, group_samples, split_name
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
        (".jpg", ("", "jpg")),
        ("d/.x.jpg", ("d/", "x.jpg")),
        ("d.1/e.2/k.jpg", ("d.1/e.2/k", "jpg")),
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

    @pytest.mark.parametrize(
        ("names", "keys"),
        [
            (["d.1/e.2/k.jpg", "d.1/e.2/k.seg.png", "d.1/e.9/k.jpg"], ["d.1/e.2/k", "d.1/e.9/k"]),
            ([".jpg", ".cls", "a.jpg"], ["", "a"]),
            (["a.seg.png", "a.jpg", "b.seg.png"], ["a", "b"]),
        ],
    )
    def test_keys_are_split_like_split_name(self, names: list[str], keys: list[str]) -> None:
        """The grouping splits names as split_name does: dotted folders, empty keys."""
        got = list(group_samples(members(*names), url="u"))
        assert [s["__key__"] for s in got] == keys
        assert got[0] == {"__key__": keys[0], "__url__": "u"} | {
            split_name(n)[1]: n.encode()  # type: ignore[index]
            for n in names
            if split_name(n)[0] == keys[0]  # type: ignore[index]
        }

    def test_samples_know_their_offset(self) -> None:
        """Each sample is a ShardSample whose offset is its first member's header."""
        got = list(group_samples(members("README", "a.jpg", "a.cls", "b.jpg"), url="u"))
        assert all(isinstance(s, ShardSample) for s in got)
        assert [s.offset for s in got] == [1024, 3072]

    def test_spans(self) -> None:
        """spans=True: Located(sample, start, end, nth), nth counting declined samples too."""
        ms = members("a.jpg", "a.cls", "b.jpg", "c.jpg", "c.cls", "README")
        ms[2] = ms[2]._replace(data=None)  # sample b declined (another worker's)
        got = list(group_samples(ms, url="u", spans=True, first_index=10))
        assert all(type(x) is Located for x in got)
        assert [(x.sample["__key__"], x.start, x.end, x.nth) for x in got] == [
            ("a", 0, 2048, 10),
            ("c", 3072, 5120, 12),
        ]
        assert got[0].sample == {"__key__": "a", "__url__": "u", "jpg": b"a.jpg", "cls": b"a.cls"}

    def test_spans_of_an_empty_key_first(self) -> None:
        """A first member with an empty key is sample 0 like any other."""
        got = list(group_samples(members(".jpg", "b.jpg"), url="u", spans=True))
        assert [(x.sample["__key__"], x.nth) for x in got] == [("", 0), ("b", 1)]

    def test_duplicate_extension_error_and_context(self) -> None:
        """The duplicate's error names url, key, member and offset; a callable handler too."""
        seen: list[tuple[BaseException, dict[str, object]]] = []

        def skip(exc: BaseException, context: dict[str, object]) -> bool:
            seen.append((exc, context))
            return True

        got = list(group_samples(members("a.jpg", "a.JPG", "b.jpg"), url="u", handler=skip))
        assert [s["__key__"] for s in got] == ["b"]
        [(exc, context)] = seen
        assert isinstance(exc, TarFormatError)
        assert (exc.url, exc.key, exc.member, exc.offset) == ("u", "a", "a.JPG", 1024)
        assert context == {"stage": "open_tar", "url": "u", "member": "a.JPG", "key": "a"}


def broken(names: list[str], member: str | None) -> Iterator[Member]:
    """The members of ``names``, then a TarFormatError at ``member`` (the shard broke)."""
    yield from members(*names)
    msg = "truncated member"
    raise TarFormatError(msg, url="u", member=member, offset=9999)


@pytest.mark.parametrize(
    ("names", "member", "keys"),
    [
        (["a.jpg", "a.cls"], "b.jpg", ["a"]),  # the next sample had begun: a is whole
        (["a.jpg", "a.cls"], "a.txt", []),  # a may have lost its .txt
        (["a.jpg", "a.cls"], None, []),  # no name: a may be incomplete
        (["a.jpg", "a.cls"], "README", []),  # no key: it may have been a's
        (["a.jpg", "b.jpg"], "b.cls", ["a"]),  # a went out before; b is cut
        ([], "b.jpg", []),
    ],
)
@pytest.mark.parametrize("spans", [False, True])
def test_shard_breaking_keeps_only_whole_samples(
    names: list[str], member: str | None, keys: list[str], spans: bool
) -> None:
    """A broken shard: a sample is yielded only if the error is past its last member."""
    got: list[object] = []
    with pytest.raises(TarFormatError, match="truncated member"):
        got.extend(group_samples(broken(names, member), url="u", spans=spans))
    samples = [x.sample if spans else x for x in got]  # type: ignore[attr-defined]
    assert [s["__key__"] for s in samples] == keys  # type: ignore[index]
    if spans and keys:
        assert got[0] == (samples[0], 0, 1024 * names.count("a.cls") + 1024, 0)


@pytest.mark.parametrize(
    ("part", "parts", "start", "stop", "kept"),
    [
        (0, 1, 0, None, ["a", "b", "c", "d", "e"]),
        (0, 1, 1, 3, ["b", "c"]),
        (1, 2, 1, None, ["c", "e"]),
        (0, 2, 2, 4, ["c"]),
        (0, 3, 0, 5, ["a", "d"]),
        (0, 1, 5, None, []),
    ],
)
def test_part_filter_ranges(
    part: int, parts: int, start: int, stop: int | None, kept: list[str]
) -> None:
    """Samples start <= i < stop, and of those every parts-th from part."""
    keep = PartFilter(part, parts, start=start, stop=stop)
    names = [f"{k}.{e}" for k in "abcde" for e in ("jpg", "cls")]
    got = [n for n in names if keep(n)]
    assert got == [f"{k}.{e}" for k in kept for e in ("jpg", "cls")]


def test_part_filter_empty_key_first() -> None:
    """A first member with an empty key is sample 0."""
    keep = PartFilter(0, 2)
    assert [keep(n) for n in [".jpg", ".cls", "b.jpg", "c.jpg"]] == [True, True, False, True]


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
