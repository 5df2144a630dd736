"""The contract every pipe keeps, parametrized over all of them."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, IterDataPipe

import shardpipes as sp
from tests.conftest import Dataset


def _samples(urls: list[str]) -> IterDataPipe[Any]:
    """The samples of ``urls`` in a fixed shard order, for the stages that take samples."""
    return sp.list_shards(urls).split_shards(shuffle=False).open_tar()


# name -> (constructor form, functional form); each takes the shard URLs
Build = Callable[[list[str]], IterDataPipe[Any]]
CASES: dict[str, tuple[Build, Build]] = {
    "list_shards": (
        lambda urls: sp.ShardLister(urls),
        lambda urls: sp.list_shards(urls),
    ),
    "split_shards": (
        lambda urls: sp.ShardSplitter(sp.ShardLister(urls), shuffle=True, seed=3),
        lambda urls: sp.list_shards(urls).split_shards(shuffle=True, seed=3),
    ),
    "open_tar": (
        lambda urls: sp.TarOpener(sp.ShardSplitter(sp.ShardLister(urls))),
        lambda urls: sp.list_shards(urls).split_shards().open_tar(),
    ),
    "decode": (
        lambda urls: sp.SampleDecoder(
            sp.TarOpener(sp.ShardSplitter(sp.ShardLister(urls))), "numpy"
        ),
        lambda urls: sp.list_shards(urls).split_shards().open_tar().decode("numpy"),
    ),
    "to_tuple": (
        lambda urls: sp.TupleMaker(
            sp.TarOpener(sp.ShardSplitter(sp.ShardLister(urls))), "cls", "png"
        ),
        lambda urls: sp.list_shards(urls).split_shards().open_tar().to_tuple("cls", "png"),
    ),
    "shuffle_samples": (
        lambda urls: sp.SampleShuffler(_samples(urls), 4, seed=5),
        lambda urls: _samples(urls).shuffle_samples(4, seed=5),
    ),
    "rename_fields": (
        lambda urls: sp.FieldRenamer(_samples(urls), label="cls"),
        lambda urls: _samples(urls).rename_fields(label="cls"),
    ),
    "map_fields": (
        lambda urls: sp.FieldMapper(_samples(urls), cls=bytes.upper),
        lambda urls: _samples(urls).map_fields(cls=bytes.upper),
    ),
    "limit_samples": (
        lambda urls: sp.SampleLimiter(_samples(urls), 10),
        lambda urls: _samples(urls).limit_samples(10),
    ),
    "cycle_epochs": (
        lambda urls: sp.EpochCycler(_samples(urls), 2),
        lambda urls: _samples(urls).cycle_epochs(2),
    ),
    "prefetch_items": (
        lambda urls: sp.ItemPrefetcher(_samples(urls), 3),
        lambda urls: _samples(urls).prefetch_items(3),
    ),
}
# pipes whose length needs no sample count (a known list): every other one's needs the
# shards' counts, which gzip shards without .idx sidecars do not give cheaply
SIZED = {"list_shards", "split_shards"}


def ident(item: Any) -> str:
    """A hashable identity of any pipe output."""
    if isinstance(item, sp.ShardPart):
        return repr(tuple(item))
    if isinstance(item, dict):
        return str(item["__key__"])
    if isinstance(item, tuple | list):  # the DataLoader turns tuples into lists
        return repr((item[0], bytes(item[1])))
    return str(item)


@pytest.fixture
def urls(make_shards: Callable[..., Dataset]) -> list[str]:
    return make_shards(3, [4, 5, 6], images=True).urls


@pytest.mark.parametrize("name", sorted(CASES))
class TestContract:
    def test_functional_form_equals_constructor(self, name: str, urls: list[str]) -> None:
        """The functional form builds the same pipe as the class."""
        by_class, by_name = (build(urls) for build in CASES[name])
        assert type(by_class) is type(by_name)
        assert [ident(x) for x in by_class] == [ident(x) for x in by_name]

    def test_pickle_round_trip(self, name: str, urls: list[str]) -> None:
        """A pickled and restored pipe gives the same output."""
        pipe = CASES[name][0](urls)
        assert [ident(x) for x in pickle.loads(pickle.dumps(pipe))] == [ident(x) for x in pipe]

    def test_iterating_again_gives_everything_again(self, name: str, urls: list[str]) -> None:
        """A second iteration (reset, the next epoch) yields the full output again."""
        pipe = CASES[name][0](urls)
        first = [ident(x) for x in pipe]
        assert first
        assert sorted(ident(x) for x in pipe) == sorted(first)
        if name != "list_shards":  # the first epoch again: the same order
            sp.set_epoch(pipe, 0)
            assert [ident(x) for x in pipe] == first

    def test_len_exact_or_standard_type_error(
        self, name: str, urls: list[str], make_shards: Callable[..., Dataset], tmp_path: Path
    ) -> None:
        """len() is exact where defined, else torch's standard TypeError."""
        pipe = CASES[name][0](urls)  # local .tar shards: counted from their headers
        assert len(pipe) == len(list(pipe))
        packed = make_shards(3, [4, 5, 6], images=True, base=str(tmp_path), suffix=".tar.gz")
        pipe = CASES[name][0](packed.urls)
        if name in SIZED:
            assert len(pipe) == len(list(pipe))
        else:
            with pytest.raises(TypeError, match="instance doesn't have valid length"):
                len(pipe)

    @pytest.mark.slow
    def test_two_workers_union_equals_single_process(self, name: str, urls: list[str]) -> None:
        """Over 2 DataLoader workers the outputs equal single-process's, none repeated."""
        pipe = CASES[name][1](urls)
        if name == "list_shards":
            pipe = pipe.sharding_filter()
        single = Counter(ident(x) for x in pipe)
        multi = Counter(ident(x) for x in DataLoader(pipe, batch_size=None, num_workers=2))
        assert multi == single  # each item as often as in one process
        passes = 2 if name == "cycle_epochs" else 1
        assert set(multi.values()) == {passes}


def test_every_functional_form_of_shardpipes_is_in_the_contract() -> None:
    """Each ``pipe.<name>(...)`` that shardpipes registers has its row above."""
    ours = {
        name
        for name, form in IterDataPipe.functions.items()
        if getattr(form, "__module__", None) == "shardpipes.pipes._stage"
    }
    assert len(ours) >= 10, ours  # the registration is what is found (not nothing)
    assert ours <= set(CASES), sorted(ours - set(CASES))
