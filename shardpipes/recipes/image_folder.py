"""The ``image_folder`` recipe: random access to a folder of images, one sub-folder per class.

Like torchvision's ``ImageFolder`` (same class order, same labels), without torchvision and
on any fsspec filesystem: a local path, ``file://``, ``memory://``, ``s3://``… The folder is
listed once, when the dataset is built; images are read through :mod:`shardpipes.fs` when
an item is asked for, so the dataset pickles to DataLoader workers without a filesystem
object in it.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from shardpipes import fs
from shardpipes.errors import DecodeError, NoShardsError

__all__ = ["IMAGE_EXTENSIONS", "ImageFolder", "image_folder"]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".gif", ".tif", ".tiff", ".webp"}
)
"""File extensions taken as images (compared case-insensitively)."""


def _basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _is_image(url: str) -> bool:
    name = _basename(url).lower()
    stem, dot, ext = name.rpartition(".")
    return bool(stem and dot) and f".{ext}" in IMAGE_EXTENSIONS


def _walk_images(url: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    """Return the image files under the directory ``url``, recursively, sorted."""
    found: list[str] = []
    for entry, is_dir in fs.listdir(url, storage_options):
        if is_dir:
            found.extend(_walk_images(entry, storage_options))
        elif _is_image(entry):
            found.append(entry)
    return sorted(found)


class ImageFolder(Dataset[tuple[Any, int]]):
    """Map-style dataset of ``(image, label)`` over ``root/<class>/**/<file>.<image ext>``.

    Args:
        root: The folder holding one sub-folder per class, as any fsspec URL.
        transform: Applied to each RGB ``PIL.Image.Image`` when it is read.
        storage_options: Passed unchanged to the filesystem.

    Attributes:
        classes: The sub-folder names of ``root``, sorted; a label indexes this list.
        class_to_idx: Class name to label.
        samples: ``(url, label)`` of every image, by class then by URL.

    Raises:
        ShardNotFoundError: ``root`` does not exist.
        NoShardsError: ``root`` holds no class folders, or they hold no images (a
            ``FileNotFoundError``).
        TypeError: ``transform`` is not callable.
    """

    def __init__(
        self,
        root: str,
        *,
        transform: Callable[[Any], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if transform is not None and not callable(transform):
            msg = f"transform must be callable or None (got {transform!r})"
            raise TypeError(msg)
        self.root = root
        self.transform = transform
        self.storage_options = dict(storage_options or {})
        folders = [url for url, is_dir in fs.listdir(root, self.storage_options) if is_dir]
        self.classes = sorted(_basename(url) for url in folders)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [
            (file_url, self.class_to_idx[_basename(url)])
            for url in sorted(folders, key=_basename)
            for file_url in _walk_images(url, self.storage_options)
        ]
        if not self.samples:
            exts = ", ".join(sorted(IMAGE_EXTENSIONS))
            problem = f"no class folders with image files ({exts})"
            raise NoShardsError(problem, url=root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        url, label = self.samples[index]
        with fs.open_input(url, self.storage_options) as f:
            data = f.read()
        image: Any = _decode_rgb(data, url)
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(root={self.root!r}, classes={len(self.classes)}, samples={len(self)})"


def _decode_rgb(data: bytes, url: str) -> Image.Image:
    """Decode image bytes to an RGB image, or raise a DecodeError naming ``url``."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        problem = f"cannot decode image: {exc}"
        raise DecodeError(problem, url=url, member=_basename(url)) from exc


def image_folder(
    root: str,
    *,
    transform: Callable[[Any], Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ImageFolder:
    """Random-access dataset over a folder of images, one sub-folder per class, on any fsspec path.

    Args:
        root: The folder holding one sub-folder per class (local path or fsspec URL).
        transform: Applied to each RGB ``PIL.Image.Image`` when it is read.
        storage_options: Passed unchanged to the filesystem (credentials, endpoint…).

    Returns:
        An :class:`ImageFolder`: item ``i`` is ``(transform(image), label)``, with labels
        indexing the sorted sub-folder names (``.classes``), as in torchvision.

    Raises:
        ShardNotFoundError: ``root`` does not exist.
        NoShardsError: ``root`` holds no class folders with images.

    Example:
        >>> from PIL import Image
        >>> from shardpipes import fs
        >>> for name in ["dog/1.png", "cat/2.png", "cat/notes.txt"]:
        ...     with fs.open_output(f"memory://doc-pets/{name}") as f:
        ...         Image.new("L", (4, 3)).save(f, format="PNG")
        >>> ds = image_folder("memory://doc-pets")
        >>> ds.classes, len(ds), ds[1][1], ds[1][0].mode
        (['cat', 'dog'], 2, 1, 'RGB')
    """
    return ImageFolder(root, transform=transform, storage_options=storage_options)
