"""The calls a user writes first, from torch's and torchdata's docs: they must just work.

The plain ``StatefulDataLoader(recipe)`` resumes exactly; a seed reproduces the whole
epoch; ``DataLoader(shuffle=False)`` turns shuffling off; a second epoch is a new order;
the traps (batching twice, images of mixed sizes) are errors that say what to do.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.stateful import Stateful

import shardpipes as sp
from tests.conftest import Dataset
from tests.realdata import build_shards

PER_SHARD, BATCH = 9, 5


@pytest.fixture
def shards(make_shards: Callable[..., Dataset]) -> Dataset:
    return make_shards(4, PER_SHARD)


def recipe(urls: list[str], **options: Any) -> Any:
    """tar_shards yielding (key, label) pairs, seed 7, a 6-sample buffer."""
    options = {"seed": 7, "buffer_size": 6, "fields": ("__key__", "cls"), **options}
    return sp.recipes.tar_shards(urls, **options)


def times_ten(sample: tuple[str, int]) -> tuple[str, int]:
    return sample[0], sample[1] * 10


def non_negative(sample: tuple[str, int]) -> bool:
    return sample[1] >= 0


def chain(urls: list[str]) -> Any:
    """Shardpipes' stages with torch's map, filter, batch and collate, and a buffer."""
    return (
        sp.list_shards(urls)
        .split_shards(shuffle=True, seed=7)
        .open_tar()
        .shuffle_samples(buffer_size=6)
        .decode()
        .to_tuple("__key__", "cls")
        .map(times_ten)
        .filter(non_negative)
        .batch(BATCH)
        .collate()
    )


def keys(batches: Any) -> list[str]:
    return [key for batch in batches for key in batch[0]]


def take(it: Iterator[Any], k: int) -> list[Any]:
    return [next(it) for _ in range(k)]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("build", ["recipe", "chain"])
def test_plain_stateful_dataloader_resumes_exactly(
    shards: Dataset, caplog: pytest.LogCaptureFixture, build: str, workers: int, k: int
) -> None:
    """StatefulDataLoader(pipe), no wrapper: before + after a restart = one whole epoch."""
    make = {"recipe": lambda: recipe(shards.urls), "chain": lambda: chain(shards.urls)}[build]
    batch_size = BATCH if build == "recipe" else None
    full = keys(StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers))
    assert sorted(full) == sorted(shards.keys)
    first = StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers)
    head = take(iter(first), k)
    state = first.state_dict()
    second = StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers)
    second.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        rest = list(second)
    assert "fast-forward" not in caplog.text
    assert keys(head) + keys(rest) == full


@pytest.mark.slow
def test_plain_stateful_dataloader_resumes_realistic_images(tmp_path: Path) -> None:
    """Mixed-size JPEG/PNG shards, resize+crop, batches in the worker, 2 workers."""
    urls = [str(p) for p in build_shards(tmp_path).paths]

    def make() -> Any:
        return sp.recipes.tar_shards(
            urls, seed=3, image="torch", resize=32, crop=32, batch_size=4, fields=("jpg;png", "cls")
        )

    def labels(batches: Any) -> list[int]:
        return [int(x) for batch in batches for x in batch[1]]

    full = labels(StatefulDataLoader(make(), batch_size=None, num_workers=2))
    first = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    head = take(iter(first), 5)
    second = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    second.load_state_dict(first.state_dict())
    assert labels(head) + labels(second) == full
    assert sorted(full) == list(range(len(full)))


@pytest.mark.slow
def test_torch_shuffle_in_a_resumed_chain_is_refused(shards: Dataset) -> None:
    """Torch's shuffle holds samples a state cannot describe: an error names it and the way out."""
    pipe = sp.list_shards(shards.urls).split_shards().open_tar().shuffle(buffer_size=10)
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=0)
    next(iter(loader))
    with pytest.raises(
        ValueError, match=r"ShufflerIterDataPipe cannot be resumed.*shuffle_samples"
    ):
        loader.state_dict()


def test_shuffle_samples_after_decode_resumes_and_after_a_map_says_where(shards: Dataset) -> None:
    """The buffer works wherever samples as read flow (decode, map_fields keep their place).

    After a map of the user's the items are not samples as read: a state is refused, naming
    where the buffer goes.
    """

    def make() -> Any:
        return (
            sp.list_shards(shards.urls).split_shards(seed=1).open_tar().decode()
            .shuffle_samples(5, seed=2).map_fields(cls=int)
        )  # fmt: skip

    full = [s["__key__"] for s in make()]
    first = make()
    items = iter(first)
    head = [next(items)["__key__"] for _ in range(11)]
    again = make()
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + [s["__key__"] for s in again] == full
    assert full != sorted(full)  # shuffled
    mapped = sp.list_shards(shards.urls).split_shards().open_tar().map(dict).shuffle_samples(5)
    next(iter(mapped))
    with pytest.raises(ValueError, match=r"not a sample as read.*put shuffle_samples before"):
        mapped.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_seed_fixes_the_whole_order(shards: Dataset, workers: int) -> None:
    """The same seed=: the same order on every run, whatever the DataLoader's seed."""
    runs = []
    for torch_seed in (1, 2):
        torch.manual_seed(torch_seed)
        runs.append(keys(DataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)))
    assert runs[0] == runs[1]
    assert sorted(runs[0]) == sorted(shards.keys) and runs[0] != shards.keys


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_without_a_seed_the_dataloader_seed_decides(shards: Dataset, workers: int) -> None:
    """No seed=: the DataLoader's generator decides the order (same seed, same order)."""

    def run(seed: int) -> list[str]:
        pipe = recipe(shards.urls, seed=None)
        gen = torch.Generator().manual_seed(seed)
        return keys(DataLoader(pipe, batch_size=BATCH, num_workers=workers, generator=gen))

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_shuffle_false_turns_every_shuffle_off(shards: Dataset, workers: int) -> None:
    """DataLoader(shuffle=False): shards in order, no buffer; shuffle=True turns them on."""
    plain = keys(DataLoader(recipe(shards.urls), batch_size=BATCH, shuffle=False))
    assert plain == shards.keys
    off = keys(DataLoader(chain(shards.urls), batch_size=None, shuffle=False))
    assert off == shards.keys
    on = keys(
        DataLoader(recipe(shards.urls, shuffle=False), batch_size=BATCH, shuffle=True,
                   num_workers=workers)
    )  # fmt: skip
    assert sorted(on) == sorted(shards.keys)
    if workers == 0:
        assert on != shards.keys


@pytest.mark.slow
@pytest.mark.parametrize("persistent", [False, True])
def test_each_epoch_is_a_new_order(shards: Dataset, persistent: bool) -> None:
    """Iterating the loader again is the next epoch; set_epoch(0) gives the first again."""
    pipe = recipe(shards.urls)
    loader = DataLoader(pipe, batch_size=BATCH, num_workers=2, persistent_workers=persistent)
    first, second = keys(loader), keys(loader)
    assert sorted(first) == sorted(second) == sorted(shards.keys)
    assert first != second
    pipe.set_epoch(0)
    assert keys(loader) == first
    assert keys(loader) == second
    fresh = recipe(shards.urls)
    fresh.set_epoch(1)
    assert keys(DataLoader(fresh, batch_size=BATCH, num_workers=2)) == second


def test_set_epoch_on_a_pipe_without_an_epoch_is_an_error(shards: Dataset) -> None:
    """sp.set_epoch on a chain with no split_shards stage says so, instead of doing nothing."""
    with pytest.raises(ValueError, match="no split_shards stage"):
        sp.set_epoch(sp.list_shards(shards.urls).open_tar(), 1)


def test_a_state_of_another_epoch_is_refused(shards: Dataset) -> None:
    """A state saved in epoch 0 loaded into a pipe set to epoch 4: refused, naming both."""
    pipe = recipe(shards.urls)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    again = recipe(shards.urls)
    again.set_epoch(4)
    with pytest.raises(ValueError, match="saved in epoch 0; this pipe was set to epoch 4"):
        again.load_state_dict(state)  # applied at once: refused here


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_batching_twice_is_an_error(shards: Dataset, workers: int) -> None:
    """A recipe with batch_size under a DataLoader that batches again: both sizes named."""
    pipe = recipe(shards.urls, batch_size=4)
    loader = DataLoader(pipe, batch_size=3, num_workers=workers)
    with pytest.raises(ValueError, match=r"batches already \(of 4 samples\).*gathered 3 of them"):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("form", ["recipe", "chain"])
def test_mixed_size_images_name_the_fix(tmp_path: Path, form: str, workers: int) -> None:
    """Mixed-size images reaching a collate: one error naming resize=/crop=, any process."""
    urls = [str(p) for p in build_shards(tmp_path).paths]
    if form == "recipe":
        loader = DataLoader(sp.recipes.tar_shards(urls, image="torch"), batch_size=8,
                            num_workers=workers)  # fmt: skip
    else:
        pipe = (sp.list_shards(urls).split_shards().open_tar().decode("torch")
                .to_tuple("jpg;png", "cls").batch(8).collate())  # fmt: skip
        loader = DataLoader(pipe, batch_size=None, num_workers=workers)
    with pytest.raises(ValueError, match=r"images of different sizes.*resize= and crop="):
        next(iter(loader))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [1, 2])
def test_plain_stateful_dataloader_resumes_at_a_shard_boundary(
    shards: Dataset, workers: int, k: int
) -> None:
    """Batches of one whole shard, no buffer: stopping after k shards resumes at the next."""

    def make() -> Any:
        return recipe(shards.urls, buffer_size=0, shuffle=False, batch_size=PER_SHARD)

    full = keys(StatefulDataLoader(make(), batch_size=None, num_workers=workers))
    first = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    head = take(iter(first), k)
    second = StatefulDataLoader(make(), batch_size=None, num_workers=workers)
    second.load_state_dict(first.state_dict())
    assert keys(head) + keys(second) == full


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_go_on_after_a_resumed_epoch(shards: Dataset, workers: int) -> None:
    """Resume epoch 1 in a new loader without set_epoch: the epoch after it is epoch 2."""
    loader = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    epochs = [keys(loader) for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    first = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    keys(first)  # epoch 0
    head = take(iter(first), 2)  # into epoch 1
    resumed = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    resumed.load_state_dict(first.state_dict())
    assert keys(head) + keys(resumed) == epochs[1]
    assert keys(resumed) == epochs[2]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_of_other_shards_or_seed_is_refused_even_with_all_in_the_buffer(
    make_shards: Callable[..., Dataset], workers: int
) -> None:
    """A worker's whole share in the buffer (draining) is still checked against the pipe."""
    data = make_shards(4, PER_SHARD)
    first = StatefulDataLoader(
        recipe(data.urls, buffer_size=1000), batch_size=BATCH, num_workers=workers
    )
    take(iter(first), 1)
    state = first.state_dict()
    for pipe, match in (
        (recipe(data.urls, buffer_size=1000, seed=8), "saved with seed 7; this pipe has seed=8"),
        (recipe(data.urls[:3], buffer_size=1000), "another shard list"),
    ):
        loader = StatefulDataLoader(pipe, batch_size=BATCH, num_workers=workers)
        loader.load_state_dict(state)
        with pytest.raises(ValueError, match=match):
            list(loader)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_the_epoch_after_a_resumed_first_epoch_is_the_second(shards: Dataset, workers: int) -> None:
    """Resume epoch 0 (buffer draining, or at its very end): the next epoch is epoch 1."""
    loader = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    epochs = [keys(loader) for _ in range(2)]
    for k in (1, len(epochs[0]) // BATCH + 1):  # draining; the end of the epoch
        first = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
        it = iter(first)
        head = [b for _, b in zip(range(k), it, strict=False)]
        resumed = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
        resumed.load_state_dict(first.state_dict())
        assert keys(head) + keys(resumed) == epochs[0]
        assert keys(resumed) == epochs[1]


@pytest.mark.slow
def test_open_tar_without_a_split_in_workers_is_an_error(shards: Dataset) -> None:
    """Workers that would each read every shard: an error naming split_shards."""
    pipe = sp.list_shards(shards.urls).open_tar()
    with pytest.raises(ValueError, match=r"nothing splits them.*\.split_shards\(\)"):
        list(DataLoader(pipe, batch_size=None, num_workers=2))
    split = sp.list_shards(shards.urls).sharding_filter().open_tar()
    assert len(list(DataLoader(split, batch_size=None, num_workers=2))) == len(shards.keys)


def test_webdataset_field_specs_split_on_whitespace(shards: Dataset) -> None:
    """to_tuple("txt cls") and fields=("txt cls",) are two fields, as in WebDataset."""
    chained = next(iter(sp.list_shards(shards.urls).open_tar().decode().to_tuple("txt cls")))
    fused = next(iter(recipe(shards.urls, fields=("__key__ cls",), shuffle=False)))
    assert len(chained) == 2 and isinstance(chained[1], int)
    assert fused == (shards.keys[0], shards.labels[shards.keys[0]])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda u: sp.recipes.tar_shards(u, shardshuffle=True), r"tar_shards\(\) got an unexpected keyword argument 'shardshuffle'"),
        (lambda u: sp.recipes.tar_images(u[0], fields=("a",)), r"tar_images\(\) got an unexpected keyword argument 'fields'"),
        (lambda u: sp.list_shards(u).open_tar(retry=3), r"open_tar\(\) got an unexpected keyword argument 'retry'"),
        (lambda u: sp.recipes.tar_shards(u, shuffle=1000), r"shuffle must be True or False \(got 1000\).*buffer_size"),
    ],
)  # fmt: skip
def test_wrong_keywords_name_the_call(shards: Dataset, call: Any, match: str) -> None:
    """A wrong keyword names the function the user called, not an internal one."""
    with pytest.raises(TypeError, match=match):
        call(shards.urls)


def test_each_worker_shuffles_with_its_own_seed(shards: Dataset) -> None:
    """A buffer's order is a function of (seed, epoch, worker): workers differ, runs agree."""

    def buffered(worker: int, epoch: int = 0) -> list[str]:
        pipe = sp.list_shards(shards.urls).split_shards(shuffle=False, seed=7).open_tar()
        pipe = pipe.shuffle_samples(buffer_size=64).to_tuple("__key__")
        pipe.place((2, worker))
        pipe.set_epoch(epoch)
        return [key for (key,) in pipe]

    assert buffered(0) == buffered(0)
    assert len({tuple(buffered(0)), tuple(buffered(1)), tuple(buffered(0, epoch=1))}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_when_the_iterator_wrapper_hides_the_state(
    shards: Dataset, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """As on Python >= 3.12, where torch's iterator wrapper does not look Stateful."""
    from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper

    decorator = type(iter(_IterDataPipeSerializationWrapper(sp.list_shards(shards.urls))))
    forward = decorator.__getattr__

    def hidden(self: Any, name: str) -> Any:
        if name in ("state_dict", "load_state_dict"):
            raise AttributeError(name)
        return forward(self, name)

    monkeypatch.setattr(decorator, "__getattr__", hidden)
    # the simulation holds: torch's own wrapper's iterator hides the state
    assert not isinstance(iter(_IterDataPipeSerializationWrapper(recipe(shards.urls))), Stateful)
    full = keys(StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers))
    first = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    head = take(iter(first), 3)
    second = StatefulDataLoader(recipe(shards.urls), batch_size=BATCH, num_workers=workers)
    second.load_state_dict(first.state_dict())
    assert keys(head) + keys(second) == full
