"""Tests of the ``image_folder`` recipe over local, ``file://`` and ``memory://`` folders."""

from __future__ import annotations

import io
import pickle
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader

from shardpipes import fs
from shardpipes.errors import DecodeError, ShardNotFoundError
from shardpipes.recipes.image_folder import ImageFolder, image_folder

# class folder -> files in it; created in this (unsorted) order on purpose
LAYOUT = {
    "zebra": ["b.png", "a.png"],
    "ant": ["c.png", "nested/d.png"],
    "Mole": ["e.png"],
}
CLASSES = ["Mole", "ant", "zebra"]  # sorted(), as torchvision does


def _png(red: int, size: tuple[int, int] = (3, 2), mode: str = "RGB") -> bytes:
    """A PNG whose every pixel has the given red value (an identity that survives decoding)."""
    colour = red if mode == "L" else (red, 7, 9)
    buf = io.BytesIO()
    Image.new(mode, size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _write(url: str, data: bytes) -> None:
    with fs.open_output(url) as f:
        f.write(data)


def _red(image: Image.Image) -> int:
    """Transform: an image to its identifying red value (module level, so it pickles)."""
    return int(image.getpixel((0, 0))[0])  # type: ignore[index]


def _build(root: str) -> dict[str, tuple[int, int]]:
    """Write LAYOUT under ``root``; return file basename -> (red id, expected label)."""
    expected = {}
    for red, (cls, name) in enumerate((c, n) for c, ns in LAYOUT.items() for n in ns):
        _write(f"{root}/{cls}/{name}", _png(red))
        expected[name.rsplit("/", 1)[-1]] = (red, CLASSES.index(cls))
    return expected


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh memory:// folder, removed afterwards."""
    name = f"image-folder-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    mem = fsspec.filesystem("memory")
    if mem.exists(f"/{name}"):
        mem.rm(f"/{name}", recursive=True)


@pytest.fixture(params=["path", "file_url", "memory"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path, memory_root: str) -> str:
    """An image folder root in each URL style: plain path, file://, memory://."""
    styles: dict[str, Callable[[], str]] = {
        "path": lambda: str(tmp_path / "data"),
        "file_url": lambda: (tmp_path / "data").as_uri(),
        "memory": lambda: memory_root,
    }
    return styles[request.param]()


class TestImageFolder:
    def test_classes_from_sorted_subfolders(self, any_root: str) -> None:
        """Classes are the sorted sub-folder names; labels index them."""
        _build(any_root)
        ds = image_folder(any_root)
        assert ds.classes == CLASSES
        assert ds.class_to_idx == {"Mole": 0, "ant": 1, "zebra": 2}
        assert [label for _, label in ds.samples] == [0, 1, 1, 2, 2]

    def test_samples_sorted_and_recursive(self, any_root: str) -> None:
        """Samples are sorted by class then URL, nested files included."""
        _build(any_root)
        names = [url.rsplit("/", 2)[-2:] for url, _ in image_folder(any_root).samples]
        assert names == [
            ["Mole", "e.png"],
            ["ant", "c.png"],
            ["nested", "d.png"],
            ["zebra", "a.png"],
            ["zebra", "b.png"],
        ]

    def test_items_are_rgb_with_labels(self, any_root: str) -> None:
        """Each item decodes to an RGB image with its folder's label."""
        expected = _build(any_root)
        ds = image_folder(any_root)
        assert len(ds) == len(expected)
        for i, (url, _) in enumerate(ds.samples):
            image, label = ds[i]
            assert isinstance(image, Image.Image)
            assert image.mode == "RGB"
            assert (_red(image), label) == expected[url.rsplit("/", 1)[-1]]

    def test_transform_applied(self, tmp_path: Path) -> None:
        """The transform maps each image; the label is untouched."""
        _write(str(tmp_path / "a" / "x.png"), _png(5, size=(7, 3)))
        ds = image_folder(str(tmp_path), transform=lambda im: im.size)
        assert ds[0] == ((7, 3), 0)

    @pytest.mark.parametrize("mode", ["L", "RGBA", "P", "1"])
    def test_converted_to_rgb(self, tmp_path: Path, mode: str) -> None:
        """Grey, alpha, palette and bilevel images come out as RGB."""
        buf = io.BytesIO()
        Image.new(mode, (2, 2)).save(buf, format="PNG")
        _write(str(tmp_path / "a" / "x.png"), buf.getvalue())
        assert image_folder(str(tmp_path))[0][0].mode == "RGB"

    @pytest.mark.parametrize(
        ("name", "taken"),
        [
            ("a.jpg", True),
            ("a.JPG", True),
            ("a.jpeg", True),
            ("a.Png", True),
            ("a.ppm", True),
            ("a.pgm", True),
            ("a.pbm", True),
            ("a.bmp", True),
            ("a.gif", True),
            ("a.tif", True),
            ("a.TIFF", True),
            ("a.webp", True),
            ("a.txt", False),
            ("a.jpg.bak", False),
            ("jpg", False),
            ("png.json", False),
            ("README", False),
        ],
    )
    def test_only_image_extensions(self, tmp_path: Path, name: str, taken: bool) -> None:
        """Only files with an image extension (any case) are samples."""
        _write(str(tmp_path / "cls" / "keep.png"), _png(0))
        _write(str(tmp_path / "cls" / name), b"whatever")
        found = {url.rsplit("/", 1)[-1] for url, _ in image_folder(str(tmp_path)).samples}
        assert found == ({"keep.png", name} if taken else {"keep.png"})

    def test_symlinks_never_lead_out_of_root(self, tmp_path: Path) -> None:
        """Links to folders and to files outside root are left out; links inside are kept."""
        root, outside = tmp_path / "root", tmp_path / "outside"
        _write(str(root / "cls" / "a.png"), _png(0))
        _write(str(outside / "secret.png"), _png(1))
        (root / "cls" / "secret.png").symlink_to(outside / "secret.png")
        (root / "cls" / "linked").symlink_to(outside)
        (root / "cls" / "again.png").symlink_to(root / "cls" / "a.png")
        found = sorted(url.rsplit("/", 1)[-1] for url, _ in image_folder(str(root)).samples)
        assert found == ["a.png", "again.png"]

    def test_eps_under_an_image_name_is_not_opened(self, tmp_path: Path) -> None:
        """Only raster formats are opened: an EPS file named .png is a DecodeError."""
        _write(
            str(tmp_path / "cls" / "x.png"), b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 1 1\n"
        )
        with pytest.raises(DecodeError, match=r"x\.png") as info:
            image_folder(str(tmp_path))[0]
        assert isinstance(info.value.__cause__, UnidentifiedImageError)  # never identified as EPS

    def test_files_at_root_ignored(self, tmp_path: Path) -> None:
        """Images directly in root belong to no class and are skipped."""
        _write(str(tmp_path / "stray.png"), _png(0))
        _write(str(tmp_path / "cls" / "x.png"), _png(1))
        ds = image_folder(str(tmp_path))
        assert ds.classes == ["cls"]
        assert len(ds) == 1

    def test_pickles_without_filesystem(self, memory_root: str) -> None:
        """A pickled dataset holds only plain state and reads the same items."""
        _build(memory_root)
        ds = image_folder(memory_root, transform=_red, storage_options={})
        clone = pickle.loads(pickle.dumps(ds))
        assert isinstance(clone, ImageFolder)
        assert not any(isinstance(v, fsspec.AbstractFileSystem) for v in vars(ds).values())
        assert [clone[i] for i in range(len(clone))] == [ds[i] for i in range(len(ds))]

    def test_load_missing_root(self, tmp_path: Path, memory_root: str) -> None:
        """A missing root is a ShardNotFoundError naming it."""
        for root in (str(tmp_path / "nope"), f"{memory_root}/nope"):
            with pytest.raises(ShardNotFoundError, match=re.escape(root)):
                image_folder(root)

    @pytest.mark.parametrize("files", [[], ["notes.txt"], ["cls/notes.txt"], ["cls/sub/readme.md"]])
    def test_root_without_images(self, tmp_path: Path, files: list[str]) -> None:
        """A root with no class folder holding images is a FileNotFoundError naming it."""
        root = tmp_path / "data"
        root.mkdir()
        for name in files:
            _write(str(root / name), b"text")
        with pytest.raises(FileNotFoundError, match=re.escape(str(root))):
            image_folder(str(root))

    @pytest.mark.parametrize(
        "data", [b"not an image", _png(3)[:40], b""], ids=["garbage", "truncated", "empty"]
    )
    def test_corrupt_image(self, memory_root: str, data: bytes) -> None:
        """An undecodable image is a DecodeError naming its URL and file."""
        _write(f"{memory_root}/cls/bad.png", data)
        ds = image_folder(memory_root)
        with pytest.raises(DecodeError, match=re.escape(ds.samples[0][0])) as info:
            ds[0]
        assert info.value.url == ds.samples[0][0]
        assert info.value.member == "bad.png"
        assert isinstance(info.value, ValueError)

    def test_bad_transform(self, tmp_path: Path) -> None:
        """A non-callable transform is a TypeError."""
        with pytest.raises(TypeError, match=r"transform must be callable or None \(got 'x'\)"):
            image_folder(str(tmp_path), transform="x")  # type: ignore[arg-type]


class TestImageFolderDataLoader:
    @pytest.mark.parametrize(
        ("num_workers", "batch_size"),
        [
            (0, None),
            (0, 2),
            pytest.param(2, None, marks=pytest.mark.slow),
            pytest.param(2, 2, marks=pytest.mark.slow),
        ],
    )
    def test_each_file_exactly_once(
        self, tmp_path: Path, num_workers: int, batch_size: int | None
    ) -> None:
        """Over one epoch every (file, label) pair arrives exactly once."""
        root = str(tmp_path / "data")
        expected = _build(root)
        ds = image_folder(root, transform=_red)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
        pairs: list[tuple[int, int]] = []
        for red, label in loader:
            if isinstance(red, torch.Tensor):
                pairs.extend(zip(red.tolist(), label.tolist(), strict=True))
            else:
                pairs.append((red, label))
        assert sorted(pairs) == sorted(expected.values())

    def test_memory_in_process(self, memory_root: str) -> None:
        """memory:// folders load through a single-process DataLoader."""
        expected = _build(memory_root)
        loader = DataLoader(image_folder(memory_root, transform=_red), batch_size=None)
        assert sorted((red, label) for red, label in loader) == sorted(expected.values())


class TestClassList:
    """``classes=``: a split missing a class keeps the others' labels (issue 24 §1)."""

    def test_labels_index_the_list_given(self, any_root: str) -> None:
        """Without zebra's folder, a split labelled by the full list keeps ant at 1."""
        _build(any_root)
        whole = image_folder(any_root)
        _write(f"{any_root}-val/ant/c.png", _png(2))
        val = image_folder(f"{any_root}-val", classes=whole.classes, transform=_red)
        assert val.classes == CLASSES
        assert [label for _, label in val] == [1]  # ant, as in the whole dataset
        assert image_folder(f"{any_root}-val").classes == ["ant"]  # its own: ant would be 0

    def test_a_class_list_file(self, tmp_path: Path) -> None:
        root = str(tmp_path / "val")
        _write(f"{root}/zebra/a.png", _png(1))
        listing = tmp_path / "train-classes.json"
        listing.write_text('{"classes": ["Mole", "ant", "zebra"]}')
        ds = image_folder(root, classes=str(listing))
        assert ds.classes == CLASSES and ds[0][1] == 2
        names = tmp_path / "names.txt"
        names.write_text("zebra\nant\n")
        assert image_folder(root, classes=str(names))[0][1] == 0

    @pytest.mark.parametrize(
        ("classes", "error", "match"),
        [
            (["Mole", "ant"], ValueError, r"class folder\(s\) 'zebra' not in the class list"),
            (["ant", "ant", "zebra", "Mole"], ValueError, r"names 'ant' twice"),
            ([], ValueError, r"the class list is empty"),
            ([1, 2], TypeError, r"classes must be a list of class names"),
        ],
    )
    def test_bad_lists_are_refused(
        self, tmp_path: Path, classes: list[object], error: type[Exception], match: str
    ) -> None:
        _build(str(tmp_path))
        with pytest.raises(error, match=match):
            image_folder(str(tmp_path), classes=classes)  # type: ignore[arg-type]

    def test_hidden_folders_and_files_are_not_classes(self, tmp_path: Path) -> None:
        """.ipynb_checkpoints would be class 0 (torchvision takes it) and shift the rest."""
        expected = _build(str(tmp_path))
        _write(f"{tmp_path}/.ipynb_checkpoints/x.png", _png(99))
        _write(f"{tmp_path}/ant/._c.png", b"AppleDouble")
        ds = image_folder(str(tmp_path), transform=_red)
        assert ds.classes == CLASSES
        assert sorted(ds) == sorted(expected.values())
