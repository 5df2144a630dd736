"""``shardpipes write``: images in folders or a listing, into tar shards with sidecars."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from shardpipes import fs
from shardpipes._core.images import decode_image
from shardpipes._core.writer import TarShardWriter, pattern_parts
from shardpipes.cli.common import UsageError, counted
from shardpipes.errors import DecodeError

_UNSAFE = re.compile(r"[^\w-]+")
#: a file's extension as a sample's field: ".JPEG" images are read as "jpg;png" expects
_EXTENSIONS = {"jpeg": "jpg", "tif": "tiff"}


def write_command(args: argparse.Namespace) -> int:
    """Write the images the arguments name into shards; print each shard and the classes."""
    import random

    from tqdm import tqdm

    if args.seed is not None and not args.shuffle:
        msg = "--seed is the seed of --shuffle: give --shuffle too"
        raise UsageError(msg)
    options = dict(args.storage_options)
    classes, images, source = _labelled(args, options)
    if args.shuffle:
        random.Random(args.seed or 0).shuffle(images)
    head, tail = pattern_parts(args.out)
    old = _glob(f"{head}*{tail}", options)  # the shards already there: the number as "*"
    if old and not args.overwrite:
        msg = (
            f"{args.out}: {counted(len(old), 'shard')} already match the pattern "
            f"({old[0]}{', …' if len(old) > 1 else ''}); pass --overwrite to replace them"
        )
        raise ValueError(msg)
    for url in old:  # and their index sidecars, which would no longer fit
        fs.remove_file(url, options)
        fs.remove_file(f"{url}.idx", options)
    opener = lambda url: fs.open_output(url, options)  # noqa: E731
    writer = TarShardWriter(args.out, opener=opener, max_bytes=args.shard_size,
                            max_samples=args.samples_per_shard, index=args.index,
                            remove=lambda url: fs.remove_file(url, options))  # fmt: skip
    skipped = 0
    with writer, tqdm(total=len(images), unit="img", desc="write", file=sys.stderr) as bar:
        for (key, ext, label, _), data in _read_images(images, options, check=args.check):
            bar.update()
            if isinstance(data, DecodeError):
                _bad_image(data, args.handler)
                skipped += 1
                continue
            sample = {"__key__": key, ext: data, "cls": str(label)}
            writer.write({**sample, "class.txt": classes[label]})
    listing = classes_url(args.out)
    with fs.open_output(listing, options) as f:
        f.write(json.dumps({"classes": classes}, ensure_ascii=False, indent=1).encode())
    for shard in writer.shards:
        print(f"{shard.url}\t{counted(shard.samples, 'sample')}\t{counted(shard.size, 'byte')}")
    print(f"classes: {listing} ({counted(len(classes), 'class')}{source})")
    print(f"wrote {counted(writer.samples, 'sample')} to {counted(len(writer.shards), 'shard')}")
    if skipped:
        print(f"skipped {counted(skipped, 'image')} that do not decode")
    return 0


def classes_url(pattern: str) -> str:
    """Where ``shardpipes write`` puts the class list of the shards ``pattern`` names.

    Example:
        >>> classes_url("out/train-%06d.tar")
        'out/train-classes.json'
    """
    return pattern_parts(pattern)[0] + "classes.json"


def _labelled(
    args: argparse.Namespace, options: dict[str, Any]
) -> tuple[list[str], list[tuple[str, str, int, str]], str]:
    """The class list, the images with their labels, and where the list came from.

    By ``--classes``; else by the class list of another split written beside the output
    (``PREFIX-classes.json``), so that a split missing a class keeps the others' labels;
    else (or with ``--new-classes``) by the source's own class folders.

    Raises:
        ValueError: The source has a class folder the list lacks, or the lists beside the
            output disagree.
    """
    from shardpipes.recipes.image_folder import read_classes

    if args.classes:
        return (*_list_images(args.src, options, read_classes(args.classes, options)), "")
    found = [] if args.new_classes else _class_lists_beside(args.out, options)
    if not found:
        return (*_list_images(args.src, options, None), "")
    lists = {url: read_classes(url, options) for url in found}
    given = lists[found[0]]
    if any(other != given for other in lists.values()):
        msg = (
            f"the class lists beside {args.out} differ ({', '.join(found)}): pass --classes "
            "URL to label by one of them, or --new-classes to label by the source's folders"
        )
        raise ValueError(msg)
    try:
        classes, images = _list_images(args.src, options, given)
    except ValueError as exc:
        msg = (
            f"{exc}, {found[0]}, written beside these shards for another split: its labels "
            "would not mean the same. Pass --classes URL to label by another list, or "
            "--new-classes to label by the source's own folders"
        )
        raise ValueError(msg) from None
    return classes, images, f", the labels of {found[0]}"


def _class_lists_beside(pattern: str, options: dict[str, Any]) -> list[str]:
    """The class lists of other splits in the output's folder (not the one being written)."""
    head = pattern_parts(pattern)[0]
    folder = head.rpartition("/")[0] or "."
    own = classes_url(pattern)
    found = _glob(f"{folder}/*classes.json", options)
    return [url for url in found if url != own and not url.endswith(own)]


def _glob(pattern: str, options: dict[str, Any]) -> list[str]:
    """The files that match ``pattern``, sorted; none if its folder does not exist."""
    try:
        return sorted(fs.glob(pattern, options))
    except FileNotFoundError:
        return []


def _read_images(
    images: list[tuple[str, str, int, str]], options: dict[str, Any], *, check: bool
) -> Iterator[tuple[tuple[str, str, int, str], bytes | DecodeError]]:
    """Each image with its bytes, in order (or the ``DecodeError`` of one that does not decode).

    Read and decoded on a few threads (Pillow decodes without the GIL), a window at a time.
    """
    from concurrent.futures import ThreadPoolExecutor

    from shardpipes._core.decoders import located

    def read(image: tuple[str, str, int, str]) -> bytes | DecodeError:
        key, ext, _, url = image
        with fs.open_input(url, options) as f:
            data: bytes = f.read()
        if check:
            try:
                decode_image(data, "pil")
            except Exception as exc:  # every failure to decode is reported
                return located(exc, {"__url__": url, "__key__": key}, ext)
        return data

    threads = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads, thread_name_prefix="shardpipes-write") as pool:
        for start in range(0, len(images), 64):
            window = images[start : start + 64]
            yield from zip(window, pool.map(read, window), strict=True)


def _bad_image(exc: DecodeError, handler: str) -> None:
    """An image that does not decode: raised (``--handler raise``), else skipped."""
    if handler == "raise":
        msg = f"{exc} (--handler warn skips such images, naming each)"
        raise ValueError(msg) from exc
    if handler == "warn":
        print(f"shardpipes: warning: skipped: {' '.join(str(exc).split())}", file=sys.stderr)


def _list_images(
    src: str, options: dict[str, Any], given: list[str] | None
) -> tuple[list[str], list[tuple[str, str, int, str]]]:
    """The class list, and ``(key, field, label, url)`` of every image under ``src``'s classes.

    The field is the file's extension, lower-cased, ``jpeg`` as ``jpg``.

    Labels index ``given`` when it is given (a class folder not in it is an error), else
    the sorted class folders.
    """
    from shardpipes.recipes.image_folder import class_images

    classes, images = class_images(src, options, given)
    found, keys = [], set[str]()
    for url, label, parts in images:
        stem, _, ext = parts[-1].rpartition(".")
        key = "/".join(_UNSAFE.sub("_", part).strip("_") or "_" for part in [*parts[:-1], stem])
        base, n = key, 1
        while key in keys:
            n += 1
            key = f"{base}_{n}"
        keys.add(key)
        found.append((key, _EXTENSIONS.get(ext.lower(), ext.lower()), label, url))
    return classes, found
