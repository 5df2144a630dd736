"""Exactly once with real DataLoaders: every worker count × shard count, chained and recipes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import shardpipes as sp
from tests.conftest import Dataset, sample_members, write_tar

pytestmark = pytest.mark.slow

WORKERS = [0, 1, 2, 3]
SHARDS = [1, 2, 5, 8]


def load(pipe: Any, workers: int, **kwargs: Any) -> list[Any]:
    return list(DataLoader(pipe, batch_size=None, num_workers=workers, **kwargs))


def key_and_label(sample: dict[str, Any]) -> tuple[str, int]:
    return sample["__key__"], sample["cls"]


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def pixel_id(image: torch.Tensor) -> int:
    """The sample index written into pixel (0, 0) by the fixture (green + 256 * blue)."""
    return int(image[1, 0, 0]) + 256 * int(image[2, 0, 0])


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("workers", WORKERS)
def test_chained_pipes(make_shards: Callable[..., Dataset], workers: int, shards: int) -> None:
    """list_shards → split_shards → open_tar → decode → to_tuple: each key once."""
    data = make_shards(shards, [7 + s for s in range(shards)])
    pipe = (
        sp.list_shards(data.urls).split_shards(shuffle=True).open_tar().decode().map(key_and_label)
    )
    got = load(pipe, workers)
    assert Counter(k for k, _ in got) == Counter(data.keys)
    assert all(label == data.labels[k] for k, label in got)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("workers", WORKERS)
def test_sharding_filter_composes(
    make_shards: Callable[..., Dataset], workers: int, shards: int
) -> None:
    """Torch core's shuffle + sharding_filter on URLs also gives each sample once."""
    data = make_shards(shards, 5)
    pipe = sp.list_shards(data.urls).shuffle().sharding_filter().open_tar().map(key_of)
    assert Counter(load(pipe, workers)) == Counter(data.keys)


@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("workers", WORKERS)
def test_tar_shards_recipe(make_shards: Callable[..., Dataset], workers: int, shards: int) -> None:
    """tar_shards yields (image, int label) pairs, every image exactly once."""
    data = make_shards(shards, 6, images=True)
    pipe = sp.recipes.tar_shards(data.urls, image="torch", buffer_size=10)
    got = load(pipe, workers)
    ids = Counter(pixel_id(img) for img, _ in got)
    assert ids == Counter(range(len(data.keys)))
    assert all(isinstance(label, int) for _, label in got)


@pytest.mark.parametrize("recipe", ["tar_images", "indexed_tar"])
@pytest.mark.parametrize("workers", WORKERS)
def test_one_tar_recipes(make_shards: Callable[..., Dataset], recipe: str, workers: int) -> None:
    """tar_images and indexed_tar split one tar by sample: no duplicates, no drops."""
    data = make_shards(1, 23, images=True)
    pipe = sp.recipes.load(recipe, url=data.urls[0], image="torch")
    got = load(pipe, workers)
    assert Counter(pixel_id(img) for img, _ in got) == Counter(range(23))
    labels = [label for _, label in sorted(got, key=lambda p: pixel_id(p[0]))]
    assert labels == [data.labels[k] for k in data.keys]


def test_batched_dict_samples(make_shards: Callable[..., Dataset]) -> None:
    """Batch + collate(collate_samples) turns dict samples into a dict of stacked tensors."""
    data = make_shards(2, 5, images=True)
    pipe = (
        sp.list_shards(data.urls)
        .split_shards()
        .open_tar()
        .decode("torch")
        .batch(4)
        .collate(sp.collate_samples)
    )
    batches = load(pipe, 2)
    assert sum(len(b["__key__"]) for b in batches) == 10
    first = batches[0]
    assert first["png"].dtype == torch.uint8 and first["png"].shape[1:] == (3, 10, 12)
    assert first["cls"].tolist() == [data.labels[k] for k in first["__key__"]]


def test_sample_shuffle_is_deterministic_with_a_generator(
    make_shards: Callable[..., Dataset],
) -> None:
    """Two epochs with the same DataLoader generator seed give the same order."""
    data = make_shards(4, 5)

    def order(seed: int) -> list[str]:
        pipe = (
            sp.list_shards(data.urls).split_shards(shuffle=True).open_tar().shuffle(buffer_size=8)
        )
        gen = torch.Generator().manual_seed(seed)
        return [s["__key__"] for s in load(pipe, 2, generator=gen)]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(data.keys)


def test_memory_filesystem_with_workers(memfs: object) -> None:
    """Shards on memory:// (a second fsspec filesystem) give each sample once with 2 workers."""
    keys = []
    for s in range(3):
        members = []
        for i in range(5):
            keys.append(f"m{s}/{i}")
            members += sample_members(keys[-1], i, i, images=False)
        write_tar(f"memory://bucket/train-{s}.tar", members)
    pipe = sp.list_shards("memory://bucket/train-*.tar").split_shards().open_tar().map(key_of)
    assert Counter(load(pipe, 2)) == Counter(keys)


@pytest.mark.parametrize("shards", [1, 5])
@pytest.mark.parametrize("workers", [0, 2, 3])
def test_tar_shards_batches(make_shards: Callable[..., Dataset], workers: int, shards: int) -> None:
    """batch_size collates in the worker: Batch lists of (B, 3, H, W) images and labels."""
    data = make_shards(shards, 7, images=True)
    pipe = sp.recipes.tar_shards(data.urls, image="torch", batch_size=4, buffer_size=5)
    batches = load(pipe, workers)
    assert all(isinstance(b, sp.Batch) and b[0].shape[1:] == (3, 10, 12) for b in batches)
    ids = [pixel_id(img) for images, _ in batches for img in images]
    assert Counter(ids) == Counter(range(len(data.keys)))
    labels = {
        pixel_id(img): int(label)
        for images, ls in batches
        for img, label in zip(images, ls, strict=True)
    }
    assert [labels[i] for i in range(len(data.keys))] == [data.labels[k] for k in data.keys]


def test_tar_shards_drop_last(make_shards: Callable[..., Dataset]) -> None:
    """drop_last drops each worker's short batch; the others are full."""
    data = make_shards(2, 5, images=True)
    pipe = sp.recipes.tar_shards(data.urls, batch_size=4, drop_last=True, image="torch")
    batches = load(pipe, 2)
    assert [len(b[1]) for b in batches] == [4, 4]


def test_tar_shards_other_fields(make_shards: Callable[..., Dataset]) -> None:
    """The fields argument picks (and decodes) other members: text samples as (str, int)."""
    data = make_shards(3, 4)
    pipe = sp.recipes.tar_shards(data.urls, fields=("txt", "cls", "__key__"), shuffle=False)
    got = load(pipe, 2)
    assert sorted(key for _, _, key in got) == sorted(data.keys)
    assert all(text == f"{key}\n" * 3 and label == data.labels[key] for text, label, key in got)


@pytest.mark.parametrize("workers", [0, 2])
def test_recipe_resize_and_crop(make_shards: Callable[..., Dataset], workers: int) -> None:
    """Resize + crop give fixed-size tensors that batch, from any image size."""
    data = make_shards(2, 3, images=True)
    pipe = sp.recipes.tar_shards(data.urls, image="torch", resize=8, crop=6, batch_size=3)
    batches = load(pipe, workers)
    assert sum(len(b[1]) for b in batches) == 6
    assert all(tuple(b[0].shape[1:]) == (3, 6, 6) for b in batches)


def test_tar_shards_decode_threads_with_workers(make_shards: Callable[..., Dataset]) -> None:
    """Decode threads inside DataLoader workers: still each image exactly once."""
    data = make_shards(4, 6, images=True)
    pipe = sp.recipes.tar_shards(data.urls, image="torch", batch_size=5, threads=2)
    batches = load(pipe, 2)
    ids = [pixel_id(img) for images, _ in batches for img in images]
    assert Counter(ids) == Counter(range(len(data.keys)))


def test_indexed_tar_index_is_a_url(make_shards: Callable[..., Dataset]) -> None:
    """indexed_tar's index is the sidecar's URL: anything else is refused up front."""
    data = make_shards(1, 3)
    with pytest.raises(TypeError, match="index must be the URL of the index sidecar"):
        sp.recipes.indexed_tar(data.urls[0], index=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(("saved", "now"), [(2, 1), (0, 2), (2, 0)])
def test_a_state_of_another_num_workers_is_refused_at_load(
    make_shards: Callable[..., Dataset], saved: int, now: int
) -> None:
    """Refused when loaded, naming both counts (torchdata asserts later, saying nothing)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = make_shards(4, 6)

    def loader(workers: int) -> Any:
        pipe = sp.recipes.tar_shards(data.urls, fields=("__key__",), batch_size=2, seed=1)
        return StatefulDataLoader(pipe, batch_size=None, num_workers=workers)

    first = loader(saved)
    batches = iter(first)
    for _ in range(3):
        next(batches)
    state = first.state_dict()
    with pytest.raises(ValueError, match=rf"saved with num_workers={saved}; .* num_workers={now}"):
        loader(now).load_state_dict(state)
    same = loader(saved)
    same.load_state_dict(state)  # the same count loads as before
    assert sum(len(keys) for (keys,) in same) == 24 - 6
