"""The ``image_folder`` recipe: random access to a folder of images, one sub-folder per class.

Like torchvision's ``ImageFolder`` (same class order, same labels), without torchvision and
on any fsspec filesystem: a local path, ``file://``, ``memory://``, ``s3://``… The folder is
listed once, when the dataset is built; images are read through :mod:`shardpipes.fs` when
an item is asked for, so the dataset pickles to DataLoader workers without a filesystem
object in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from shardpipes import fs
from shardpipes._core.decoders import IMAGE_EXTENSIONS, decode_image
from shardpipes.errors import DecodeError, NoShardsError

__all__ = ["ImageFolder", "class_images", "image_folder"]

ClassImage = tuple[str, int, tuple[str, ...]]


def _is_image(name: str) -> bool:
    stem, dot, ext = name.lower().rpartition(".")
    return bool(stem and dot) and ext in IMAGE_EXTENSIONS


def class_images(
    root: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[str], list[ClassImage]]:
    """List a folder of images with one sub-folder per class, as torchvision's ImageFolder.

    Args:
        root: The folder (any fsspec URL).
        storage_options: Passed to the filesystem.

    Returns:
        ``(classes, images)``: the sorted sub-folder names, and ``(url, label, parts)`` of
        every image file (extension in :data:`~shardpipes._core.decoders.IMAGE_EXTENSIONS`,
        any case) under them, by class then by URL; ``parts`` is its path from ``root``.
        On a local disk, symbolic links never lead out of ``root`` (see
        :func:`shardpipes.fs.walk`).

    Raises:
        ShardNotFoundError: ``root`` is not a folder.
        NoShardsError: No class folder holds an image (a ``FileNotFoundError``).
    """
    entries = list(fs.walk(root, storage_options))
    classes = [parts[0] for parts, _, is_dir in entries if is_dir and len(parts) == 1]
    label = {name: i for i, name in enumerate(classes)}
    images = sorted(
        ((url, label[parts[0]], parts) for parts, url, is_dir in entries
         if not is_dir and len(parts) > 1 and _is_image(parts[-1])),
        key=lambda image: (image[1], image[0]),
    )  # fmt: skip
    if not images:
        exts = ", ".join(sorted(IMAGE_EXTENSIONS))
        problem = f"no images in class sub-folders (extensions: {exts})"
        raise NoShardsError(problem, url=root)
    return classes, images


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
        self.classes, images = class_images(root, self.storage_options)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [(url, label) for url, label, _ in images]

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
        image: Image.Image = decode_image(data, "pil")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        problem = f"cannot decode image: {exc}"
        raise DecodeError(problem, url=url, member=url.rsplit("/", 1)[-1]) from exc
    return image


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
