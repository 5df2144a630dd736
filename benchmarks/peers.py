"""The peer rows of the benchmark: other loaders, as their users write them, and limits.

Loader rows (``(layout, kind, workers) -> DataLoader`` of ``(payload, labels)`` batches):

- ``webdataset``: webdataset 1.0.2's fluid ``WebDataset`` chain.
- ``torchdata09``: torchdata 0.9's DataPipes; runs only in the venv of ``td09.py``.
- ``notebook_folder``: the tutorial notebook's map-style Dataset over a folder of JPEGs.
- ``notebook_tarsplit``: the notebook's one-tar-per-worker ``IterableDataset``.
- ``tarfile``: plain ``tarfile`` streaming, shards split by worker (``small`` only).

Limit rows (they time themselves, in ``workers`` forked processes, 1 in-process for 0):
``limit_decode``, ``limit_decode_draft``, ``limit_read``, ``limit_tar_parse``.

Only the standard library and ``rows`` are imported here at the top: webdataset, torchdata,
torch, Pillow and NumPy are imported inside the rows, so this module imports in either venv.
"""

from __future__ import annotations

import functools
import io
import mmap
import multiprocessing
import os
import tarfile
import time
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from rows import BATCH, CROP, RESIZE, limit, loader, peer_transform

T = TypeVar("T")
R = TypeVar("R")
CHUNK = 1 << 20


def shard_paths(layout: dict[str, Any], kind: str) -> list[str]:
    """The 8 shard files of ``kind``."""
    paths: list[str] = layout["paths"]["image_shards" if kind == "images" else "small_shards"]
    return paths


def _identity(value: T) -> T:
    return value


# --- webdataset ------------------------------------------------------------------------


@loader("webdataset")
def webdataset_row(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """webdataset 1.0.2 as its README writes it, batched in the workers.

    ``WebDataset`` splits shards by worker by default in 1.0.2 (``workersplitter=
    split_by_worker``: worker ``w`` of ``n`` takes shards ``w::n``; ``nodesplitter=
    single_node_only``), so 8 shards over 2 workers come once each without an explicit
    splitter. ``shardshuffle=False`` keeps the shard order (and silences its warning).
    ``batched``'s default collation stacks the tensors, turns the ints into a NumPy array
    (the DataLoader's ``batch_size=None`` converts it to a tensor) and keeps the bytes
    as a list, which is what the harness wants: no ``collation_fn`` needed.
    """
    import webdataset as wds
    from torch.utils.data import DataLoader

    if kind == "images":
        dataset = wds.WebDataset(shard_paths(layout, kind), shardshuffle=False)
        dataset = dataset.decode("pil").to_tuple("jpg", "cls").map_tuple(peer_transform, int)
        dataset = dataset.batched(BATCH)
    else:
        dataset = webdataset_bytes(shard_paths(layout, kind), BATCH)
    return DataLoader(dataset, batch_size=None, num_workers=workers)


def webdataset_bytes(urls: list[str], batch: int) -> Any:
    """webdataset's chain for raw-bytes samples: batches of ``(.bin payloads, int(.cls))``.

    No decode: ``to_tuple`` hands the ``.bin`` bytes through and ``int()`` parses the
    b"123" of a ``.cls``. Also the webdataset row of ``latency.py`` (over ``http://``
    URLs, which webdataset reads with one ``curl`` per shard).
    """
    import webdataset as wds

    dataset = wds.WebDataset(urls, shardshuffle=False)
    return dataset.to_tuple("bin", "cls").map_tuple(_identity, int).batched(batch)


# --- torchdata 0.9 ---------------------------------------------------------------------


def _td09_image(sample: dict[str, Any]) -> tuple[Any, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(sample[".jpg"].read()))
    return peer_transform(image), int(sample[".cls"].read())


def _td09_small(sample: dict[str, Any]) -> tuple[bytes, int]:
    return sample[".bin"].read(), int(sample[".cls"].read())


@loader("torchdata09")
def torchdata09_row(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """torchdata 0.9's DataPipes, as its docs chain them; run in ``td09.py``'s venv.

    ``sharding_filter`` right after the URLs splits the shards over the DataLoader's
    workers (without it every worker reads every shard). The default ``collate``
    stacks the tensors, makes the ints a tensor and keeps ``bytes`` as a list.
    """
    import torchdata
    from torch.utils.data import DataLoader

    if not torchdata.__version__.startswith("0.9"):
        msg = f"torchdata09 needs torchdata 0.9 (got {torchdata.__version__}): see td09.py"
        raise RuntimeError(msg)
    with warnings.catch_warnings():  # its banner: "datapipes ... are deprecated"
        warnings.filterwarnings("ignore", r"\s*#+\s*WARNING", UserWarning)
        from torchdata.datapipes.iter import FileOpener, IterableWrapper

    pipe = IterableWrapper(shard_paths(layout, kind)).sharding_filter()
    pipe = FileOpener(pipe, mode="b").load_from_tar().webdataset()
    pipe = pipe.map(_td09_image if kind == "images" else _td09_small)
    return DataLoader(pipe.batch(BATCH).collate(), batch_size=None, num_workers=workers)


# --- the tutorial notebook's datasets --------------------------------------------------


@functools.cache
def _folder_dataset() -> type:
    from PIL import Image
    from torch.utils.data import Dataset

    class FolderImageDataset(Dataset):  # type: ignore[type-arg]
        """The notebook's map-style Dataset over a directory of images."""

        def __init__(self, folder: str, transform: Callable[[Any], Any] | None = None):
            self.folder = folder
            self.file_list = sorted(os.listdir(folder))
            self.transform = transform

        def __len__(self) -> int:
            return len(self.file_list)

        def __getitem__(self, idx: int) -> tuple[Any, int]:
            name = self.file_list[idx]
            image = Image.open(os.path.join(self.folder, name)).convert("RGB")
            if self.transform:
                image = self.transform(image)
            return image, int(os.path.splitext(name)[0])

    return FolderImageDataset


@loader("notebook_folder", kinds=("images",))
def notebook_folder_row(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """The folder Dataset through ``DataLoader(batch_size=64)`` and its default collate."""
    from torch.utils.data import DataLoader

    dataset = _folder_dataset()(layout["paths"]["image_folder"], transform=peer_transform)
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def tar_samples(path: str) -> Iterator[dict[str, bytes]]:
    """The samples of one tar, streamed (``"r|"``): members of one stem grouped by extension.

    Members are read as they pass (a stream-mode member can't be read later); a
    sample ends where the next stem starts, as in WebDataset's layout.
    """
    sample: dict[str, bytes] = {}
    key = None
    with tarfile.open(path, "r|") as tar:
        for member in tar:
            fileobj = tar.extractfile(member) if member.isreg() else None
            if fileobj is None:
                continue
            stem, ext = os.path.splitext(member.name)
            if stem != key and sample:
                yield sample
                sample = {}
            key = stem
            sample[ext] = fileobj.read()
    if sample:
        yield sample


def tar_image_iterator(path: str, transform: Callable[[Any], Any]) -> Iterator[tuple[Any, int]]:
    """The notebook's (undefined there) ``tar_image_iterator``: ``(image, label)`` pairs."""
    from PIL import Image

    for sample in tar_samples(path):
        image = Image.open(io.BytesIO(sample[".jpg"])).convert("RGB")
        yield transform(image), int(sample[".cls"])


def tar_bytes_iterator(path: str) -> Iterator[tuple[bytes, int]]:
    """``(payload bytes, label)`` pairs of one ``small`` shard."""
    for sample in tar_samples(path):
        yield sample[".bin"], int(sample[".cls"])


@functools.cache
def _tarsplit_dataset() -> type:
    import torch
    from torch.utils.data import IterableDataset

    class TarSplitDataset(IterableDataset):  # type: ignore[type-arg]
        """The notebook's one-tar-per-worker dataset, generalized to ``paths[w::n]``.

        The notebook raises unless ``num_workers == len(paths)`` (and reads
        ``worker_info.worker_id``, which is ``worker_info.id``); here worker ``w`` of
        ``n`` reads ``paths[w::n]``, and the main process (``num_workers=0``) all.
        """

        def __init__(self, paths: list[str], samples: Callable[[str], Iterator[Any]]):
            super().__init__()
            self.paths = paths
            self.samples = samples

        def __iter__(self) -> Iterator[Any]:
            worker_info = torch.utils.data.get_worker_info()
            paths = self.paths
            if worker_info is not None:
                paths = paths[worker_info.id :: worker_info.num_workers]
            for path in paths:
                yield from self.samples(path)

    return TarSplitDataset


def _image_samples(path: str) -> Iterator[tuple[Any, int]]:
    return tar_image_iterator(path, peer_transform)


@loader("notebook_tarsplit", kinds=("images",))
def notebook_tarsplit_row(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """The shards split by worker, ``DataLoader(batch_size=64)``, default collate."""
    from torch.utils.data import DataLoader

    dataset = _tarsplit_dataset()(shard_paths(layout, kind), _image_samples)
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def collate_bytes(batch: list[tuple[bytes, int]]) -> tuple[list[bytes], Any]:
    """Keep the payloads a list of ``bytes``; make the labels a tensor."""
    import torch

    return [payload for payload, _ in batch], torch.tensor([label for _, label in batch])


@loader("tarfile", kinds=("small",))
def tarfile_row(layout: dict[str, Any], kind: str, workers: int) -> Any:
    """Plain ``tarfile`` streaming, shards split by worker as in ``notebook_tarsplit``."""
    from torch.utils.data import DataLoader

    dataset = _tarsplit_dataset()(shard_paths(layout, kind), tar_bytes_iterator)
    return DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate_bytes)


# --- limits ----------------------------------------------------------------------------


def _child(work: Callable[[list[T]], R], items: list[T], start: Any, send: Connection) -> None:
    start.wait()
    began = time.perf_counter()
    result = work(items)
    send.send((result, began, time.perf_counter()))
    send.close()


def in_processes(
    work: Callable[[list[T]], R], items: list[T], workers: int
) -> tuple[list[R], float, float]:
    """``work(items[w::n])`` in ``n = workers`` forked processes (0: here), wall-timed.

    Returns the results; the seconds from the first process starting its work (they
    start together, at a barrier) to the last one ending it (``perf_counter`` is
    CLOCK_MONOTONIC, one clock for all processes); and the seconds that forking and
    starting the processes took before that (``items`` is inherited, not pickled).
    """
    if workers == 0:
        start = time.perf_counter()
        return [work(items)], time.perf_counter() - start, 0.0
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(workers)
    receivers, processes = [], []
    forked = time.perf_counter()
    for w in range(workers):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_child, args=(work, items[w::workers], barrier, send))
        process.start()
        send.close()
        receivers.append(receive)
        processes.append(process)
    results, began, ended = zip(*(receive.recv() for receive in receivers), strict=True)
    for process in processes:
        process.join()
    return list(results), max(ended) - min(began), min(began) - forked


def _load_jpegs(layout: dict[str, Any]) -> list[tuple[int, bytes]]:
    folder = Path(layout["paths"]["image_folder"])
    return [(int(path.stem), path.read_bytes()) for path in sorted(folder.glob("*.jpg"))]


def _resize_crop(image: Any) -> Any:
    """``peer_transform`` without the tensor: RGB, shorter side to 256, center 224."""
    image = image.convert("RGB")
    width, height = image.size
    scale = RESIZE / min(width, height)
    size = (max(RESIZE, round(width * scale)), max(RESIZE, round(height * scale)))
    image = image.resize(size, resample=2)
    left, top = round((size[0] - CROP) / 2), round((size[1] - CROP) / 2)
    return image.crop((left, top, left + CROP, top + CROP))


def _open(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _open_drafted(data: bytes) -> Any:
    """The (not yet decoded) image of ``data``, drafted to the resize target."""
    image = _open(data)
    width, height = image.size
    scale = RESIZE / min(width, height)
    image.draft("RGB", (round(width * scale), round(height * scale)))
    return image


def _decoder(open_image: Callable[[bytes], Any]) -> Callable[[list[tuple[int, bytes]]], list[int]]:
    def decode_all(items: list[tuple[int, bytes]]) -> list[int]:
        # one expression, so each image is freed before the next is opened: holding it
        # in a variable over the next decode costs 10-20% here, as glibc then maps fresh
        # pages for the pixel buffers (~150 page faults an image) instead of reusing them
        for _, data in items:
            _resize_crop(open_image(data))
        return [label for label, _ in items]

    return decode_all


def _decode_limit(
    layout: dict[str, Any], workers: int, open_image: Callable[[bytes], Any]
) -> dict[str, Any]:
    items = _load_jpegs(layout)
    results, seconds, startup = in_processes(_decoder(open_image), items, workers)
    out = {
        "seconds": seconds,
        "startup_s": startup,
        "labels": [n for part in results for n in part],
    }
    if open_image is _open_drafted:  # untimed: draft reads the header only
        out["draft_reduced"] = sum(
            _open_drafted(data).size != _open(data).size for _, data in items
        )
    return out


@limit("limit_decode", kinds=("images",))
def limit_decode(layout: dict[str, Any], kind: str, workers: int) -> dict[str, Any]:
    """Pillow alone: JPEG bytes already in memory -> decode, RGB, resize, center crop.

    Included: ``Image.open`` on a ``BytesIO``, the decode, ``convert("RGB")``, the
    antialiased bilinear resize (shorter side 256) and the 224 crop, as
    ``peer_transform`` does them. Excluded: file reads (done first, untimed), the
    tensor conversion, collation and any inter-process transfer of pixels.
    """
    return _decode_limit(layout, workers, _open)


@limit("limit_decode_draft", kinds=("images",))
def limit_decode_draft(layout: dict[str, Any], kind: str, workers: int) -> dict[str, Any]:
    """``limit_decode`` with ``Image.draft("RGB", resize target)`` before the decode.

    draft lets libjpeg scale by 1/2, 1/4 or 1/8 in the DCT while the result stays at
    least the requested size: only images of 512 px and more on both sides can halve
    and keep 256. ``draft_reduced`` counts the images it did shrink (0 of the
    benchmark's 300-500 px JPEGs: there draft changes nothing).
    """
    return _decode_limit(layout, workers, _open_drafted)


def _read_all(paths: list[str]) -> int:
    buffer = bytearray(CHUNK)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total


@limit("limit_read")
def limit_read(layout: dict[str, Any], kind: str, workers: int) -> dict[str, Any]:
    """Raw read bandwidth of the shard files: ``readinto`` 1 MiB chunks, page cache warm.

    Every file is read once first, untimed. ``samples`` is the data set's count, so
    the rate is the samples/s that reading alone would allow; ``mb_per_s`` is in MB (1e6).
    """
    paths = shard_paths(layout, kind)
    _read_all(paths)
    results, seconds, startup = in_processes(_read_all, paths, workers)
    labels = list(range(layout["counts"][kind]))
    mb_per_s = round(sum(results) / 1e6 / seconds, 1)
    return {"seconds": seconds, "startup_s": startup, "labels": labels, "mb_per_s": mb_per_s}


def _count_members(paths: list[str]) -> int:
    """Walk the 512-byte headers of each (mmapped) tar, reading each name and size."""
    members = 0
    for path in paths:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as tar:
            offset, end = 0, len(tar) - 512
            while offset <= end and tar[offset]:
                name = tar[offset : offset + 100].split(b"\0", 1)[0]
                size = int(tar[offset + 124 : offset + 136].rstrip(b"\0 ") or b"0", 8)
                offset += 512 + (size + 511) // 512 * 512
                members += bool(name)
    return members


@limit("limit_tar_parse")
def limit_tar_parse(layout: dict[str, Any], kind: str, workers: int) -> dict[str, Any]:
    """Raw tar-header parse: no member data is touched or copied; samples = members / 2.

    The files are mmapped (page cache warm: read once first, untimed), so the loop is
    Python slicing headers, with no system call per member.
    """
    paths = shard_paths(layout, kind)
    _read_all(paths)
    results, seconds, startup = in_processes(_count_members, paths, workers)
    return {"seconds": seconds, "startup_s": startup, "labels": list(range(sum(results) // 2))}
