"""Tests of the ``shardpipes`` command, in-process through ``main`` and as the installed script."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from PIL import Image

import shardpipes as sp
from shardpipes import fs
from shardpipes._core.writer import parse_size
from shardpipes.cli import main
from shardpipes.pipes.index import read_index
from shardpipes.pipes.shards import ShardLister
from shardpipes.pipes.tar import TarOpener
from shardpipes.recipes import available

# file under the source folder -> (derived key, extension, label); classes sort ant, mole, zebra
FILES = {
    "zebra/b.png": ("zebra/b", "png", 2),
    "zebra/a.JPG": ("zebra/a", "jpg", 2),
    "zebra/c.jpeg": ("zebra/c", "jpg", 2),  # stored as jpg: what "jpg;png" expects
    "ant/x y.jpg": ("ant/x_y", "jpg", 0),
    "ant/nested/deep.png": ("ant/nested/deep", "png", 0),
    "ant/v1.2.png": ("ant/v1_2", "png", 0),
    "mole/only.png": ("mole/only", "png", 1),
}
KEYS = {key: (ext, label) for key, ext, label in FILES.values()}


def _image(i: int, ext: str) -> bytes:
    buf = io.BytesIO()
    fmt = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG"}[ext.lower()]
    Image.new("RGB", (4 + i, 3), (i * 30, 5, 9)).save(buf, format=fmt)
    return buf.getvalue()


def _write(url: str, data: bytes) -> None:
    with fs.open_output(url) as f:
        f.write(data)


def _build(root: str) -> dict[str, bytes]:
    """Write FILES under ``root`` (a local path or URL); return derived key -> file bytes."""
    contents = {}
    for i, (path, (key, ext, _)) in enumerate(FILES.items()):
        contents[key] = _image(i, ext)
        _write(f"{root}/{path}", contents[key])
    _write(f"{root}/ant/notes.txt", b"not an image: left out")
    return contents


def _read(pattern: str) -> dict[str, dict[str, Any]]:
    samples = TarOpener(ShardLister(pattern))
    out = {s["__key__"]: s for s in samples}
    assert len(out) == len(list(TarOpener(ShardLister(pattern))))  # no duplicate keys
    return out


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def source(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """A local class-folder tree of images, and its expected samples."""
    root = str(tmp_path / "src")
    return root, _build(root)


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh memory:// folder, removed afterwards."""
    root = f"memory://cli-{uuid.uuid4().hex}"
    yield root
    memfs = fsspec.filesystem("memory")
    if memfs.exists(root):
        memfs.rm(root, recursive=True)


def _shards(tmp_path: Path, n: int = 10, per_shard: int = 4) -> str:
    """Write ``n`` samples with the CLI's writer into ``tmp_path``; return a glob of them."""
    from shardpipes._core.writer import TarShardWriter

    with TarShardWriter(
        str(tmp_path / "d-%03d.tar"), opener=fs.open_output, max_samples=per_shard
    ) as w:
        for i in range(n):
            w.write({"__key__": f"k{i:02d}", "jpg": b"j" * (100 + i), "cls": str(i % 3)})
    return str(tmp_path / "d-*.tar")


class TestWrite:
    @pytest.mark.parametrize(("per_shard", "shards"), [("1", 7), ("3", 3), ("100", 1)])
    def test_split_by_samples(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
        per_shard: str,
        shards: int,
    ) -> None:
        """``--samples-per-shard`` splits; reading back gives exactly the images and labels."""
        root, contents = source
        status, out, _ = _run(
            capsys,
            "write",
            root,
            str(tmp_path / "out/t-%04d.tar"),
            "--samples-per-shard",
            per_shard,
        )
        assert status == 0
        plural = "shard" if shards == 1 else "shards"  # "1 shard", as English has it
        assert out.splitlines()[-1] == f"wrote {len(contents)} samples to {shards} {plural}"
        tars = [f"t-{i:04d}.tar{x}" for i in range(shards) for x in ("", ".idx")]
        assert sorted(os.listdir(tmp_path / "out")) == [*tars, "t-classes.json"]
        for tar in tars[::2]:  # each sidecar is the index a scan of its shard builds
            url = str(tmp_path / "out" / tar)
            assert read_index(url) == sp.build_index(url)
        back = _read(str(tmp_path / "out/t-*.tar"))
        assert set(back) == set(KEYS)
        for key, (ext, label) in KEYS.items():
            assert back[key][ext] == contents[key]
            assert back[key]["cls"] == str(label).encode()
            assert set(back[key]) == {"__key__", "__url__", ext, "cls", "class.txt"}
            assert back[key]["class.txt"] == key.split("/")[0].encode()

    @pytest.mark.parametrize("size", ["6k", "6000", "8KiB"])
    def test_split_by_size(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
        size: str,
    ) -> None:
        """``--shard-size`` keeps every shard within the size, and no sample is lost."""
        root, contents = source
        status, out, _ = _run(
            capsys, "write", root, str(tmp_path / "t-%d.tar"), "--shard-size", size
        )
        assert status == 0
        urls = list(ShardLister(str(tmp_path / "t-*.tar")))
        assert len(urls) > 1
        assert all(fs.size(url) <= parse_size(size) for url in urls)
        assert {k: s[KEYS[k][0]] for k, s in _read(str(tmp_path / "t-*.tar")).items()} == contents
        assert len(re.findall(r"\t\d+ samples?\t", out)) == len(urls)

    def test_memory_source_and_output(
        self, capsys: pytest.CaptureFixture[str], memory_root: str
    ) -> None:
        """Any fsspec URL works for the source folder and the shard pattern."""
        contents = _build(f"{memory_root}/src")
        status, out, _ = _run(
            capsys,
            "write",
            f"{memory_root}/src",
            f"{memory_root}/out/s-%02d.tar",
            "--samples-per-shard",
            "4",
        )
        assert status == 0
        assert "wrote 7 samples to 2 shards" in out
        back = _read(f"{memory_root}/out/s-{{00..01}}.tar")
        assert {k: s[KEYS[k][0]] for k, s in back.items()} == contents

    def test_storage_options_reach_the_filesystem(
        self,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
    ) -> None:
        """``-o key=value`` options reach every fsspec call, values parsed as JSON."""
        seen: list[dict[str, Any]] = []
        for name in ("url_to_fs", "open_input", "open_output"):
            real = getattr(fs, name)

            def spy(url: str, options: Any = None, _real: Any = real) -> Any:
                seen.append(dict(options or {}))
                return _real(url, options)

            for module in (fs, fs.backends, fs.files, fs.reads):
                if getattr(module, name, None) is real:
                    monkeypatch.setattr(module, name, spy)
        argv = ["-o", "auto_mkdir=true", "-o", "block_size=1024", "-o", "tag=a=b"]
        status, _, _ = _run(capsys, "write", source[0], str(tmp_path / "t-%d.tar"), *argv)
        assert status == 0
        assert len(seen) > len(FILES)
        assert all(o == {"auto_mkdir": True, "block_size": 1024, "tag": "a=b"} for o in seen)

    def test_symlinks_do_not_leave_the_source(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
    ) -> None:
        """A linked file outside the source and a linked folder are left out; one inside stays."""
        root, _ = source
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret.png").write_bytes(_image(1, "png"))
        os.symlink(outside / "secret.png", f"{root}/mole/secret.png")
        os.symlink(outside, f"{root}/mole/linked")
        os.symlink(f"{root}/zebra/b.png", f"{root}/mole/inside.png")
        assert _run(capsys, "write", root, str(tmp_path / "t-%d.tar"))[0] == 0
        keys = set(_read(str(tmp_path / "t-*.tar")))
        assert keys == {*KEYS, "mole/inside"}

    @pytest.mark.parametrize(
        ("args", "status", "message"),
        [
            (["{root}/nope", "{out}"], 1, "nope: no such folder"),
            (["{root}/mole/only.png", "{out}"], 1, "no such folder"),
            (["{empty}", "{out}"], 1, "no images in class sub-folders"),
            (["{root}", "{tmp}/x.tar"], 2, "pattern must hold exactly one integer field"),
            (["{root}", "{out}", "--shard-size", "12QB"], 2, "size must look like 256MB"),
            (["{root}", "{out}", "--samples-per-shard", "0"], 2, "must be a positive integer"),
            (
                ["{root}", "{out}", "--shard-size", "1k", "--samples-per-shard", "2"],
                2,
                "not allowed with",
            ),
            (["{root}", "{out}", "-o", "novalue"], 2, "storage option must look like key=value"),
        ],
    )
    def test_errors(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
        args: list[str],
        status: int,
        message: str,
    ) -> None:
        """Bad input gives one error line and status 1 (data) or 2 (usage)."""
        (tmp_path / "empty" / "cls").mkdir(parents=True)
        paths = {
            "root": source[0],
            "out": str(tmp_path / "o-%d.tar"),
            "tmp": str(tmp_path),
            "empty": str(tmp_path / "empty"),
        }
        got, out, err = _run(capsys, "write", *(a.format(**paths) for a in args))
        assert got == status
        assert out == ""
        assert len(err.splitlines()) == 1
        assert err.startswith("shardpipes: error: ")
        assert message in err


class TestIndex:
    def test_writes_sidecars(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """Each matched shard gets a ``URL.idx`` that reads back with one range per sample."""
        pattern = _shards(tmp_path, n=10, per_shard=4)
        status, out, _ = _run(capsys, "index", pattern)
        assert status == 0
        counts = [4, 4, 2]
        urls = [str(tmp_path / f"d-{i:03d}.tar") for i in range(3)]
        assert out.splitlines() == [
            f"{u}.idx\t{n} samples" for u, n in zip(urls, counts, strict=True)
        ]
        for url, n in zip(urls, counts, strict=True):
            ranges = read_index(url)
            assert ranges is not None
            assert len(ranges) == n

    def test_brace_patterns_and_reindexing(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """Brace patterns expand; a glob that also matches ``.idx`` files skips them."""
        _shards(tmp_path)
        status, out, _ = _run(capsys, "index", str(tmp_path / "d-{000..001}.tar"))
        assert (status, len(out.splitlines())) == (0, 2)
        status, out, _ = _run(capsys, "index", str(tmp_path / "d-*"))
        assert (status, len(out.splitlines())) == (0, 3)


class TestInspect:
    def test_numbers(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """Shards, samples and per-extension counts, totals and means are printed."""
        pattern = _shards(tmp_path, n=10, per_shard=4)
        status, out, _ = _run(capsys, "inspect", pattern)
        assert status == 0
        lines = out.splitlines()
        assert lines[:2] == ["shards: 3", "samples: 10"]
        rows = {line.split()[0]: line.split()[1:] for line in lines[3:]}
        jpg_total = sum(100 + i for i in range(10))
        assert rows == {
            "cls": ["10", "10", "1.0"],
            "jpg": ["10", str(jpg_total), f"{jpg_total / 10:.1f}"],
        }


class TestErrors:
    @pytest.mark.parametrize(
        ("argv", "status", "message"),
        [
            (["inspect", "{tmp}/missing.tar"], 1, "missing.tar: no such file"),
            (["inspect", "{tmp}/none-*.tar"], 1, "no shard matches the pattern"),
            (["inspect", "{tmp}/corrupt.tar"], 1, "corrupt.tar: "),
            (["index", "{tmp}/corrupt.tar"], 1, "corrupt.tar: "),
            (["inspect", "{tmp}/x-{1..2.tar"], 1, "{tmp}/x-"),
            (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
            ([], 2, "the following arguments are required: COMMAND"),
            (["demo", "--workers", "-1"], 2, "must be a non-negative integer"),
            # a backend's own error: its type, and not the pipe's options (credentials)
            (
                ["inspect", "s3://bucket-sp/x.tar", "-o", "secret=xyz", "-o", "bogus=1"],
                1,
                "TypeError: AioSession.__init__() got an unexpected keyword argument 'bogus'",
            ),
        ],
    )
    def test_one_line_no_traceback(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        argv: list[str],
        status: int,
        message: str,
    ) -> None:
        """Bad input prints exactly one error line to stderr and exits non-zero."""
        (tmp_path / "corrupt.tar").write_bytes(b"this is not a tar file" * 40)
        got, out, err = _run(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
        assert (got, out) == (status, "")
        assert len(err.splitlines()) == 1
        assert err.startswith("shardpipes: error: ")
        assert message.replace("{tmp}", str(tmp_path)) in err
        assert "Traceback" not in err and "xyz" not in err

    def test_debug_shows_traceback(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """With ``--debug`` the traceback comes first, then the same error line."""
        status, _, err = _run(capsys, "--debug", "inspect", str(tmp_path / "missing.tar"))
        assert status == 1
        assert err.startswith("Traceback (most recent call last):")
        assert "ShardNotFoundError" in err
        assert err.splitlines()[-1].startswith("shardpipes: error: ")


class TestRecipes:
    def test_lists_every_recipe(self, capsys: pytest.CaptureFixture[str]) -> None:
        """One line per recipe: its name, then its summary."""
        status, out, _ = _run(capsys, "recipes")
        assert status == 0
        lines = out.splitlines()
        assert [line.split()[0] for line in lines] == available()
        assert all(len(line.split()) > 2 for line in lines)


def _script() -> str:
    found = shutil.which("shardpipes") or str(Path(sys.executable).parent / "shardpipes")
    assert Path(found).exists(), "the shardpipes console script is not installed (make venv)"
    return found


@pytest.mark.slow
class TestConsoleScript:
    def test_recipes(self) -> None:
        """The installed script lists the recipes."""
        result = subprocess.run(
            [_script(), "recipes"], capture_output=True, text=True, check=False, timeout=120
        )
        assert result.returncode == 0
        assert [line.split()[0] for line in result.stdout.splitlines()] == available()

    def test_error_exit(self, tmp_path: Path) -> None:
        """A missing shard exits 1 with one line on stderr and no traceback."""
        missing = str(tmp_path / "missing.tar")
        result = subprocess.run(
            [_script(), "inspect", missing],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr.splitlines() == [f"shardpipes: error: {missing}: no such file"]


@pytest.mark.slow
class TestDemo:
    def test_exactly_once_and_reuse(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """The demo writes its dataset, reads it with 2 workers exactly once, then reuses it."""
        status, out, _ = _run(capsys, "demo", "--samples", "64", "--cache", str(tmp_path))
        assert status == 0
        assert out.startswith("wrote 64 images in 8 shards")
        assert "samples/s" in out
        assert out.splitlines()[-1] == "exactly once: yes"
        status, out, _ = _run(
            capsys, "demo", "--samples", "64", "--cache", str(tmp_path), "--workers", "0"
        )
        assert status == 0
        assert out.startswith("reused 64 images")
        assert out.splitlines()[-1] == "exactly once: yes"

    def test_mismatch_exits_1(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """When what is read differs from the dataset, it says so and exits 1."""
        assert (
            _run(capsys, "demo", "--samples", "20", "--shards", "3", "--cache", str(tmp_path))[0]
            == 0
        )
        manifest_path = tmp_path / "20-3" / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["classes"]["0"] += 1
        manifest_path.write_text(json.dumps(manifest))
        status, out, _ = _run(
            capsys, "demo", "--samples", "20", "--shards", "3", "--cache", str(tmp_path)
        )
        assert status == 1
        assert out.splitlines()[-1] == "exactly once: no"

    def test_incomplete_cache_is_rewritten(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A truncated shard makes the cached copy incomplete, so it is written again."""
        args = ["demo", "--samples", "16", "--shards", "2", "--cache", str(tmp_path)]
        assert _run(capsys, *args, "--workers", "0")[0] == 0
        shard = tmp_path / "16-2" / "train-000000.tar"
        shard.write_bytes(shard.read_bytes()[:1000])
        status, out, _ = _run(capsys, *args, "--workers", "0")
        assert (status, out.split()[0]) == (0, "wrote")


def test_python_dash_m_runs_the_command(tmp_path: Path) -> None:
    """``python -m shardpipes`` is the ``shardpipes`` command (its exit status too)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "shardpipes", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: shardpipes")
    missing = subprocess.run(
        [sys.executable, "-m", "shardpipes", "inspect", str(tmp_path / "none-*.tar")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode != 0
    assert missing.stderr.startswith("shardpipes: error:")


class TestWriteTrainsWell:
    """``--shuffle``, a class list kept with the shards, ``--overwrite`` (issue 15 §2)."""

    def test_shuffle_mixes_classes_across_shards(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
    ) -> None:
        root, _ = source
        outs = []
        for name in ("a", "b", "plain"):
            flags = ["--shuffle", "--seed", "3"] if name != "plain" else []
            status, _, _ = _run(capsys, "write", root, str(tmp_path / f"{name}/t-%02d.tar"),
                                "--samples-per-shard", "3", *flags)  # fmt: skip
            assert status == 0
            outs.append(sorted((tmp_path / name).glob("t-*.tar")))
        same = [p.read_bytes() for p in outs[0]] == [p.read_bytes() for p in outs[1]]
        assert same  # the seed decides
        back = _read(str(tmp_path / "a/t-*.tar"))
        assert set(back) == set(KEYS)  # every image once
        order = [s["__key__"] for s in TarOpener(ShardLister(str(tmp_path / "a/t-*.tar")))]
        plain = [s["__key__"] for s in TarOpener(ShardLister(str(tmp_path / "plain/t-*.tar")))]
        assert order != plain
        assert plain == sorted(plain, key=lambda k: KEYS[k][1])  # without: in class order

    def test_labels_follow_the_class_list(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
    ) -> None:
        """train/ has ant, mole, zebra; val/ only mole and zebra: its labels are train's."""
        root, _ = source
        status, out, _ = _run(capsys, "write", root, str(tmp_path / "out/train-%03d.tar"))
        assert status == 0
        listing = tmp_path / "out/train-classes.json"
        assert json.loads(listing.read_text()) == {"classes": ["ant", "mole", "zebra"]}
        assert f"classes: {listing} (3 classes)" in out
        val = tmp_path / "val"
        shutil.copytree(Path(root) / "mole", val / "mole")
        shutil.copytree(Path(root) / "zebra", val / "zebra")
        status, _, _ = _run(capsys, "write", str(val), str(tmp_path / "out/val-%03d.tar"),
                            "--classes", str(listing))  # fmt: skip
        assert status == 0
        for key, sample in _read(str(tmp_path / "out/val-*.tar")).items():
            assert int(sample["cls"]) == KEYS[key][1]  # mole 1 and zebra 2, as in train
            assert sample["class.txt"].decode() == key.split("/")[0]
        alone = _run(capsys, "write", str(val), str(tmp_path / "alone/v-%03d.tar"))
        assert alone[0] == 0
        assert {int(s["cls"]) for s in _read(str(tmp_path / "alone/v-*.tar")).values()} == {0, 1}
        names = tmp_path / "names.txt"
        names.write_text("zebra\nmole\n")
        status, _, err = _run(capsys, "write", root, str(tmp_path / "x/t-%03d.tar"),
                              "--classes", str(names))  # fmt: skip
        assert status == 1
        assert re.search(r"class folder\(s\) 'ant' not in the class list \(2 classes\)", err)
        assert not (tmp_path / "x").exists()  # nothing written

    def test_existing_shards_are_refused_unless_overwritten(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        source: tuple[str, dict[str, bytes]],
    ) -> None:
        root, _ = source
        pattern = str(tmp_path / "t-%02d.tar")
        assert _run(capsys, "write", root, pattern, "--samples-per-shard", "2")[0] == 0
        assert _run(capsys, "index", str(tmp_path / "t-*.tar"))[0] == 0
        before = sorted(p.name for p in tmp_path.glob("t-*.tar*"))
        status, _, err = _run(capsys, "write", root, pattern, "--samples-per-shard", "5")
        assert status == 1
        assert "4 shards already match the pattern" in err and "--overwrite" in err
        assert sorted(p.name for p in tmp_path.glob("t-*.tar*")) == before  # untouched
        status, _, _ = _run(capsys, "write", root, pattern, "--samples-per-shard", "5",
                              "--overwrite")  # fmt: skip
        assert status == 0
        assert sorted(p.name for p in tmp_path.glob("t-*.tar*")) == [
            "t-00.tar",
            "t-00.tar.idx",
            "t-01.tar",
            "t-01.tar.idx",
        ]  # the old sidecars gone, new ones written
        for url in (str(tmp_path / "t-00.tar"), str(tmp_path / "t-01.tar")):
            assert read_index(url) == sp.build_index(url)  # fresh, not stale
        assert len(_read(str(tmp_path / "t-*.tar"))) == len(KEYS)  # not 2 × as many


def test_index_and_inspect_show_progress_when_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pattern = _shards(tmp_path)
    for command in ("index", "inspect"):
        status, _, err = _run(capsys, command, pattern, "--progress")
        assert status == 0
        assert f"\r{command}: " in err and "/3 " in err  # the bar, on stderr
        status, _, err = _run(capsys, command, pattern)
        assert (status, err) == (0, "")  # not a terminal: no bar


class TestLabelsCannotShift:
    """Every way a split's labels could come out shifted from another's (issue 24 §1)."""

    @staticmethod
    def _split(root: str, dest: Path, classes: list[str]) -> str:
        for name in classes:
            shutil.copytree(Path(root) / name, dest / name)
        return str(dest)

    def test_a_split_missing_a_class_takes_the_list_beside_its_shards(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, source: tuple[str, Any]
    ) -> None:
        """val/ lacks ant: written beside train's shards, mole is 1 and zebra 2, as in train."""
        root, _ = source
        assert _run(capsys, "write", root, str(tmp_path / "out/train-%03d.tar"))[0] == 0
        val = self._split(root, tmp_path / "val", ["mole", "zebra"])
        status, out, _ = _run(capsys, "write", val, str(tmp_path / "out/val-%03d.tar"))
        assert status == 0
        assert f"the labels of {tmp_path / 'out/train-classes.json'}" in out
        back = _read(str(tmp_path / "out/val-*.tar"))
        assert {key: int(s["cls"]) for key, s in back.items()} == {
            key: label for key, (_, label) in KEYS.items() if key.split("/")[0] != "ant"
        }
        listing = json.loads((tmp_path / "out/val-classes.json").read_text())
        assert listing == {"classes": ["ant", "mole", "zebra"]}  # train's, whole

    def test_written_first_then_the_bigger_split_is_refused(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, source: tuple[str, Any]
    ) -> None:
        """val/ written first (2 classes), then train/ with a third beside it: refused."""
        root, _ = source
        val = self._split(root, tmp_path / "val", ["mole", "zebra"])
        assert _run(capsys, "write", val, str(tmp_path / "out/val-%03d.tar"))[0] == 0
        status, _, err = _run(capsys, "write", root, str(tmp_path / "out/train-%03d.tar"))
        assert status == 1
        assert "class folder(s) 'ant' not in the class list" in err
        assert "val-classes.json" in err and "--new-classes" in err and "--classes" in err
        assert not list((tmp_path / "out").glob("train-*.tar"))  # nothing written
        status, _, _ = _run(capsys, "write", root, str(tmp_path / "out/train-%03d.tar"),
                            "--new-classes")  # fmt: skip
        assert status == 0  # its own folders, when asked
        labels = {int(s["cls"]) for s in _read(str(tmp_path / "out/train-*.tar")).values()}
        assert labels == {0, 1, 2}

    def test_class_lists_that_disagree_are_refused(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, source: tuple[str, Any]
    ) -> None:
        root, _ = source
        (tmp_path / "out").mkdir()
        (tmp_path / "out/a-classes.json").write_text('{"classes": ["ant", "mole", "zebra"]}')
        (tmp_path / "out/b-classes.json").write_text('{"classes": ["zebra", "mole", "ant"]}')
        status, _, err = _run(capsys, "write", root, str(tmp_path / "out/c-%03d.tar"))
        assert status == 1
        assert "the class lists beside" in err and "differ" in err

    def test_hidden_folders_are_not_classes(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, source: tuple[str, Any]
    ) -> None:
        """A .ipynb_checkpoints folder (with an image in it) would be class 0 and shift all."""
        root, _ = source
        _write(f"{root}/.ipynb_checkpoints/x.png", _image(1, "png"))
        _write(f"{root}/ant/._mac.jpg", b"AppleDouble, not an image")
        status, out, _ = _run(capsys, "write", root, str(tmp_path / "out/t-%03d.tar"))
        assert status == 0
        back = _read(str(tmp_path / "out/t-*.tar"))
        assert {key: int(s["cls"]) for key, s in back.items()} == {
            key: label for key, (_, label) in KEYS.items()
        }
        assert "(3 classes)" in out


class TestWriteChecksImages:
    """``shardpipes write`` decodes every image first (issue 24 §4)."""

    BAD = {"ant/cut.jpg": "truncated", "mole/text.jpg": "text", "zebra/empty.png": "empty"}

    @pytest.fixture
    def broken(self, source: tuple[str, Any]) -> str:
        root, _ = source
        whole = _image(5, "jpg")
        _write(f"{root}/ant/cut.jpg", whole[: len(whole) // 2])
        _write(f"{root}/mole/text.jpg", b"this is a text file, named .jpg")
        _write(f"{root}/zebra/empty.png", b"")
        return root

    def test_refused_by_default_naming_the_file(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, broken: str
    ) -> None:
        status, _, err = _run(capsys, "write", broken, str(tmp_path / "out/t-%03d.tar"))
        assert status == 1
        assert re.search(r"(cut|text|empty)\.(jpg|png)", err) and "--handler warn" in err
        assert not list(tmp_path.glob("out/t-*.tar"))  # the shard being written is removed

    @pytest.mark.parametrize("handler", ["warn", "ignore"])
    def test_skipped_when_asked(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, broken: str, handler: str
    ) -> None:
        status, out, err = _run(capsys, "write", broken, str(tmp_path / "out/t-%03d.tar"),
                                "--handler", handler)  # fmt: skip
        assert status == 0
        assert set(_read(str(tmp_path / "out/t-*.tar"))) == set(KEYS)  # the good ones only
        assert "skipped 3 images that do not decode" in out
        warned = {name for name in self.BAD if name.split("/")[1] in err}
        assert warned == (set(self.BAD) if handler == "warn" else set())
        assert "<_io.BytesIO" not in err

    def test_no_check_copies_them(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, broken: str
    ) -> None:
        status, _, _ = _run(capsys, "write", broken, str(tmp_path / "out/t-%03d.tar"),
                            "--no-check", "--no-index")  # fmt: skip
        assert status == 0
        assert len(_read(str(tmp_path / "out/t-*.tar"))) == len(KEYS) + 3
        assert not list(tmp_path.glob("out/*.idx"))
