"""Tests of the recipe registry: ``available``, ``describe``, ``load``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

import shardpipes.recipes as recipes
from shardpipes.recipes.image_folder import image_folder
from shardpipes.recipes.tensors import tensors

NAMES = ["image_folder", "indexed_tar", "tar_images", "tar_shards", "tensors"]


class TestRegistry:
    def test_available(self) -> None:
        """available() lists the five recipes, sorted."""
        assert recipes.available() == NAMES

    @pytest.mark.parametrize("name", NAMES)
    def test_reexported(self, name: str) -> None:
        """Each recipe function is importable from shardpipes.recipes under its name."""
        assert name in recipes.__all__
        assert callable(getattr(recipes, name))
        assert getattr(recipes, name).__name__ == name

    def test_describe(self) -> None:
        """describe() maps every name to a non-empty one-line summary."""
        summaries = recipes.describe()
        assert list(summaries) == NAMES
        for summary in summaries.values():
            assert summary
            assert "\n" not in summary
        assert summaries["tensors"] == (tensors.__doc__ or "").splitlines()[0]

    def test_load_equals_direct_call(self) -> None:
        """load('tensors', ...) builds the same dataset as tensors(...)."""
        data, targets = torch.randn(6, 2), torch.tensor([3, 1, 4, 1, 5, 9])
        loaded = recipes.load("tensors", data=data, targets=targets, transform=torch.neg)
        direct = tensors(data, targets, transform=torch.neg)
        assert type(loaded) is type(direct)
        assert len(loaded) == len(direct)
        for i in range(len(direct)):
            assert torch.equal(loaded[i][0], direct[i][0])
            assert loaded[i][1] == direct[i][1]

    def test_load_image_folder(self, tmp_path: Path) -> None:
        """load('image_folder', root=...) matches image_folder(root)."""
        (tmp_path / "cls").mkdir()
        Image.new("RGB", (2, 2)).save(tmp_path / "cls" / "a.png")
        loaded = recipes.load("image_folder", root=str(tmp_path))
        assert loaded.samples == image_folder(str(tmp_path)).samples

    @pytest.mark.parametrize("name", ["x", "", "Tensors", "tensors "])
    def test_unknown_name(self, name: str) -> None:
        """An unknown name is a ValueError quoting it and listing every recipe."""
        msg = f"unknown recipe {name!r}; available: {', '.join(NAMES)}"
        with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
            recipes.load(name)

    def test_load_passes_bad_arguments_through(self) -> None:
        """A recipe's own argument errors reach the caller unchanged."""
        with pytest.raises(ValueError, match=r"same length \(got 2 and 1\)"):
            recipes.load("tensors", data=[1, 2], targets=[0])


class TestFirstCalls:
    """The calls a new user writes first (issue 24 §8)."""

    def test_load_takes_the_urls_by_position(self, make_shards: Any) -> None:
        data = make_shards(2, 3)
        pipe = recipes.load("tar_shards", data.urls, fields=("__key__",), seed=0)
        assert sorted(key for (key,) in pipe) == sorted(data.keys)

    @pytest.mark.parametrize(
        ("recipe", "typo", "meant"),
        [
            ("tar_shards", "batchsize", "batch_size"),
            ("tar_shards", "buffersize", "buffer_size"),
            ("tar_shards", "storage_option", "storage_options"),
            ("tar_images", "transfrom", "transform"),
            ("indexed_tar", "handle", "handler"),
        ],
    )
    def test_a_typo_gets_the_name_it_meant(self, recipe: str, typo: str, meant: str) -> None:
        with pytest.raises(TypeError, match=rf"argument {typo!r}; did you mean {meant!r}\?"):
            recipes.load(recipe, "data/x.tar", **{typo: 64})

    def test_no_suggestion_for_a_name_near_nothing(self) -> None:
        with pytest.raises(TypeError) as info:
            recipes.load("tar_shards", "data/x.tar", zzz=1)
        assert "did you mean" not in str(info.value)
