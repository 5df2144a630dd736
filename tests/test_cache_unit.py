"""shardpipes.fs.cache.ShardCache driven directly, on a folder of tmp_path.

What mutation testing found that the end-to-end cache tests (tests/cloud/test_cache.py)
leave open: the entry names a later run must find again, the edges of the ranges a block
covers, the files in the folder (reservation, records, the lock), and which entries
eviction takes and how many.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardpipes.fs.cache import ShardCache, cache_bytes

URL = "s3://bucket/dir/train 001?.tar"


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def held(folder: Path) -> int:
    """Bytes of the entries and downloads in progress (not the lock nor the records)."""
    return sum(p.stat().st_size for p in folder.iterdir() if not p.name.endswith(".ranges"))


def test_entries_are_named_by_the_urls_hash_and_file_name(tmp_path: Path) -> None:
    """A later run (a new ShardCache on the folder) finds the same names."""
    folder = tmp_path / "new" / "cache"
    cache = ShardCache(folder, 1000)
    assert folder.is_dir()
    assert cache.entry(URL) == folder / "148dfc755bc8ac0ccf04-train_001_.tar"
    assert cache.entry("s3://bucket/other/train 001?.tar").name == (
        "238a66ed7016421a05bb-train_001_.tar"
    )
    assert cache.entry("https://h/shards/").name.endswith("-shards")
    long = cache.entry("s3://b/" + "x" * 100 + ".tar").name
    assert long.endswith("-" + "x" * 80)
    assert ShardCache(folder, 5).entry(URL) == cache.entry(URL)


def test_a_whole_shard_is_an_entry_found_by_lookup(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    assert cache.lookup(URL) is None
    cache.fill(URL, 300, 0, b"a" * 300)
    entry = cache.lookup(URL)
    assert entry == cache.entry(URL)
    assert entry.read_bytes() == b"a" * 300
    assert names(tmp_path) == {".lock", entry.name}
    assert cache.read(URL, 290, 10) == b"a" * 10
    assert ShardCache(tmp_path, 1000).read(URL, 0, 3) == b"aaa"  # found by a later run


def test_a_shard_being_filled_is_a_reserved_file_and_a_record(tmp_path: Path) -> None:
    """``<entry>.part`` of the full size, from its first block; ``<entry>.ranges`` beside it."""
    cache = ShardCache(tmp_path, 1000)
    entry = cache.entry(URL)
    cache.fill(URL, 600, 100, b"b" * 50)
    assert names(tmp_path) == {".lock", f"{entry.name}.part", f"{entry.name}.ranges"}
    assert (tmp_path / f"{entry.name}.part").stat().st_size == 600
    assert cache.lookup(URL) is None
    cache.fill(URL, 600, 0, b"a" * 100)
    cache.fill(URL, 600, 150, b"c" * 450)
    assert names(tmp_path) == {".lock", entry.name}
    assert entry.read_bytes() == b"a" * 100 + b"b" * 50 + b"c" * 450


def test_blocks_are_served_exactly_where_written(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    data = bytes(range(200))
    cache.fill(URL, 1000, 100, data)  # bytes 100..300
    assert cache.read(URL, 100, 200) == data
    assert cache.read(URL, 150, 10) == data[50:60]
    assert cache.read(URL, 299, 1) == data[-1:]
    assert cache.read(URL, 99, 10) is None
    assert cache.read(URL, 100, 201) is None
    assert cache.read(URL, 300, 1) is None
    assert cache.read("s3://bucket/elsewhere.tar", 100, 10) is None


def test_ranges_that_touch_or_overlap_merge(tmp_path: Path) -> None:
    """Adjacent, overlapping and contained blocks: the entry is published once all is there."""
    cache = ShardCache(tmp_path, 10_000)
    cache.fill(URL, 400, 0, b"a" * 300)
    cache.fill(URL, 400, 100, b"b" * 100)  # inside the first
    assert cache.read(URL, 0, 300) == b"a" * 100 + b"b" * 100 + b"a" * 100
    cache.fill(URL, 400, 300, b"c" * 100)  # touching it: the whole shard
    assert cache.lookup(URL) is not None
    other = "s3://bucket/other.tar"
    cache.fill(other, 400, 200, b"y" * 200)
    cache.fill(other, 400, 0, b"x" * 250)  # overlapping
    assert cache.read(other, 0, 400) == b"x" * 250 + b"y" * 150
    assert cache.lookup(other) is not None


def test_a_shard_missing_only_its_first_byte_is_not_whole(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    cache.fill(URL, 100, 1, b"a" * 99)
    assert cache.lookup(URL) is None
    assert cache.read(URL, 0, 1) is None
    cache.fill(URL, 100, 0, b"z")
    assert cache.read(URL, 0, 100) == b"z" + b"a" * 99
    assert cache.lookup(URL) is not None


def test_a_whole_entry_is_not_written_again(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    cache.fill(URL, 100, 0, b"a" * 100)
    cache.fill(URL, 100, 0, b"z" * 100)
    assert cache.read(URL, 0, 100) == b"a" * 100
    assert names(tmp_path) == {".lock", cache.entry(URL).name}


@pytest.mark.parametrize("record", ["", "[[0, 10", "not json"])
def test_a_broken_record_serves_nothing(tmp_path: Path, record: str) -> None:
    """A record cut short (a process killed while writing it): its blocks are not trusted."""
    cache = ShardCache(tmp_path, 1000)
    cache.fill(URL, 100, 0, b"a" * 10)
    Path(f"{cache.entry(URL)}.ranges").write_text(record)
    assert cache.read(URL, 0, 10) is None
    cache.fill(URL, 100, 10, b"b" * 90)
    assert cache.read(URL, 10, 90) == b"b" * 90
    assert cache.read(URL, 0, 10) is None


def test_a_shard_larger_than_the_bound_is_not_cached(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    cache.fill("s3://b/fits.tar", 1000, 0, b"f" * 10)  # exactly the bound
    cache.fill(URL, 1001, 0, b"a" * 10)
    assert cache.read("s3://b/fits.tar", 0, 10) == b"f" * 10
    assert cache.read(URL, 0, 10) is None
    assert names(tmp_path) == {
        ".lock",
        *(f"{cache.entry('s3://b/fits.tar').name}{s}" for s in (".part", ".ranges")),
    }


def test_eviction_takes_the_least_recently_used_and_no_more(tmp_path: Path) -> None:
    """Three entries of 300 in 1000: a fourth of 400 evicts exactly the one used longest ago."""
    cache = ShardCache(tmp_path, 1000)
    a, b, c, d = (f"s3://b/{n}.tar" for n in "abcd")
    for url in (a, b, c):
        cache.fill(url, 300, 0, url[-5:-4].encode() * 300)
    assert cache.lookup(a) is not None  # a is used again: b is now the oldest
    cache.fill(d, 400, 0, b"d" * 400)
    assert [cache.lookup(u) is not None for u in (a, b, c, d)] == [True, False, True, True]
    assert held(tmp_path) == 1000
    assert cache.read(c, 0, 1) == b"c"  # read: c is newer than a now
    cache.fill(b, 300, 0, b"b" * 300)
    assert [cache.lookup(u) is not None for u in (a, b, c, d)] == [False, True, True, True]


def test_eviction_takes_complete_entries_before_partial_ones(tmp_path: Path) -> None:
    """A partial entry goes after every complete one, newer or not; its record goes with it."""
    cache = ShardCache(tmp_path, 1000)
    part, whole, new = "s3://b/part.tar", "s3://b/whole.tar", "s3://b/new.tar"
    cache.fill(part, 500, 0, b"p" * 10)
    cache.fill(whole, 400, 0, b"w" * 400)  # newer than the partial one
    cache.fill(new, 300, 0, b"n" * 300)  # 1200 > 1000: the complete one goes
    assert cache.lookup(whole) is None
    assert cache.read(part, 0, 10) == b"p" * 10
    cache.fill("s3://b/big.tar", 600, 0, b"g" * 10)  # 1400 > 1000: new, then the partial one
    assert cache.lookup(new) is None
    assert cache.read(part, 0, 10) is None
    assert not any(n.startswith(cache.entry(part).name) for n in names(tmp_path))
    assert cache.read("s3://b/big.tar", 0, 10) == b"g" * 10
    assert held(tmp_path) == 600


def test_partial_entries_are_refreshed_by_writes_and_reads(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    one, two = "s3://b/one.tar", "s3://b/two.tar"
    cache.fill(one, 400, 0, b"1" * 10)
    cache.fill(two, 400, 0, b"2" * 10)
    cache.fill(one, 400, 10, b"1" * 10)  # one is newer now
    cache.fill("s3://b/three.tar", 400, 0, b"3")  # evicts two
    assert cache.read(one, 0, 20) == b"1" * 20
    assert cache.read(two, 0, 10) is None
    cache.fill(two, 400, 0, b"2" * 10)  # evicts three, which one's read made the oldest
    assert cache.read("s3://b/three.tar", 0, 1) is None
    assert cache.read(one, 0, 20) == b"1" * 20


def test_the_bound_holds_while_shards_fill_side_by_side(tmp_path: Path) -> None:
    """Each shard's full size is reserved at its first block: two of 600 never share 1000."""
    cache = ShardCache(tmp_path, 1000)
    urls = ["s3://b/x.tar", "s3://b/y.tar"]
    for offset in range(0, 600, 100):
        for url in urls:
            cache.fill(url, 600, offset, url[-5:-4].encode() * 100)
            assert held(tmp_path) <= 1000
            assert sum(n.endswith(".part") for n in names(tmp_path)) == 1
    assert cache.read(urls[1], 500, 100) == b"y" * 100


def test_a_download_left_without_its_record_is_evicted(tmp_path: Path) -> None:
    """A process killed between reserving a shard and recording its first block."""
    cache = ShardCache(tmp_path, 1000)
    cache.fill(URL, 600, 0, b"a" * 10)
    Path(f"{cache.entry(URL)}.ranges").unlink()
    cache.fill("s3://b/next.tar", 600, 0, b"n" * 600)
    assert names(tmp_path) == {".lock", cache.entry("s3://b/next.tar").name}


def test_eviction_never_takes_the_lock(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 100)
    for n in range(5):
        cache.fill(f"s3://b/{n}.tar", 100, 0, b"z" * 100)
        assert ".lock" in names(tmp_path)
    assert names(tmp_path) == {".lock", cache.entry("s3://b/4.tar").name}


def test_an_entry_evicted_meanwhile_is_a_miss(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, 1000)
    cache.fill(URL, 10, 0, b"a" * 10)
    os.unlink(cache.entry(URL))  # another process's eviction
    assert cache.read(URL, 0, 10) is None
    assert cache.lookup(URL) is None


def test_the_bound_as_bytes() -> None:
    assert cache_bytes("20GB") == 20 * 10**9
    assert cache_bytes("512MiB") == 512 * 2**20
    assert cache_bytes(1) == 1
    with pytest.raises(ValueError, match=r"^cache_size must be at least 1 byte \(got 0\)$"):
        cache_bytes(0)
    with pytest.raises(ValueError, match=r"^cache_size: size must look like"):
        cache_bytes("lots")
    with pytest.raises(TypeError, match=r"^cache_size must be bytes or a text such as '20GB' "):
        cache_bytes(2.5)  # type: ignore[arg-type]
