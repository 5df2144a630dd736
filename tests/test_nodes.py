"""``sp.to_node`` (issue 15 §4): a pipeline at the root of a ``torchdata.nodes`` graph.

``torchdata.nodes.Loader`` over it resumes exactly, alone and under ``ParallelMapper`` and
``Batcher``; each new iteration is the next epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torchdata.nodes import Batcher, Loader, MultiNodeWeightedSampler, ParallelMapper, StopCriteria

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
    shuffled = sp.list_shards(data.urls).open_tar().shuffle()
    with pytest.raises(ValueError, match="cannot be resumed exactly"):
        sp.to_node(shuffled)
    with pytest.raises(TypeError, match=r"pipeline \(got list\): .*IterableWrapper"):
        sp.to_node([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"\(got DataLoader\): give it the pipe itself"):
        sp.to_node(torch.utils.data.DataLoader(recipe(data)))  # type: ignore[arg-type]
    pairs = sp.recipes.tensors(torch.zeros(4, 2), torch.zeros(4))
    with pytest.raises(TypeError, match=r"\(got TensorPairs\): this is a map-style dataset: use"):
        sp.to_node(pairs)  # type: ignore[arg-type]
    assert [s["__key__"] for s in sp.to_node(sp.Resumable(chain(data, 1)))]  # takes a wrapper
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


def chain(data: Dataset, seed: int) -> Any:
    return (
        sp.list_shards(data.urls)
        .split_shards(shuffle=True, seed=seed)
        .open_tar()
        .shuffle_samples(buffer_size=10, seed=seed)
    )


def test_a_loaded_state_then_a_plain_reset_begins_the_next_epoch(data: Dataset) -> None:
    """reset(state), then reset() before any item: the epoch after the state's, not it again.

    MultiNodeWeightedSampler does this: it loads its sources, then resets them all at its
    next epoch, also those it never drew from again.
    """
    reference = sp.to_node(chain(data, 5))
    reference.reset()
    epochs = [[s["__key__"] for s in reference]]
    reference.reset()
    epochs.append([s["__key__"] for s in reference])
    for stop in (40, len(data.keys)):
        node = sp.to_node(chain(data, 5))
        node.reset()
        for _ in range(stop):
            next(node)
        state = node.get_state()
        again = sp.to_node(chain(data, 5))
        again.reset(state)
        again.reset()
        assert [s["__key__"] for s in again] == epochs[1]


@pytest.mark.parametrize(
    "criteria",
    [
        StopCriteria.ALL_DATASETS_EXHAUSTED,
        StopCriteria.FIRST_DATASET_EXHAUSTED,
        StopCriteria.CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED,
    ],
)
def test_multi_node_weighted_sampler_over_two_nodes_resumes_exactly(
    make_shards: Callable[..., Dataset], tmp_path: Path, criteria: str
) -> None:
    """Two to_node sources (93 and 36 samples) drawn 1:1, stopped at several points.

    The rest of the epoch and the next one are the uninterrupted run's, item for item,
    also after a source ran out before the checkpoint.
    """
    (tmp_path / "b").mkdir()
    a = make_shards(5, [17, 23, 9, 30, 14])
    b = make_shards(3, [12, 12, 12], base=str(tmp_path / "b"))

    def make() -> Loader:
        nodes = {"a": sp.to_node(chain(a, 1)), "b": sp.to_node(chain(b, 2))}
        weights = {"a": 1.0, "b": 1.0}
        return Loader(MultiNodeWeightedSampler(nodes, weights, stop_criteria=criteria, seed=3))

    def named(items: Any) -> list[str]:
        return [s["__url__"].rsplit("/", 2)[-2] + ":" + s["__key__"] for s in items]

    reference = make()
    epochs = [named(reference), named(reference)]
    if criteria == StopCriteria.ALL_DATASETS_EXHAUSTED:
        assert Counter(epochs[0]) == Counter(f"shards:{k}" for k in a.keys) + Counter(
            f"b:{k}" for k in b.keys
        )
    for stop in (1, 30, 60, len(epochs[0]) - 1, len(epochs[0])):
        first = make()
        items = iter(first)
        before = named(next(items) for _ in range(stop))
        state = first.state_dict()
        second = make()
        second.load_state_dict(state)
        if stop < len(epochs[0]):
            assert before + named(second) == epochs[0], stop
        # (the Loader begins the next epoch at once from a state at an epoch's end)
        assert named(second) == epochs[1], stop


def test_a_pipe_that_reads_no_shard_is_refused(data: Dataset) -> None:
    """Shard URLs alone: a checkpoint could not say which were consumed; refused, not replayed."""
    with pytest.raises(ValueError, match=r"reads no shard.*open_tar"):
        sp.to_node(sp.list_shards(data.urls).split_shards(shuffle=True, seed=1))


def test_a_mix_under_the_loader_resumed_near_its_end(
    make_shards: Callable[..., Dataset], tmp_path: Path
) -> None:
    """to_node(mix): resumed after one source is spent, the rest and the next epoch whole."""
    (tmp_path / "b").mkdir()
    a = make_shards(3, [20, 25, 15])
    b = make_shards(2, [8, 7], base=str(tmp_path / "b"))

    def make() -> Loader:
        return Loader(sp.to_node(sp.mix({"a": chain(a, 1), "b": chain(b, 2)}, seed=6)))

    reference = make()
    epochs = [[(s["__source__"], s["__key__"]) for s in reference] for _ in range(2)]
    for stop in (len(epochs[0]) - 2, len(epochs[0]) - 1):
        first = make()
        items = iter(first)
        before = [(s["__source__"], s["__key__"]) for s in (next(items) for _ in range(stop))]
        state = first.state_dict()
        second = make()
        second.load_state_dict(state)
        assert before + [(s["__source__"], s["__key__"]) for s in second] == epochs[0]
        assert [(s["__source__"], s["__key__"]) for s in second] == epochs[1]


def test_a_checkpoint_in_the_epoch_after_an_end_of_epoch_resume(data: Dataset) -> None:
    """A checkpoint in the epoch after a resume from an epoch's end resumes it there.

    The Loader restarts into the next epoch; torchdata 0.11 kept reporting the stale
    loaded state for the rest of that iterator's life.
    """
    reference = Loader(sp.to_node(recipe(data)))
    epochs = [keys(reference), keys(reference)]
    first = Loader(sp.to_node(recipe(data)))
    keys(first)
    ended = first.state_dict()
    second = Loader(sp.to_node(recipe(data)))
    second.load_state_dict(ended)
    items = iter(second)
    before = [next(items)[0] for _ in range(10)]
    middle = second.state_dict()
    assert middle != ended
    third = Loader(sp.to_node(recipe(data)))
    third.load_state_dict(middle)
    assert before + keys(third) == epochs[1]
