"""list_shards and split_shards."""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import shardpipes as sp
from shardpipes import NoShardsError, ShardPart
from shardpipes.pipes.shards import ShardLister
from shardpipes.pipes.split import ShardSplitter
from tests.conftest import Dataset


class TestShardLister:
    def test_braces_keep_order_and_padding(
        self, make_shards: Callable[..., Dataset], tmp_path: Path
    ) -> None:
        """Brace patterns expand in order with zero padding (unchecked: without storage)."""
        pattern = str(tmp_path / "x-{000008..000010}.tar")
        expected = [str(tmp_path / f"x-{i:06d}.tar") for i in (8, 9, 10)]
        assert list(ShardLister(pattern, check_exists=False)) == expected

    def test_glob_sorted_and_given_order_kept(
        self, make_shards: Callable[..., Dataset], tmp_path: Path
    ) -> None:
        """Each glob is sorted; the list of patterns keeps its order."""
        data = make_shards(3, 1)
        root = tmp_path / "shards"
        got = list(ShardLister([str(root / "train-000002.tar"), str(root / "train-00000[01].tar")]))
        assert got == [data.urls[2], data.urls[0], data.urls[1]]
        assert len(ShardLister(str(root / "*.tar"))) == 3

    def test_recursive_glob_and_file_urls(
        self, make_shards: Callable[..., Dataset], tmp_path: Path
    ) -> None:
        """`**` recurses; file:// patterns give file:// URLs."""
        make_shards(2, 1)
        assert len(ShardLister(str(tmp_path / "**" / "*.tar"))) == 2
        assert all(u.startswith("file://") for u in ShardLister(f"file://{tmp_path}/shards/*.tar"))

    def test_memory_filesystem(self, memfs: fsspec.AbstractFileSystem) -> None:
        """Any fsspec protocol lists, memory:// included."""
        for i in range(4):
            memfs.pipe(f"/b/t-{i}.tar", b"")
        assert [u.rsplit("/", 1)[1] for u in ShardLister("memory://b/t-*.tar")] == [
            f"t-{i}.tar" for i in range(4)
        ]

    def test_no_match_quotes_pattern(self, tmp_path: Path) -> None:
        """A glob that matches nothing raises NoShardsError quoting it."""
        pattern = str(tmp_path / "nothing-*.tar")
        with pytest.raises(NoShardsError, match=re.escape(f"{pattern}: no shard matches")):
            list(ShardLister(pattern))

    def test_missing_shards_found_before_the_first(self, memfs: fsspec.AbstractFileSystem) -> None:
        """Listed shards are checked first: nothing is yielded if one is missing."""
        memfs.pipe("/m/t-0.tar", b"")
        memfs.pipe("/m/t-2.tar", b"")
        lister = ShardLister(["memory://m/t-*.tar", "memory://m/t-{0..3}.tar"])
        with pytest.raises(sp.ShardNotFoundError) as info:
            next(iter(lister))
        assert str(info.value) == (
            "memory://m/t-1.tar: no such file (2 of 6 shards missing: "
            "memory://m/t-1.tar, memory://m/t-3.tar)"
        )
        unchecked = ShardLister("memory://m/t-{0..3}.tar", check_exists=False)
        assert len(unchecked) == 4
        with pytest.raises(sp.ShardNotFoundError, match=r"^memory://m/t-9\.tar: no such file$"):
            list(ShardLister("memory://m/t-9.tar"))
        with pytest.raises(ValueError, match="retries must be a non-negative int"):
            ShardLister("memory://m/t-0.tar", retries=-1)

    @pytest.mark.parametrize("urls", [[], 3, [b"x"]])
    def test_bad_urls(self, urls: object) -> None:
        """Non-string or empty url lists are refused at construction."""
        with pytest.raises(TypeError, match="urls must be"):
            ShardLister(urls)  # type: ignore[arg-type]

    def test_bad_braces_fail_at_construction(self) -> None:
        """An unbalanced brace is reported when the pipe is built, not in a worker."""
        with pytest.raises(ValueError, match="unbalanced"):
            ShardLister("a{0..3.tar")


class TestFirstHour:
    """What a new user's first globs and folders meet (issue 24 §2, §3)."""

    def test_a_glob_leaves_out_our_own_sidecars(
        self, make_shards: Callable[..., Dataset], tmp_path: Path
    ) -> None:
        """train-* matches train-classes.json and *.tar.idx too: they are not shards."""
        data = make_shards(2, 3)
        for url in data.urls:
            sp.write_index(url)
        root = tmp_path / "shards"
        (root / "train-classes.json").write_text('{"classes": ["a"]}')
        assert list(ShardLister(str(root / "train-*"))) == data.urls
        samples = list(sp.list_shards(str(root / "train-*")).split_shards().open_tar())
        assert sorted(s["__key__"] for s in samples) == sorted(data.keys)

    @pytest.mark.parametrize("suffix", ["", "/"])
    def test_a_folder_is_named_as_one(
        self, make_shards: Callable[..., Dataset], tmp_path: Path, suffix: str
    ) -> None:
        make_shards(1, 2)
        folder = str(tmp_path / "shards") + suffix
        with pytest.raises(NoShardsError, match=r"a folder, not a shard: give the shards in it, "):
            list(ShardLister(folder))
        with pytest.raises(NoShardsError, match=re.escape(f"'{tmp_path / 'shards'}/*.tar'")):
            list(sp.recipes.tar_shards(folder))

    def test_a_file_that_is_no_tar_says_so(self, tmp_path: Path) -> None:
        notes = tmp_path / "train-notes.txt"
        notes.write_text("not a tar " * 100)
        with pytest.raises(
            sp.TarFormatError, match=r"not a tar archive: .* is 'train-notes.txt' a"
        ):
            list(sp.list_shards(str(notes)).open_tar())

    def test_world_size_without_a_process_group_is_refused(
        self, make_shards: Callable[..., Dataset], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under torchrun (WORLD_SIZE) without init_process_group each rank would read all."""
        data = make_shards(2, 2)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ValueError, match=r"WORLD_SIZE=2 .*init_process_group\(\)"):
            list(sp.list_shards(data.urls).split_shards().open_tar())
        monkeypatch.setenv("WORLD_SIZE", "1")
        assert len(list(sp.list_shards(data.urls).split_shards().open_tar())) == 4


class TestShardSplitter:
    URLS = [f"s{i}" for i in range(5)]

    def test_no_sharding_yields_all_whole(self) -> None:
        """Without apply_sharding every shard comes whole, in order (shuffle=False)."""
        pipe = ShardSplitter(IterableWrapper(self.URLS), shuffle=False)
        assert list(pipe) == [ShardPart(u) for u in self.URLS]

    def test_shuffles_by_default(self) -> None:
        """split_shards shuffles the shard order by default, as the recipes do (issue 24 §8)."""
        pipe = ShardSplitter(IterableWrapper(self.URLS))
        assert pipe.shuffle_shards
        orders = {tuple(p.url for p in pipe) for _ in range(4)}  # four epochs
        assert all(sorted(order) == sorted(self.URLS) for order in orders)
        assert len(orders) > 1

    @pytest.mark.parametrize(("n", "total"), [(5, 2), (5, 5), (2, 5), (1, 4)])
    def test_union_over_workers(self, n: int, total: int) -> None:
        """Over all workers each shard is covered by parts that add up to the whole."""
        got = []
        for w in range(total):
            pipe = ShardSplitter(IterableWrapper(self.URLS[:n]))
            pipe.apply_sharding(total, w)
            got += list(pipe)
            assert len(pipe) == len(list(pipe))
        for url in self.URLS[:n]:
            parts = sorted(p.part for p in got if p.url == url)
            assert parts == list(range(next(p.parts for p in got if p.url == url)))

    def test_fixed_seed_same_order_every_time_and_epoch_changes_it(self) -> None:
        """With seed given, the order depends on (seed, epoch) only."""
        urls = [f"u{i}" for i in range(30)]
        a = ShardSplitter(IterableWrapper(urls), shuffle=True, seed=7)
        b = ShardSplitter(IterableWrapper(urls), shuffle=True, seed=7)
        b.set_seed(12345)  # the DataLoader's seed does not override a fixed one
        first = list(a)
        assert first == list(b)
        assert sorted(p.url for p in first) == sorted(urls) and [p.url for p in first] != urls
        second = list(a)  # iterating again is the next epoch
        assert second != first and sorted(second) == sorted(first)
        a.set_epoch(0)
        assert list(a) == first
        a.set_epoch(1)
        assert list(a) == second

    def test_shared_seed_from_loader(self) -> None:
        """Without a fixed seed, set_seed (the DataLoader's shared seed) picks the order."""
        urls = [f"u{i}" for i in range(30)]
        a = ShardSplitter(IterableWrapper(urls), shuffle=True).set_seed(3)
        b = pickle.loads(pickle.dumps(a))
        assert list(a) == list(b)

    def test_bad_seed(self) -> None:
        """A non-integer seed is refused."""
        with pytest.raises(TypeError, match="seed must be an integer"):
            ShardSplitter(IterableWrapper([]), seed="x")  # type: ignore[arg-type]

    def test_placement_from_worker_info_and_distributed_without_a_dataloader(self) -> None:
        """Not sharded by a DataLoader: one worker, one rank -> everything, whole."""
        parts = ShardSplitter(IterableWrapper(["a", "b", "c"]))
        assert parts.placement() == (1, 0)
        assert sorted(p.url for p in parts) == ["a", "b", "c"]

    def test_even_split_reads_counts_and_byte_spans(
        self, make_shards: Callable[..., Dataset]
    ) -> None:
        """even=True: equal sample counts per worker, each block with its byte range."""
        data = make_shards(3, [5, 2, 4])  # 11 samples, 3 workers: 3 each, 2 dropped
        spans = []
        for worker in range(3):
            parts = ShardSplitter(IterableWrapper(data.urls), even=True)
            parts.apply_sharding(3, worker)
            got = list(parts)
            assert sum(p.stop - p.start for p in got) == 3
            assert all(p.span is not None and p.span[0] < p.span[1] for p in got)
            spans += [(p.url, p.span) for p in got]
        assert len(set(spans)) == len(spans)

    def test_even_split_with_fewer_samples_than_workers_fails_at_once(
        self, make_shards: Callable[..., Dataset]
    ) -> None:
        """3 samples for 4 workers cannot be split evenly: a clear error, no hang."""
        data = make_shards(1, 3)
        parts = ShardSplitter(IterableWrapper(data.urls), even=True)
        parts.apply_sharding(4, 0)
        with pytest.raises(ValueError, match="3 samples in 1 shards for 4 workers"):
            list(parts)

    def test_set_epoch_reaches_every_splitter(self) -> None:
        """sp.set_epoch sets the epoch of the split_shards stages of a chain."""
        parts = ShardSplitter(IterableWrapper(["a", "b"]), shuffle=True, seed=1)
        pipe = parts.map(str)
        assert sp.set_epoch(pipe, 4) is pipe and parts.epoch == 4
        with pytest.raises(ValueError, match="epoch must be a non-negative int"):
            parts.set_epoch(-1)


def test_paths_are_taken_as_urls(make_shards: Callable[..., Dataset]) -> None:
    """A pathlib.Path, or a list of them, lists as its string does."""
    data = make_shards(2, 3)
    assert list(sp.list_shards(Path(data.urls[0]))) == [data.urls[0]]
    assert list(sp.list_shards([Path(u) for u in data.urls])) == data.urls
    with pytest.raises(TypeError, match="urls must be a string or a non-empty list"):
        sp.list_shards(3)  # type: ignore[arg-type]
