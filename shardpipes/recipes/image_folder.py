"""The ``image_folder`` recipe: random access to a folder of images, one sub-folder per class.

Like torchvision's ``ImageFolder`` (same class order, same labels), without torchvision and
on any fsspec filesystem: a local path, ``file://``, ``memory://``, ``s3://``… The folder is
listed once, when the dataset is built; images are read through :mod:`shardpipes.fs` when
an item is asked for, so the dataset pickles to DataLoader workers without a filesystem
object in it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from shardpipes import fs
from shardpipes._core.decoders import described
from shardpipes._core.images import IMAGE_EXTENSIONS, decode_image
from shardpipes.errors import DecodeError, NoShardsError

__all__ = ["ImageFolder", "check_classes", "class_images", "image_folder", "read_classes"]

ClassImage = tuple[str, int, tuple[str, ...]]


def _is_image(name: str) -> bool:
    stem, dot, ext = name.lower().rpartition(".")
    return bool(stem and dot) and ext in IMAGE_EXTENSIONS


def _hidden(parts: tuple[str, ...]) -> bool:
    """Whether a path holds a hidden name (``.ipynb_checkpoints/``, macOS's ``._x.jpg``)."""
    return any(part.startswith(".") for part in parts)


def class_images(
    root: str,
    storage_options: Mapping[str, Any] | None = None,
    classes: Sequence[str] | None = None,
) -> tuple[list[str], list[ClassImage]]:
    """List a folder of images with one sub-folder per class, as torchvision's ImageFolder.

    Hidden folders and files (names starting with ``.``: ``.ipynb_checkpoints``, macOS's
    ``._x.jpg``) are left out: a hidden folder taken as a class would shift every label
    after it.

    Args:
        root: The folder (any fsspec URL).
        storage_options: Passed to the filesystem.
        classes: The class list labels index (see :func:`read_classes`); default the
            sorted class folders.

    Returns:
        ``(classes, images)``: the class list, and ``(url, label, parts)`` of every image
        file (extension in :data:`~shardpipes._core.images.IMAGE_EXTENSIONS`, any case)
        under the class folders, by class then by URL; ``parts`` is its path from
        ``root``. On a local disk, symbolic links never lead out of ``root`` (see
        :func:`shardpipes.fs.walk`).

    Raises:
        ShardNotFoundError: ``root`` is not a folder.
        NoShardsError: No class folder holds an image (a ``FileNotFoundError``).
        ValueError: A class folder is not in ``classes``, or ``classes`` names one twice.
    """
    entries = [entry for entry in fs.walk(root, storage_options) if not _hidden(entry[0])]
    folders = [parts[0] for parts, _, is_dir in entries if is_dir and len(parts) == 1]
    classes = check_classes(classes, root) if classes is not None else folders
    label = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in folders if name not in label]
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (", …" if len(unknown) > 5 else "")
        msg = (
            f"{root}: class folder(s) {shown} not in the class list ({len(classes)} "
            f"classes): every label must mean what it means elsewhere"
        )
        raise ValueError(msg)
    images = sorted(
        ((url, label[parts[0]], parts) for parts, url, is_dir in entries
         if not is_dir and len(parts) > 1 and _is_image(parts[-1])),
        key=lambda image: (image[1], image[0]),
    )  # fmt: skip
    if not images:
        exts = ", ".join(sorted(IMAGE_EXTENSIONS))
        problem = f"no images in class sub-folders (extensions: {exts})"
        raise NoShardsError(problem, url=root)
    return list(classes), images


def check_classes(classes: Sequence[str], where: str) -> list[str]:
    """A class list, checked: names, none twice.

    Raises:
        TypeError: ``classes`` is not a list of strings.
        ValueError: It is empty or names a class twice.
    """
    if isinstance(classes, str) or not all(isinstance(name, str) for name in classes):
        msg = f"classes must be a list of class names (got {classes!r:.100})"
        raise TypeError(msg)
    found = list(classes)
    if not found:
        msg = f"{where}: the class list is empty"
        raise ValueError(msg)
    twice = sorted({name for name in found if found.count(name) > 1})
    if twice:
        msg = f"{where}: the class list names {', '.join(map(repr, twice))} twice"
        raise ValueError(msg)
    return found


def read_classes(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """A class list from a file: ``{"classes": [...]}`` or a list in JSON, else one name a line.

    What ``shardpipes write`` puts beside its shards (``PREFIX-classes.json``).

    Raises:
        ValueError: The file holds no class list, or names a class twice.
    """
    with fs.open_input(url, storage_options) as f:
        text = f.read().decode("utf-8")
    try:
        found = json.loads(text)
    except ValueError:
        found = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(found, dict):
        found = found.get("classes")
    if not isinstance(found, list) or not found or not all(isinstance(n, str) for n in found):
        msg = f"{url}: not a class list (a JSON list of names, or one name per line)"
        raise ValueError(msg)
    return check_classes(found, url)


class ImageFolder(Dataset[tuple[Any, int]]):
    """Map-style dataset of ``(image, label)`` over ``root/<class>/**/<file>.<image ext>``.

    Args:
        root: The folder holding one sub-folder per class, as any fsspec URL.
        transform: Applied to each RGB ``PIL.Image.Image`` when it is read.
        storage_options: Passed unchanged to the filesystem.
        classes: The class list labels index: names, or the URL of a class list file
            (see :func:`read_classes`). Default: the sub-folders, sorted.

    Attributes:
        classes: The class list; a label indexes it.
        class_to_idx: Class name to label.
        samples: ``(url, label)`` of every image, by class then by URL.

    Raises:
        ShardNotFoundError: ``root`` does not exist.
        NoShardsError: ``root`` holds no class folders, or they hold no images (a
            ``FileNotFoundError``).
        TypeError: ``transform`` is not callable.
        ValueError: A class folder is not in ``classes``.
    """

    def __init__(
        self,
        root: str,
        *,
        transform: Callable[[Any], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        classes: Sequence[str] | str | None = None,
    ) -> None:
        if transform is not None and not callable(transform):
            msg = f"transform must be callable or None (got {transform!r})"
            raise TypeError(msg)
        self.root = root
        self.transform = transform
        self.storage_options = dict(storage_options or {})
        if isinstance(classes, str):
            classes = read_classes(classes, self.storage_options)
        self.classes, images = class_images(root, self.storage_options, classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [(url, label) for url, label, _ in images]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        url, label = self.samples[index]
        with fs.open_input(url, self.storage_options) as f:
            data = f.read()
        try:
            image: Any = decode_image(data, "pil")  # an RGB image
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            problem = f"cannot decode image: {described(exc)}"
            raise DecodeError(problem, url=url, member=url.rsplit("/", 1)[-1]) from exc
        if self.transform is not None:
            image = self.transform(image)
        return image, label

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(root={self.root!r}, classes={len(self.classes)}, samples={len(self)})"


def image_folder(
    root: str,
    *,
    transform: Callable[[Any], Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    classes: Sequence[str] | str | None = None,
) -> ImageFolder:
    """Random-access dataset over a folder of images, one sub-folder per class, on any fsspec path.

    Args:
        root: The folder holding one sub-folder per class (local path or fsspec URL).
        transform: Applied to each RGB ``PIL.Image.Image`` when it is read.
        storage_options: Passed unchanged to the filesystem (credentials, endpoint…).
        classes: The class list labels index, so that a split missing a class keeps the
            others' labels: names (``train.classes``), or a class list's URL (the
            ``PREFIX-classes.json`` that ``shardpipes write`` puts beside its shards).
            Default: the sub-folders, sorted (hidden ones left out).

    Returns:
        An :class:`ImageFolder`: item ``i`` is ``(transform(image), label)``, with labels
        indexing ``classes`` (``.classes``), as in torchvision.

    Raises:
        ShardNotFoundError: ``root`` does not exist.
        NoShardsError: ``root`` holds no class folders with images.
        ValueError: A class folder is not in ``classes``.

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
    return ImageFolder(root, transform=transform, storage_options=storage_options, classes=classes)
