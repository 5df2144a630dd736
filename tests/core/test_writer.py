"""Tests of the tar shard writer: numbering, splitting, key safety, WebDataset layout."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from shardpipes._core.samples import group_samples
from shardpipes._core.tar import iter_members
from shardpipes._core.writer import (
    ShardInfo,
    TarShardWriter,
    check_key,
    check_pattern,
    parse_size,
)


class _Buffer(io.BytesIO):
    """A stream that hands its bytes to the store when closed."""

    def __init__(self, store: _Store, url: str) -> None:
        super().__init__()
        self.store, self.url = store, url

    def close(self) -> None:
        if not self.closed:
            self.store.files[self.url] = self.getvalue()
        super().close()


class _Store:
    """An in-memory opener: url -> bytes written, and the order shards were opened."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.opened: list[str] = []

    def __call__(self, url: str) -> _Buffer:
        self.opened.append(url)
        return _Buffer(self, url)

    def samples(self, url: str) -> list[dict[str, Any]]:
        members = iter_members(io.BytesIO(self.files[url]), url=url)
        return list(group_samples(members, url=url))


def _sample(i: int, size: int = 100) -> dict[str, Any]:
    return {"__key__": f"s{i:03d}", "txt": bytes([i % 256]) * size}


def _write(samples: list[dict[str, Any]], **limits: Any) -> tuple[_Store, list[ShardInfo]]:
    store = _Store()
    with TarShardWriter("mem/shard-%04d.tar", opener=store, **limits) as writer:
        for sample in samples:
            writer.write(sample)
    return store, writer.shards


class TestCheckPattern:
    @pytest.mark.parametrize(
        ("pattern", "first"),
        [
            ("out/train-%06d.tar", "out/train-000000.tar"),
            ("s3://bucket/%d.tar", "s3://bucket/0.tar"),
            ("x-%i.tar", "x-0.tar"),
            ("100%%-%05d.tar", "100%-00000.tar"),
        ],
    )
    def test_accepts_one_integer_field(self, pattern: str, first: str) -> None:
        """A pattern with one integer field formats the first shard's URL."""
        assert check_pattern(pattern) % 0 == first

    @pytest.mark.parametrize(
        "pattern", ["train.tar", "%d-%d.tar", "%s.tar", "50%-%d.tar", "%06d-%.tar", "%06f.tar"]
    )
    def test_refuses_others(self, pattern: str) -> None:
        """No field, two fields, a non-integer field or a stray % is refused."""
        with pytest.raises(ValueError, match="exactly one integer field"):
            check_pattern(pattern)


class TestParseSize:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("256MB", 256_000_000),
            ("1GiB", 1 << 30),
            ("500k", 500_000),
            ("4096", 4096),
            ("64KiB", 65_536),
            ("1.5GB", 1_500_000_000),
            ("10 mb", 10_000_000),
            ("7b", 7),
        ],
    )
    def test_sizes(self, text: str, expected: int) -> None:
        """Decimal and binary units, with or without B, parse to bytes."""
        assert parse_size(text) == expected

    @pytest.mark.parametrize("text", ["", "MB", "12QB", "-5", "1iB", "0", "0.1"])
    def test_bad_sizes(self, text: str) -> None:
        """Anything else is refused with a message quoting it."""
        with pytest.raises(ValueError, match="size must"):
            parse_size(text)


class TestCheckKey:
    @pytest.mark.parametrize(
        "key", ["a", "dir/a", "a_b-c", "train/n0144_10026", "ünïcode/ключ", "x" * 300]
    )
    def test_accepts_safe_keys(self, key: str) -> None:
        """Relative paths without dots in their last component pass unchanged."""
        assert check_key(key) == key

    @pytest.mark.parametrize(
        ("key", "problem"),
        [
            ("../etc/passwd", "'..' component"),
            ("a/../../b", "'..' component"),
            ("..", "'..' component"),
            ("/etc/passwd", "absolute path"),
            ("C:/windows", "absolute path"),
            ("a\\b", "backslash"),
            ("..\\evil", "backslash"),
            ("a\0b", "NUL byte"),
            ("", "empty or '.' component"),
            ("a//b", "empty or '.' component"),
            ("a/", "empty or '.' component"),
            ("./a", "empty or '.' component"),
            ("a.b", "last component holds a dot"),
        ],
    )
    def test_refuses_unsafe_keys(self, key: str, problem: str) -> None:
        """Traversal, absolute, NUL, backslash and empty keys are refused, naming the key."""
        with pytest.raises(ValueError, match="is unsafe") as info:
            check_key(key)
        assert repr(key) in str(info.value)
        assert problem in str(info.value)

    def test_refuses_non_strings(self) -> None:
        """A key must be a string."""
        with pytest.raises(TypeError, match="__key__ must be a string"):
            check_key(b"abc")


class TestTarShardWriter:
    def test_round_trip(self) -> None:
        """Samples read back as written, fields in order, ``__`` fields left out."""
        samples = [
            {"__key__": "a/x", "__url__": "ignored", "jpg": b"\xff\xd8" * 300, "cls": "7"},
            {"__key__": "a/y", "seg.png": bytearray(b"png"), "json": '{"ü": 1}'},
        ]
        store, shards = _write(samples)
        assert shards == [ShardInfo("mem/shard-0000.tar", 2, len(store.files[shards[0].url]))]
        back = store.samples(shards[0].url)
        assert back == [
            {"__key__": "a/x", "__url__": shards[0].url, "jpg": b"\xff\xd8" * 300, "cls": b"7"},
            {
                "__key__": "a/y",
                "__url__": shards[0].url,
                "seg.png": b"png",
                "json": '{"ü": 1}'.encode(),
            },
        ]

    def test_tarfile_metadata_is_deterministic(self) -> None:
        """Members carry fixed metadata, and the same samples give the same bytes."""
        store, shards = _write([_sample(1), _sample(2)])
        again, _ = _write([_sample(1), _sample(2)])
        assert store.files == again.files
        with tarfile.open(fileobj=io.BytesIO(store.files[shards[0].url])) as tar:
            infos = tar.getmembers()
        assert [i.name for i in infos] == ["s001.txt", "s002.txt"]
        assert {(i.mtime, i.mode, i.uid, i.gid, i.uname, i.gname, i.isreg()) for i in infos} == {
            (0, 0o644, 0, 0, "", "", True)
        }

    @pytest.mark.parametrize("key", ["d" * 150 + "/" + "k" * 120, "ünïcode/ключ"])
    def test_long_and_unicode_names(self, key: str) -> None:
        """Names longer than 100 bytes or not ASCII survive both readers (pax headers)."""
        store, shards = _write([{"__key__": key, "cls": b"1"}])
        assert store.samples(shards[0].url)[0]["__key__"] == key
        with tarfile.open(fileobj=io.BytesIO(store.files[shards[0].url])) as tar:
            assert tar.getnames() == [f"{key}.cls"]

    @pytest.mark.parametrize(
        ("n", "max_samples", "counts"),
        [(10, 3, [3, 3, 3, 1]), (6, 3, [3, 3]), (5, 1, [1] * 5), (4, None, [4]), (3, 10, [3])],
    )
    def test_split_by_samples(self, n: int, max_samples: int | None, counts: list[int]) -> None:
        """A new shard starts once ``max_samples`` are in the current one."""
        store, shards = _write([_sample(i) for i in range(n)], max_samples=max_samples)
        assert [s.samples for s in shards] == counts
        assert [s.url for s in shards] == [f"mem/shard-{i:04d}.tar" for i in range(len(counts))]
        keys = [s["__key__"] for shard in shards for s in store.samples(shard.url)]
        assert keys == [f"s{i:03d}" for i in range(n)]

    @pytest.mark.parametrize(
        ("max_bytes", "counts"),
        [
            (3 * 1024 + 1024, [3, 3, 3, 1]),  # exactly three 1 KiB samples + the trailer
            (3 * 1024 + 1023, [2, 2, 2, 2, 2]),  # one byte less
            (10 * 1024 + 1024, [10]),
            (100, [1] * 10),  # every sample alone is too big: one per shard
        ],
    )
    def test_split_by_bytes(self, max_bytes: int, counts: list[int]) -> None:
        """Shards stay within ``max_bytes`` counting headers, padding and the trailer."""
        store, shards = _write([_sample(i) for i in range(10)], max_bytes=max_bytes)
        assert [s.samples for s in shards] == counts
        for shard in shards:
            assert shard.size == len(store.files[shard.url])
            assert shard.size <= max_bytes or shard.samples == 1

    def test_both_limits(self) -> None:
        """Whichever limit comes first starts the next shard."""
        _, shards = _write([_sample(i) for i in range(7)], max_bytes=10_000, max_samples=2)
        assert [s.samples for s in shards] == [2, 2, 2, 1]

    def test_nothing_written_opens_nothing(self) -> None:
        """Closing a writer that got no samples writes no shard."""
        store, shards = _write([])
        assert (store.opened, shards) == ([], [])

    def test_drops_the_unfinished_shard_on_error(self) -> None:
        """Leaving the ``with`` block by an exception removes the open shard (finished ones stay)."""
        store, removed = _Store(), []
        writer = TarShardWriter("s-%d.tar", opener=store, max_samples=1, remove=removed.append)

        def fail() -> None:
            with writer:
                writer.write(_sample(1))
                writer.write(_sample(2))  # the second shard, unfinished
                raise RuntimeError

        with pytest.raises(RuntimeError):
            fail()
        assert writer.shards == [ShardInfo("s-0.tar", 1, 2048)]
        assert store.samples("s-0.tar")[0]["__key__"] == "s001"
        assert removed == ["s-1.tar"]

    @pytest.mark.parametrize("key", ["../evil", "/abs/path", "a\0b", "a\\b", "a//b"])
    def test_refuses_unsafe_keys_and_goes_on(self, key: str) -> None:
        """An unsafe key raises ``ValueError`` naming it; the shard stays valid."""
        store = _Store()
        with TarShardWriter("s-%d.tar", opener=store) as writer:
            writer.write(_sample(1))
            with pytest.raises(ValueError, match="is unsafe") as info:
                writer.write({"__key__": key, "txt": b"x"})
            assert repr(key) in str(info.value)
            writer.write(_sample(2))
        assert [s["__key__"] for s in store.samples("s-0.tar")] == ["s001", "s002"]

    @pytest.mark.parametrize(
        ("sample", "error", "match"),
        [
            ({"__key__": "a", "a/b": b""}, ValueError, "extension of sample 'a'"),
            ({"__key__": "a", "": b""}, ValueError, "extension of sample 'a'"),
            ({"__key__": "a", ".jpg": b""}, ValueError, "extension of sample 'a'"),
            ({"__key__": "a", "cls": 3}, TypeError, "field 'cls' must be bytes or str"),
            ({"__key__": "a", "__url__": "u"}, ValueError, "no fields to write"),
            ({"txt": b"x"}, TypeError, "__key__ must be a string"),
        ],
    )
    def test_refuses_bad_samples(self, sample: dict[str, Any], error: type, match: str) -> None:
        """Bad extensions, values and empty samples are refused before anything is written."""
        store = _Store()
        writer = TarShardWriter("s-%d.tar", opener=store)
        with pytest.raises(error, match=match):
            writer.write(sample)
        assert store.opened == []

    def test_refuses_repeated_key(self) -> None:
        """A key equal to the previous sample's would merge with it on reading."""
        with TarShardWriter("s-%d.tar", opener=_Store()) as writer:
            writer.write(_sample(1))
            with pytest.raises(ValueError, match="repeats the previous sample's key"):
                writer.write(_sample(1))

    def test_repeated_key_across_shards_is_fine(self) -> None:
        """The same key at the start of the next shard cannot merge, so it is allowed."""
        _, shards = _write([_sample(1), _sample(1)], max_samples=1)
        assert [s.samples for s in shards] == [1, 1]

    @pytest.mark.parametrize(
        ("options", "error", "match"),
        [
            (
                {"max_bytes": 0},
                ValueError,
                r"max_bytes must be a positive integer or None \(got 0\)",
            ),
            ({"max_samples": -1}, ValueError, "max_samples must be a positive integer"),
            ({"max_samples": 1.5}, ValueError, "max_samples must be a positive integer"),
            ({"max_bytes": True}, ValueError, "max_bytes must be a positive integer"),
            ({"opener": "open"}, TypeError, "opener must be callable"),
        ],
    )
    def test_validates_arguments(self, options: dict[str, Any], error: type, match: str) -> None:
        """Limits must be positive integers and the opener callable."""
        kwargs: dict[str, Any] = {"opener": _Store(), **options}
        with pytest.raises(error, match=match):
            TarShardWriter("s-%d.tar", **kwargs)

    def test_counts_samples(self) -> None:
        """``samples`` counts over finished shards and the open one."""
        with TarShardWriter("s-%d.tar", opener=_Store(), max_samples=2) as writer:
            for i in range(5):
                writer.write(_sample(i))
            assert (writer.samples, len(writer.shards)) == (5, 2)
        assert writer.close() == writer.shards
