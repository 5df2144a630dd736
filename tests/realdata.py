"""Realistic image shards for tests: photos' sizes and modes, not 12 × 10 RGB squares.

`build_shards` writes WebDataset-style tar shards (``train-000000.tar``, …) with Python's
`tarfile`. Each sample is an image and a ``.cls`` label. The images are what a scraped
image set holds: JPEGs from about 40 to 300 px a side, landscape and portrait, in RGB,
grayscale (``L``) and ``CMYK``, and PNGs with an alpha channel (JPEG cannot hold
``RGBA``). Labels are the samples' global index (unique), so a test can tell that every
sample came exactly once from the labels alone.

Example::

    shards = build_shards(tmp_path / "data")  # 4 shards × 12 samples, about 0.2 s
    pipe = sp.recipes.tar_shards(shards.pattern, image="torch")
    assert sorted(label for _, label in pipe) == shards.labels
"""

from __future__ import annotations

import io
import random
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy
from PIL import Image, ImageDraw

__all__ = ["MODES", "RealSample", "RealShards", "build_shards", "real_image"]

# (extension, Pillow mode), in the order the samples cycle through them
MODES = (("jpg", "RGB"), ("jpg", "L"), ("jpg", "CMYK"), ("png", "RGBA"))
SIDES = (40, 300)  # smallest and largest side, in pixels
MTIME = 1_700_000_000  # fixed member times: the same bytes on every run


@dataclass(frozen=True)
class RealSample:
    """What one sample holds: its key, image extension and mode, size and label."""

    key: str
    ext: str
    mode: str
    size: tuple[int, int]  # (width, height)
    label: int


@dataclass
class RealShards:
    """Shards written by `build_shards`, and the samples in them in shard order."""

    folder: Path
    paths: list[Path] = field(default_factory=list)
    samples: list[RealSample] = field(default_factory=list)

    @property
    def pattern(self) -> str:
        """A brace pattern naming exactly these shards: ``folder/train-{000000..000003}.tar``."""
        return f"{self.folder}/train-{{000000..{len(self.paths) - 1:06d}}}.tar"

    @property
    def labels(self) -> list[int]:
        """Every sample's label, sorted (each label is one sample's)."""
        return sorted(s.label for s in self.samples)


def real_image(rng: random.Random, mode: str, size: tuple[int, int]) -> Image.Image:
    """An image with a gradient, noise and a few shapes (JPEG sizes like a photo's)."""
    width, height = size
    nprng = numpy.random.default_rng(rng.getrandbits(32))
    ramp_x = numpy.linspace(0, 255, width, dtype=numpy.float32)[None, :, None]
    ramp_y = numpy.linspace(255, 0, height, dtype=numpy.float32)[:, None, None]
    tint = nprng.uniform(0.2, 1.0, size=(1, 1, 3)).astype(numpy.float32)
    noise = nprng.normal(0, 12, size=(height, width, 3)).astype(numpy.float32)
    pixels = numpy.clip((ramp_x + ramp_y) / 2 * tint + noise, 0, 255).astype(numpy.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        box = (x0, y0, x0 + rng.randint(5, width // 2 + 5), y0 + rng.randint(5, height // 2 + 5))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    if mode == "RGBA":
        alpha = Image.linear_gradient("L").resize(size).rotate(rng.choice((0, 90, 180, 270)))
        image.putalpha(alpha)
        return image
    return image.convert(mode)


def random_size(rng: random.Random, index: int) -> tuple[int, int]:
    """A (width, height) within `SIDES`: landscape for even ``index``, portrait for odd."""
    long_side = rng.randint(SIDES[0] + 20, SIDES[1])
    short_side = rng.randint(SIDES[0], long_side - 10)
    return (long_side, short_side) if index % 2 == 0 else (short_side, long_side)


def encode(image: Image.Image, ext: str, rng: random.Random) -> bytes:
    """The image as a JPEG (quality 70–95) or PNG file."""
    out = io.BytesIO()
    if ext == "jpg":
        image.save(out, format="JPEG", quality=rng.randint(70, 95))
    else:
        image.save(out, format="PNG")
    return out.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add a regular file with the owner and times a writer on a real machine would give."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), MTIME, 0o644
    info.uname = info.gname = "data"
    tar.addfile(info, io.BytesIO(data))


def build_shards(
    folder: Path, *, shards: int = 4, per_shard: int = 12, seed: int = 0
) -> RealShards:
    """Write ``shards`` tar shards of ``per_shard`` samples each into ``folder``.

    Sample ``i`` (counted over all shards) has key ``sample-{i:06d}``, label ``i`` and an
    image in mode ``MODES[i % 4]`` (so each shard holds every mode), landscape when ``i``
    is even. The same ``seed`` gives the same bytes.

    Args:
        folder: Where to write the shards (created if missing).
        shards: How many shards.
        per_shard: Samples in each shard.
        seed: Seed of the sizes, colours, shapes and JPEG qualities.

    Returns:
        The shards' paths and what each sample holds.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    built = RealShards(folder)
    for s in range(shards):
        path = folder / f"train-{s:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                ext, mode = MODES[i % len(MODES)]
                sample = RealSample(f"sample-{i:06d}", ext, mode, random_size(rng, i), i)
                image = real_image(rng, mode, sample.size)
                add_member(tar, f"{sample.key}.{ext}", encode(image, ext, rng))
                add_member(tar, f"{sample.key}.cls", str(sample.label).encode())
                built.samples.append(sample)
        built.paths.append(path)
    return built
