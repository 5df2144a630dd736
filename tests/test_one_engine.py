"""One implementation per stage: a torch-free core, and the fused stage equal to the chain.

The recipes build the chain ``open_tar → shuffle_samples → decode → to_tuple → map →
batch → collate`` themselves; here a recipe and the chain written by hand are compared on
the same data for every option, with good and bad samples.
"""

from __future__ import annotations

import itertools
import json
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import shardpipes as sp
from shardpipes import _core
from tests.conftest import Dataset, write_tar
from tests.realdata import build_shards

ROOT = Path(__file__).resolve().parents[1]

# import every module of shardpipes/_core with torch blocked, without running the package's
# __init__ (which imports the pipes, hence torch): a stub parent package with the real path
NO_TORCH = """
import importlib, json, sys, types
sys.modules["torch"] = None  # `import torch` raises ImportError
pkg = types.ModuleType("shardpipes"); pkg.__path__ = [sys.argv[1]]
sys.modules["shardpipes"] = pkg
names = sys.argv[2:]
for name in names:
    importlib.import_module("shardpipes._core." + name)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "torch")))
"""


def test_core_imports_without_torch() -> None:
    """Every module under shardpipes/_core imports with torch blocked, and pulls none in."""
    names = [m.name for m in pkgutil.iter_modules(_core.__path__)]
    assert {
        "decoders",
        "policy",
        "reading",
        "stage",
        "shuffle",
        "steps",
        "fields",
        "tar",
        "split",
    } <= set(names)
    out = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(ROOT / "shardpipes"), *names],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == ["torch"]  # only the blocking entry itself


def transform(image: Any) -> Any:
    return image.flip(-1) if isinstance(image, torch.Tensor) else image


def chain(urls: list[str], opts: dict[str, Any]) -> Any:
    """The chain a user writes for tar_shards(**opts)."""
    pipe = sp.list_shards(urls).split_shards(shuffle=True, seed=5).open_tar(handler="ignore")
    if opts.get("buffer_size", 0) >= 2:
        pipe = pipe.shuffle_samples(buffer_size=opts["buffer_size"])
    pipe = pipe.decode(opts.get("image", "pil"), resize=opts.get("resize"),
                       crop=opts.get("crop"), handler="ignore")  # fmt: skip
    if opts.get("fields"):
        pipe = pipe.to_tuple(*opts["fields"], handler="ignore")
    if opts.get("transform"):
        pipe = pipe.map(first_transformed)
    if opts.get("batch_size"):
        pipe = pipe.batch(opts["batch_size"], drop_last=opts.get("drop_last", False)).collate()
    return pipe


def first_transformed(sample: tuple[Any, ...]) -> tuple[Any, ...]:
    return (transform(sample[0]), *sample[1:])


def fused(urls: list[str], opts: dict[str, Any]) -> Any:
    """The recipe with the same options (it builds the chain itself)."""
    extra = {"transform": transform} if opts.get("transform") else {}
    rest = {k: v for k, v in opts.items() if k != "transform"}
    rest = {"fields": (), "buffer_size": 0, **rest}
    return sp.recipes.tar_shards(urls, seed=5, handler="ignore", **rest, **extra)


def plain(item: Any) -> Any:
    """Comparable form of an output: tensors as lists, PIL images as bytes."""
    if isinstance(item, torch.Tensor):
        return item.tolist()
    if hasattr(item, "tobytes"):
        return (getattr(item, "size", None), item.tobytes())
    if isinstance(item, dict):
        return {k: plain(v) for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return [plain(v) for v in item]
    return item


OPTIONS: dict[str, dict[str, Any]] = {
    "dicts": {},
    "fields": {"fields": ("jpg;png", "cls")},
    "torch-resize-crop": {"fields": ("jpg;png", "cls"), "image": "torch", "resize": 24, "crop": 20},
    "numpy": {"fields": ("jpg;png", "__key__"), "image": "numpy", "resize": 16},
    "buffer": {"fields": ("__key__", "cls"), "buffer_size": 7},
    "transform": {"fields": ("jpg;png", "cls"), "image": "torch", "resize": 16, "crop": 16,
                  "transform": True},
    "batches": {"fields": ("jpg;png", "cls"), "image": "torch", "resize": 16, "crop": 16,
                "batch_size": 5},
    "batches-drop-last": {"fields": ("__key__", "cls"), "batch_size": 7, "drop_last": True,
                          "buffer_size": 4},
}  # fmt: skip


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Realistic shards, plus one with a broken image and one sample lacking its label."""
    folder = tmp_path_factory.mktemp("engine")
    real = build_shards(folder, shards=3, per_shard=8)
    bad = str(folder / "train-000003.tar")
    write_tar(bad, [("x1.jpg", b"not a jpeg"), ("x1.cls", b"1"), ("x2.png", real_png(real))])
    return [*map(str, real.paths), bad]


def real_png(real: Any) -> bytes:
    """A good image without a label (a missing field for to_tuple)."""
    import tarfile

    with tarfile.open(real.paths[0]) as tar:
        for member in tar:
            if member.name.endswith((".jpg", ".png")):
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read()
    raise AssertionError


@pytest.mark.parametrize("name", list(OPTIONS))
def test_fused_equals_chained(urls: list[str], name: str) -> None:
    """tar_shards(**options) == the chain of the same steps, item for item, bad data too."""
    opts = OPTIONS[name]
    got_fused = [plain(x) for x in fused(urls, opts)]
    got_chain = [plain(x) for x in chain(urls, opts)]
    assert got_fused
    assert got_fused == got_chain


def test_decode_before_to_tuple_decodes_only_the_picked_fields(
    make_shards: Callable[..., Dataset],
) -> None:
    """A bad field that to_tuple does not pick is never decoded, chained or fused."""
    data = make_shards(1, 3, images=True)
    bad = data.urls[0].replace("train-000000", "bad")
    write_tar(bad, [("a.png", b"not a png"), ("a.cls", b"4")])
    chained = sp.list_shards([bad]).open_tar().decode("torch").to_tuple("cls")
    assert list(chained) == [(4,)]
    with pytest.raises(sp.DecodeError, match=r"a\.png"):
        list(sp.list_shards([bad]).open_tar().decode("torch"))


def test_a_decoded_sample_keeps_its_offset(make_shards: Callable[..., Dataset]) -> None:
    """After decode, a missing field still names the byte offset of its sample."""
    data = make_shards(1, 3)
    pipe = sp.list_shards(data.urls).open_tar().decode().to_tuple("txt", "nope")
    with pytest.raises(sp.MissingFieldError, match=r"at byte 0\b"):
        next(iter(pipe))
    samples = list(sp.list_shards(data.urls).open_tar())
    decoded = list(sp.list_shards(data.urls).open_tar().decode())
    assert [getattr(s, "offset", None) for s in decoded] == [s.offset for s in samples]


@pytest.mark.parametrize("where", ["throughout", "at_the_end"])
def test_the_buffer_mixes_its_samples(make_shards: Callable[..., Dataset], where: str) -> None:
    """A 40-sample buffer over 400 samples in order leaves few input neighbours together."""
    data = make_shards(1, 400)
    pipe = sp.list_shards(data.urls).split_shards(seed=1).open_tar().shuffle_samples(buffer_size=40)
    order = [data.keys.index(s["__key__"]) for s in pipe]
    assert sorted(order) == list(range(400))
    part = order if where == "throughout" else order[-40:]  # the buffer's final drain
    neighbours = sum(b == a + 1 for a, b in itertools.pairwise(part))
    assert neighbours < len(part) // 10
