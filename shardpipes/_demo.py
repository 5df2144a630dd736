"""The dataset behind ``shardpipes demo``: small synthetic images, written once, then reused.

Images are drawn with Pillow and NumPy from a fixed seed (no downloads): one of ten
classes, each with its own colour and stripe pattern, shifted and noised per sample, so
every image is distinct. They are stored as JPEG + ``cls`` samples in tar shards with a
``manifest.json`` written last; a folder whose manifest and shard sizes match is complete
and is reused.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy
from PIL import Image

from shardpipes._core.writer import TarShardWriter

CLASSES = 10
SIZE = 64
SEED = 20240601
_VERSION = 1
_COLOURS = [(220, 40, 40), (40, 180, 60), (40, 70, 220), (230, 200, 40), (160, 50, 200),
            (40, 200, 200), (240, 130, 30), (120, 120, 120), (250, 250, 250),
            (90, 50, 20)]  # fmt: skip


def default_cache() -> Path:
    """Return ``$XDG_CACHE_HOME/shardpipes/demo``, or ``~/.cache/shardpipes/demo``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardpipes" / "demo"


def make_image(index: int, label: int) -> bytes:
    r"""Draw sample ``index`` of class ``label`` and return it as JPEG bytes.

    Example:
        >>> make_image(3, 3)[:2] == b"\xff\xd8" and make_image(3, 3) == make_image(3, 3)
        True
    """
    rng = numpy.random.default_rng([SEED, index])
    y, x = numpy.mgrid[0:SIZE, 0:SIZE].astype(numpy.float32)
    angle = math.pi * label / CLASSES
    period = 6.0 + 2.0 * (label % 5)
    phase = rng.uniform(0, 2 * math.pi)
    wave = numpy.sin((x * math.cos(angle) + y * math.sin(angle)) * 2 * math.pi / period + phase)
    colour = numpy.asarray(_COLOURS[label], dtype=numpy.float32)
    pixels = colour * (0.65 + 0.35 * wave[..., None]) + rng.normal(0, 12, (SIZE, SIZE, 3))
    buf = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(numpy.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _complete(folder: Path, samples: int) -> dict[str, Any] | None:
    """Return the folder's manifest if the dataset in it is complete, else ``None``."""
    try:
        manifest: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
        ok = manifest["version"] == _VERSION and manifest["samples"] == samples
        ok = ok and all((folder / n).stat().st_size == size for n, _, size in manifest["shards"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest if ok else None


def ensure_dataset(cache: str | os.PathLike[str], *, samples: int, shards: int) -> dict[str, Any]:
    """Write the demo dataset under ``cache`` unless a complete copy is there already.

    Args:
        cache: The demo's cache folder; each size of dataset gets a sub-folder.
        samples: Number of images.
        shards: Number of shards to aim for (each holds ``ceil(samples / shards)``).

    Returns:
        The manifest: ``folder``, ``samples``, ``shards`` (``[name, samples, bytes]``
        lists), ``classes`` (label to count, keys as strings), ``reused``.
    """
    folder = Path(cache) / f"{samples}-{shards}"
    manifest = _complete(folder, samples)
    if manifest is not None:
        return {**manifest, "folder": str(folder), "reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    labels = [i % CLASSES for i in range(samples)]
    per_shard = math.ceil(samples / shards)
    pattern = str(folder / "train-%06d.tar")
    with TarShardWriter(pattern, opener=lambda url: open(url, "wb"), max_samples=per_shard) as w:
        for i, label in enumerate(labels):
            w.write({"__key__": f"{i:06d}", "jpg": make_image(i, label), "cls": str(label)})
    manifest = {
        "version": _VERSION,
        "samples": samples,
        "shards": [[Path(s.url).name, s.samples, s.size] for s in w.shards],
        "classes": {str(k): v for k, v in sorted(Counter(labels).items())},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return {**manifest, "folder": str(folder), "reused": False}


def fingerprints(images: Iterable[Any]) -> list[str]:
    """Return a short hash of each decoded image (an array or a tensor) for the exactly-once check.

    Example:
        >>> a, b = numpy.zeros((3, 2, 2), numpy.uint8), numpy.ones((3, 2, 2), numpy.uint8)
        >>> len(set(fingerprints([a, b, a.copy()])))
        2
    """
    return [
        hashlib.blake2b(numpy.asarray(im).tobytes(), digest_size=12).hexdigest() for im in images
    ]


def reference(urls: Sequence[str]) -> Counter[str]:
    """Fingerprint every image of the dataset, read in order in this process by ``tar_shards``."""
    from shardpipes.recipes.tar_shards import tar_shards

    return Counter(
        fingerprints(image for image, _ in tar_shards(urls, shuffle=False, image="torch"))
    )


def stream(
    urls: Sequence[str],
    *,
    workers: int,
    batch_size: int = 32,
    progress: Callable[[int], object] | None = None,
) -> tuple[Counter[str], Counter[int]]:
    """Read the dataset once through ``tar_shards`` and a ``DataLoader`` with ``workers``.

    Args:
        urls: The shard URLs.
        workers: DataLoader worker processes (0 reads in this process).
        batch_size: Samples per batch.
        progress: Called with the size of each batch as it arrives.

    Returns:
        The fingerprints of the images read, and the labels read, with their counts.
    """
    from torch.utils.data import DataLoader

    from shardpipes.recipes.tar_shards import tar_shards

    pipe = tar_shards(urls, image="torch")
    seen, labels = Counter[str](), Counter[int]()
    for images, batch in DataLoader(pipe, batch_size=batch_size, num_workers=workers):
        seen.update(fingerprints(images))
        labels.update(batch.tolist())
        if progress is not None:
            progress(len(batch))
    return seen, labels


def exactly_once(
    manifest: dict[str, Any], expected: Counter[str], seen: Counter[str], labels: Counter[int]
) -> bool:
    """Return whether ``seen`` holds every image of the dataset once, and ``labels`` its classes.

    ``expected`` must hold as many distinct fingerprints as the dataset has images (the
    images are all different), and the labels must count as the manifest's classes do.
    """
    classes = Counter({int(k): v for k, v in manifest["classes"].items()})
    return len(expected) == manifest["samples"] and seen == expected and labels == classes
