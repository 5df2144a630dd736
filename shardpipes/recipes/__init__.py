"""Prebuilt loaders, each reproducing (and fixing) one loader of the source notebook.

Every recipe is a plain function, importable from here and loadable by name:

Example:
    >>> from shardpipes import recipes
    >>> recipes.available()
    ['image_folder', 'indexed_tar', 'tar_images', 'tar_shards', 'tensors']
    >>> ds = recipes.load("tensors", data=[[0.0], [1.0]], targets=[1, 0])
    >>> ds[0]
    ([0.0], 1)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from shardpipes.recipes.image_folder import image_folder
from shardpipes.recipes.indexed_tar import indexed_tar
from shardpipes.recipes.tar_images import tar_images
from shardpipes.recipes.tar_shards import tar_shards
from shardpipes.recipes.tensors import tensors

__all__ = [
    "available",
    "describe",
    "image_folder",
    "indexed_tar",
    "load",
    "tar_images",
    "tar_shards",
    "tensors",
]

_RECIPES: dict[str, Callable[..., Any]] = {
    recipe.__name__: recipe
    for recipe in (image_folder, indexed_tar, tar_images, tar_shards, tensors)
}


def available() -> list[str]:
    """Return the names of every recipe, sorted.

    Example:
        >>> "tar_shards" in available()
        True
    """
    return sorted(_RECIPES)


def describe() -> dict[str, str]:
    """Return each recipe's name mapped to its one-line summary (its docstring's first line).

    Example:
        >>> describe()["tensors"].startswith("Map-style dataset")
        True
    """
    return {name: (inspect.getdoc(_RECIPES[name]) or "").split("\n", 1)[0] for name in available()}


def load(name: str, /, *args: Any, **kwargs: Any) -> Any:
    """Build the recipe called ``name`` with the given arguments.

    Args:
        name: One of :func:`available`.
        *args: The recipe's positional arguments (its URLs, its folder…).
        **kwargs: The recipe's arguments, by name.

    Returns:
        What the recipe returns: a dataset or a pipe.

    Raises:
        ValueError: No recipe is called ``name``.

    Example:
        >>> ds = load("tensors", data=[10, 20], targets=[0, 1])
        >>> len(ds)
        2
        >>> len(load("tensors", [10, 20, 30], [0, 1, 0]))
        3
    """
    try:
        recipe = _RECIPES[name]
    except KeyError:
        msg = f"unknown recipe {name!r}; available: {', '.join(available())}"
        raise ValueError(msg) from None
    return recipe(*args, **kwargs)
