"""``tar_shards`` of a dict of sources (issue 14 §1): mixed by weight, exactly once, resumable."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from tests.conftest import Dataset


@pytest.fixture
def sources(make_shards: Callable[..., Dataset], tmp_path: Path) -> dict[str, Dataset]:
    """Two sources: "web", 4 shards of 60 samples; "books", 2 of 40."""
    (tmp_path / "web").mkdir()
    (tmp_path / "books").mkdir()
    return {
        "web": make_shards(4, 60, base=str(tmp_path / "web")),
        "books": make_shards(2, 40, base=str(tmp_path / "books")),
    }


def recipe(sources: dict[str, Dataset], **options: Any) -> Any:
    return sp.recipes.tar_shards(
        {name: data.urls for name, data in sources.items()},
        fields=("__key__", "__source__", "cls"),
        seed=11,
        buffer_size=30,
        **options,
    )


def rows(batches: Any) -> list[tuple[str, str]]:
    return [
        (source, key) for keys, names, _ in batches for key, source in zip(keys, names, strict=True)
    ]


def test_every_sample_of_every_source_once(sources: dict[str, Dataset]) -> None:
    """2 workers, batches of 8, weights 2:1: the 240 + 80 samples, each once, by source."""
    loader = DataLoader(
        recipe(sources, weights={"web": 2, "books": 1}, batch_size=8),
        batch_size=None,
        num_workers=2,
    )
    got = rows(loader)
    want = [(n, k) for n, data in sources.items() for k in data.keys]
    assert sorted(got) == sorted(want)
    first_half = Counter(name for name, _ in got[:160])
    assert abs(first_half["web"] / 160 - 2 / 3) < 0.08


def test_epoch_size_and_resume(sources: dict[str, Dataset]) -> None:
    """epoch_size=400 over 320 samples (weights 1:1): 200 each; resumed mid-epoch, exact."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> Any:
        return recipe(sources, epoch_size=400, batch_size=8)

    whole = rows(StatefulDataLoader(make(), batch_size=None, num_workers=2))
    assert Counter(name for name, _ in whole) == {"web": 200, "books": 200}
    first = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    before = []
    for batch in first:
        before += rows([batch])
        if len(before) == 120:
            state = first.state_dict()
            break
    second = StatefulDataLoader(make(), batch_size=None, num_workers=2)
    second.load_state_dict(state)
    assert before + rows(second) == whole


def test_transform_and_options_for_one_list_are_refused(sources: dict[str, Dataset]) -> None:
    """The transform applies to the first field; weights without a dict is an error."""
    got = list(
        sp.recipes.tar_shards(
            {name: data.urls for name, data in sources.items()},
            fields=("__key__", "cls"),
            transform=str.upper,
            shuffle=False,
        )
    )
    assert all(key == key.upper() for key, _ in got) and len(got) == 320
    with pytest.raises(TypeError, match="for a dict of sources"):
        sp.recipes.tar_shards(sources["web"].urls, weights={"web": 1})


@pytest.mark.parametrize("name", ["tar_images", "indexed_tar"])
def test_one_tar_recipes_mix_a_dict_of_tars(
    make_shards: Callable[..., Dataset], tmp_path: Path, name: str
) -> None:
    """Two single tars of mixed-size PNG images, 2:1, under 2 workers; resumed exactly."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_shards(1, 30, images=True, base=str(tmp_path / "a"))
    b = make_shards(1, 13, images=True, base=str(tmp_path / "b"))

    def recipe() -> Any:
        return sp.recipes.load(
            name, url={"a": a.urls[0], "b": b.urls[0]}, weights={"a": 2, "b": 1},
            image="torch", resize=32, crop=32, batch_size=4,
        )  # fmt: skip

    whole = [
        label
        for _, labels in StatefulDataLoader(recipe(), batch_size=None, num_workers=2)
        for label in labels.tolist()
    ]
    assert Counter(whole) == Counter([*a.labels.values(), *b.labels.values()])
    loader = StatefulDataLoader(recipe(), batch_size=None, num_workers=2)
    batches = iter(loader)
    before = [label for _ in range(3) for label in next(batches)[1].tolist()]
    state = loader.state_dict()
    del batches
    again = StatefulDataLoader(recipe(), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert before + [label for _, labels in again for label in labels.tolist()] == whole
    with pytest.raises(TypeError, match="weights= is for a dict of tars"):
        sp.recipes.load(name, url=a.urls[0], weights={"a": 1})
