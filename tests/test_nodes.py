"""``sp.to_node`` (issue 15 §4): a pipeline at the root of a ``torchdata.nodes`` graph.

``torchdata.nodes.Loader`` over it resumes exactly, alone and under ``ParallelMapper`` and
``Batcher``; each new iteration is the next epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from torchdata.nodes import Batcher, Loader, ParallelMapper

import shardpipes as sp
from tests.conftest import Dataset


@pytest.fixture
def data(make_shards: Callable[..., Dataset]) -> Dataset:
    return make_shards(5, [17, 23, 9, 30, 14])


def recipe(data: Dataset) -> Any:
    return sp.recipes.tar_shards(data.urls, fields=("__key__", "cls"), seed=4, buffer_size=10)


def keys(items: Any) -> list[str]:
    return [key for key, _ in items]


def test_an_epoch_is_every_sample_once_and_the_next_differs(data: Dataset) -> None:
    loader = Loader(sp.to_node(recipe(data)))
    first, second = keys(loader), keys(loader)
    assert Counter(first) == Counter(data.keys)
    assert Counter(second) == Counter(data.keys)
    assert first != second  # the next epoch, in a new order


@pytest.mark.parametrize("stop", [0, 1, 29, 92])
def test_the_loader_resumes_exactly(data: Dataset, stop: int) -> None:
    whole = keys(Loader(sp.to_node(recipe(data))))
    loader = Loader(sp.to_node(recipe(data)))
    it = iter(loader)
    before = [next(it)[0] for _ in range(stop)]
    state = loader.state_dict()
    again = Loader(sp.to_node(recipe(data)))
    again.load_state_dict(state)
    assert before + keys(again) == whole


def test_under_parallel_mapper_and_batcher(data: Dataset) -> None:
    """A chain of sample dicts, mapped on 2 threads and batched by torchdata.nodes."""

    def graph() -> Loader:
        chain = sp.list_shards(data.urls).split_shards(shuffle=True, seed=2).open_tar()
        node = ParallelMapper(
            sp.to_node(chain), map_fn=lambda s: s["__key__"], num_workers=2, method="thread"
        )
        return Loader(Batcher(node, batch_size=5, drop_last=False))

    whole = [k for batch in graph() for k in batch]
    assert Counter(whole) == Counter(data.keys)
    loader = graph()
    it = iter(loader)
    before = [k for _ in range(7) for k in next(it)]
    state = loader.state_dict()
    again = graph()
    again.load_state_dict(state)
    assert before + [k for batch in again for k in batch] == whole


def test_what_cannot_be_resumed_is_refused(data: Dataset) -> None:
    chain = sp.list_shards(data.urls).open_tar().shuffle()
    with pytest.raises(ValueError, match="cannot be resumed exactly"):
        sp.to_node(chain)
    with pytest.raises(TypeError, match="to_node takes a shardpipes pipeline"):
        sp.to_node([1, 2])  # type: ignore[arg-type]
    node = sp.to_node(recipe(data))
    with pytest.raises(ValueError, match="not a state of to_node"):
        node.reset({"something": 1})


@pytest.mark.parametrize("stop", [1, 5, 11])
def test_cycle_limit_and_prefetch_resume_under_the_loader(data: Dataset, stop: int) -> None:
    """An endless cycle cut at 150 samples, batched and prefetched: the same rest."""

    def make() -> Any:
        return recipe(data).cycle_epochs().limit_samples(150).batch(7).prefetch_items(3)

    def batches(loader: Any) -> list[list[str]]:
        return [keys(batch) for batch in loader]

    whole = batches(Loader(sp.to_node(make())))
    assert sum(map(len, whole)) == 150
    first = Loader(sp.to_node(make()))
    items = iter(first)
    before = [keys(next(items)) for _ in range(stop)]
    state = first.state_dict()
    second = Loader(sp.to_node(make()))
    second.load_state_dict(state)
    assert before + batches(second) == whole
