"""Shared fixtures: shards built at test time (Python tarfile, GNU tar, gzip, memory://)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import settings
from PIL import Image

# gcsfs's experimental HNS path probes emulators over gRPC and stalls ~60 s per call: off,
# before anything imports gcsfs
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

# shared 2-core machines: no per-example deadlines (they measure the neighbours, not us)
settings.register_profile("shardpipes", deadline=None)
settings.load_profile("shardpipes")


def image_bytes(
    label: int, index: int, fmt: str = "png", size: tuple[int, int] = (12, 10)
) -> bytes:
    """A tiny image whose pixel (0, 0) encodes (label, index), to identify it after decoding."""
    img = Image.new("RGB", size, (label * 20 % 256, index % 256, (index // 256) % 256))
    out = io.BytesIO()
    img.save(out, format="JPEG" if fmt == "jpg" else fmt.upper())
    return out.getvalue()


@dataclass
class Dataset:
    """Shards written for a test, and what they hold."""

    urls: list[str]
    keys: list[str] = field(default_factory=list)  # every sample key, in shard order
    labels: dict[str, int] = field(default_factory=dict)


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add one regular file to an open tarfile."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tar(
    path: str, members: list[tuple[str, bytes]], *, fmt: int = tarfile.PAX_FORMAT
) -> None:
    """Write members to a tar at any fsspec path; gzip when it ends in .gz/.tgz."""
    mode = "w:gz" if path.endswith((".gz", ".tgz")) else "w"
    with fsspec.open(path, "wb") as f, tarfile.open(fileobj=f, mode=mode, format=fmt) as tar:
        for name, data in members:
            add_member(tar, name, data)


def sample_members(key: str, label: int, index: int, *, images: bool) -> list[tuple[str, bytes]]:
    """The members of one sample: an image (or text) and a class label."""
    payload = image_bytes(label, index) if images else f"{key}\n".encode() * 3
    ext = "png" if images else "txt"
    return [(f"{key}.{ext}", payload), (f"{key}.cls", str(label).encode())]


def batch_keys(batches: object) -> list[str]:
    """The keys of (payload, keys) batches, in order."""
    return [k for batch in batches for k in batch[1]]  # type: ignore[attr-defined]


def opener_of(pipe: Any) -> Any:
    """The ``open_tar`` stage of the chain that ends at ``pipe`` (its reader reads ahead)."""
    from shardpipes.pipes.tar import TarOpener

    while not isinstance(pipe, TarOpener):  # (not `or`: a pipe's truth is its len())
        found = getattr(pipe, "source_datapipe", None)
        pipe = pipe.datapipe if found is None else found
    return pipe


def state_part(state: Any, key: str) -> Any:
    """The part of a pipeline state (or its envelope) a stage keeps under ``key``.

    A stage's state is its own plus ``{"source": ...}``: this goes down the sources (and
    a mix's ``sources``, first one first) to the first that has ``key``.
    """
    todo = [state]
    while todo:
        here = todo.pop(0)
        if isinstance(here, dict):
            if key in here:
                return here[key]
            todo += [here[k] for k in ("pipeline", "source") if k in here]
            todo += list(here.get("sources", {}).values())
    raise KeyError(key)


@pytest.fixture
def make_shards(tmp_path: Path) -> Callable[..., Dataset]:
    """Factory: ``make_shards(n_shards, per_shard, images=False, base=None, suffix=".tar")``."""

    def make(
        n_shards: int,
        per_shard: int | list[int],
        *,
        images: bool = False,
        base: str | None = None,
        suffix: str = ".tar",
    ) -> Dataset:
        counts = per_shard if isinstance(per_shard, list) else [per_shard] * n_shards
        root = base or str(tmp_path / "shards")
        if base is None:
            Path(root).mkdir(exist_ok=True)
        data = Dataset(urls=[])
        index = 0
        for s, count in enumerate(counts):
            members = []
            for i in range(count):
                key, label = f"s{s:02d}/{i:05d}", index % 7
                members += sample_members(key, label, index, images=images)
                data.keys.append(key)
                data.labels[key] = label
                index += 1
            url = f"{root}/train-{s:06d}{suffix}"
            write_tar(url, members)
            data.urls.append(url)
        return data

    return make


@pytest.fixture
def memfs() -> Iterator[fsspec.AbstractFileSystem]:
    """Fsspec's in-memory filesystem, emptied after the test."""
    fs = fsspec.filesystem("memory")
    yield fs
    fs.store.clear()
    fs.pseudo_dirs.clear()
    fs.pseudo_dirs.append("")


@pytest.fixture
def gnu_tar(tmp_path: Path) -> Callable[[dict[str, bytes], str], str]:
    """Factory: write files into a folder and archive it with the GNU ``tar`` command."""

    def make(files: dict[str, bytes], fmt: str = "gnu") -> str:
        src = tmp_path / f"src-{fmt}"
        for name, data in files.items():
            path = src / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        out = tmp_path / f"gnu-{fmt}.tar"
        subprocess.run(
            ["tar", f"--format={fmt}", "--sort=name", "-cf", str(out), "-C", str(src), "."],
            check=True,
        )
        return str(out)

    return make
