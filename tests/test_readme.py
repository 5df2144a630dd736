"""Every ```python block of README.md and of docs/*.md runs, as written, on realistic shards.

Each block is parsed out of its page when the tests are collected and run as its own case
(id: the page, the line of its first statement and its section), in a fresh module (so a
function it defines pickles, as a script's does) and a fresh working folder, after these
rewrites of its syntax tree (nothing else is changed):

- shard paths: ``data/…`` and ``out/…`` become the shards of `tests.realdata` in a tmp
  folder, ``new/…`` (shards a block writes) a folder of its own under tmp_path;
  ``s3://``, ``gs://``, ``az://`` and ``https://`` ones the same shards uploaded to the
  loopback servers of ``tests/cloud`` (``https`` becomes ``http``). A brace range is
  rewritten to the real shard count unless it lies within it (two sources of a mix take
  disjoint ranges of the real shards), a glob is kept. ``storage_options=`` on a call whose
  URL is rewritten gets that server's options. Any other ``.tar`` or absolute path fails.
- ``num_workers=N`` becomes ``min(N, 2)`` (2 cores).
- ``for … in loader:`` (or ``in enumerate(loader)``) records what the loop saw; ``pipe = …``
  records each pipe built.

A block after a ```sh block of ``shardpipes write SRC out/…`` in the same section (the
README's quickstart) reads what the command wrote: the test makes an image folder at
``SRC`` (JPEGs of photos' sizes and modes, one sub-folder per class), runs the command,
and points ``out/…`` at its shards instead. A block that calls ``init_process_group`` runs
as a world of one here (what torchrun sets for one process); `test_ddp_block_under_torchrun`
runs it on two ranks.

A block that imports Lightning or accelerate runs as a script in a process of its own
(`test_trainer_block`; an accelerate one under ``accelerate launch`` on 2 processes).

A block that imports ``shardpipes`` is a self-contained example: it must import what it
uses. Any other block continues its page and starts with the imports of the page's first
block. A block defines every name it uses (a ``NameError`` fails).

Then real data must have gone through: every pass of a ``for … in loader`` loop (cut into
passes over the shards where the block has ``cycle_epochs``), else one
iteration of the block's ``loader``, else one of each pipe it built, must yield each
sample exactly once (by label: see `tests.realdata`; after a ``shardpipes write``, each
class as many times as its folder has images). A block that crashes fails.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import random
import re
import shlex
import socket
import subprocess
import sys
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cloud import conftest as cloud
from tests.realdata import RealShards, build_shards, random_size, real_image
from tests.torchrun import accelerate_launch, torchrun

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_WORKERS = 2

# the folder of shards a block writes (under tmp_path), e.g. "new/train-%06d.tar"
WRITTEN = "new"

# absolute paths in blocks, and the folder under tmp_path each one becomes
LOCAL_PATHS = {"/mnt/nvme/shards": "cache"}

# a shard path as the pages write one: scheme://host/…/train-NAMES.tar or data/…, out/…
SHARD_PATH = re.compile(
    r"^(?:(?P<scheme>s3|gs|az|https?)://[^/]+/(?:[^/]+/)*|(?:data|out)/)train-(?P<names>[^/]+)\.tar$"
)
# blocks that train under these run in a process of their own (test_trainer_block): in
# this one, Lightning or accelerate once imported would change what later tests see
TRAINERS = ("lightning", "accelerate")
BRACE_RANGE = re.compile(r"^\{\d+\.\.\d+\}$")
HEADING = re.compile(r"^#{1,3} (.+)$")

# the image folder made for a `shardpipes write` block: class → number of images
FOLDER_CLASSES = {"cat": 9, "dog": 14, "fox": 6, "owl": 11}
JPEGS = (("RGB", ".jpg"), ("L", ".jpeg"), ("CMYK", ".JPEG"))  # (mode, file extension)

# the session fixtures of tests/cloud/conftest.py, here for this module (started on demand)
aws_test_env = cloud.aws_test_env
s3_server = cloud.s3_server
http_server = cloud.http_server
gcs_server = cloud.gcs_server
azure_server = cloud.azure_server
SERVERS = {"s3": "s3_server", "gs": "gcs_server", "az": "azure_server"}
SERVERS |= dict.fromkeys(("http", "https"), "http_server")


@dataclass(frozen=True)
class Block:
    """One ```python block of a page, and the ``shardpipes write`` commands before it."""

    page: str  # the page's path in the repository: "README.md", "docs/resume.md"
    line: int  # page line of the block's first line of code
    section: str
    code: str
    commands: tuple[tuple[str, ...], ...] = ()  # argv of each `shardpipes write` before it

    @property
    def id(self) -> str:
        """``docs/pipes.md:L12-chain-pipes``."""
        slug = "-".join(re.findall(r"[a-z0-9]+", self.section.lower()))
        return f"{self.page}:L{self.line}-{slug}"

    @property
    def tree(self) -> ast.Module:
        """The parsed code, its line numbers those of the page."""
        return ast.increment_lineno(ast.parse(self.code, str(ROOT / self.page)), self.line - 1)

    @property
    def schemes(self) -> set[str]:
        """The remote schemes of the shard paths in the block."""
        paths = (SHARD_PATH.match(s) for s in string_constants(self.tree))
        return {m["scheme"] for m in paths if m and m["scheme"]}

    @property
    def packages(self) -> set[str]:
        """The top-level packages the block imports."""
        names: list[str] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names.append(node.module or "")
        return {name.split(".")[0] for name in names}

    @property
    def trainer(self) -> str | None:
        """The trainer the block runs under (``lightning``, ``accelerate``), if any."""
        return next((name for name in TRAINERS if name in self.packages), None)

    @property
    def imports_shardpipes(self) -> bool:
        """Whether the block imports shardpipes itself (a self-contained example)."""
        return "shardpipes" in self.packages


def string_constants(tree: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def write_commands(lines: list[str]) -> list[tuple[str, ...]]:
    """The ``shardpipes write …`` command lines of a ```sh block, split as the shell does."""
    argvs = (shlex.split(line, comments=True) for line in lines)
    return [tuple(argv) for argv in argvs if argv[:2] == ["shardpipes", "write"]]


def page_blocks(page: str, text: str) -> list[Block]:
    """The ```python blocks of a Markdown page, with their line and section heading.

    A ```sh block's ``shardpipes write`` commands go with the next python block of its
    section.
    """
    blocks: list[Block] = []
    code: list[str] = []
    commands: list[tuple[str, ...]] = []
    section, start, fence = "", 0, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if fence and line.strip() != "```":
            code.append(line)
        elif fence:
            if fence == "python":
                blocks.append(Block(page, start, section, "\n".join(code) + "\n", tuple(commands)))
                commands = []
            else:
                commands += write_commands(code)
            fence, code = "", []
        elif heading := HEADING.match(line):
            section, commands = heading[1], []
        elif line.strip() in ("```python", "```sh"):
            fence, start = line.strip()[3:], number + 1
    return blocks


def pages() -> list[Block]:
    """The python blocks of README.md and of every docs page."""
    blocks = []
    for path in PAGES:
        blocks += page_blocks(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
    return blocks


BLOCKS = pages()


def case(block: Block) -> Any:
    """A parametrize case; ``slow`` when the block starts DataLoader workers."""
    workers = re.search(r"num_workers\s*=\s*[1-9]", block.code) is not None
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if workers else [])


@dataclass
class Recorder:
    """What a block did: the pipes it assigned and each pass of its loops over ``loader``."""

    pipes: list[Any] = field(default_factory=list)
    loops: list[list[Any]] = field(default_factory=list)

    def pipe(self, value: Any) -> Any:
        self.pipes.append(value)
        return value

    def seen(self, loader: Any) -> Iterator[Any]:
        items: list[Any] = []
        self.loops.append(items)
        for item in loader:
            items.append(item)
            yield item


@dataclass
class Rewriter(ast.NodeTransformer):
    """Rewrites a block's paths, options, worker counts; hooks its pipes and loops."""

    bases: dict[str, str]  # "local" or a scheme → the folder or bucket URL the shards are in
    shard_count: int
    tmp_path: Path
    unknown: list[str] = field(default_factory=list)

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, str):
            return ast.copy_location(ast.Constant(self.path(node.value)), node)
        return node

    def path(self, text: str) -> str:
        if text in LOCAL_PATHS:
            return str(self.tmp_path / LOCAL_PATHS[text])
        if text.startswith(f"{WRITTEN}/"):  # shards a block writes, then reads
            return str(self.tmp_path / text)
        match = SHARD_PATH.match(text)
        if match is None:
            if text.startswith("/") or re.search(r"\.tar\b", text):
                self.unknown.append(text)
            return text
        names = match["names"]
        if BRACE_RANGE.match(names):
            if int(names[1:-1].split("..")[1]) >= self.shard_count:  # within it, it stays
                names = f"{{000000..{self.shard_count - 1:06d}}}"
        elif names != "*":
            self.unknown.append(text)
        return f"{self.bases[match['scheme'] or 'local']}/train-{names}.tar"

    def visit_Call(self, node: ast.Call) -> ast.Call:
        first = node.args[0] if node.args else None
        url = first.value if isinstance(first, ast.Constant) else None
        match = SHARD_PATH.match(url) if isinstance(url, str) else None
        self.generic_visit(node)
        for keyword in node.keywords:
            if keyword.arg == "storage_options" and match and match["scheme"]:
                options = ast.Name("_readme_options", ast.Load())
                keyword.value = ast.Subscript(options, ast.Constant(match["scheme"]), ast.Load())
            value = keyword.value
            if keyword.arg == "num_workers" and isinstance(value, ast.Constant):
                keyword.value = ast.Constant(min(value.value, MAX_WORKERS))
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        self.generic_visit(node)
        if [ast.unparse(t) for t in node.targets] == ["pipe"]:
            node.value = hook("_readme_pipe", node.value)
        return node

    def visit_For(self, node: ast.For) -> ast.For:
        self.generic_visit(node)
        if isinstance(node.iter, ast.Name) and node.iter.id == "loader":
            node.iter = hook("_readme_seen", node.iter)
        elif is_enumerate_loader(node.iter):  # enumerate(loader, ...)
            node.iter.args[0] = hook("_readme_seen", node.iter.args[0])
        return node


def is_enumerate_loader(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "enumerate"
        and bool(node.args)
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "loader"
    )


def hook(name: str, value: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), [value], [])


def rewritten(block: Block, rewriter: Rewriter) -> ast.Module:
    """The block's tree after `Rewriter`; fails on a path the harness cannot map."""
    tree = ast.fix_missing_locations(rewriter.visit(block.tree))
    assert not rewriter.unknown, f"paths the harness cannot map: {rewriter.unknown}"
    return tree


@contextlib.contextmanager
def served(request: pytest.FixtureRequest, scheme: str, shards: RealShards) -> Iterator[Any]:
    """The shards on the loopback server for ``scheme``: (base URL, storage_options)."""
    server = request.getfixturevalue(SERVERS[scheme])
    if SERVERS[scheme] == "http_server":
        folder = server.new_folder("readme")
        server.add({f"{folder}/{path.name}": path for path in shards.paths})
        yield server.url(folder), None
        return
    with server.bucket_with(shards.paths) as bucket:
        yield f"{scheme}://{bucket}", server.storage_options


def run_page_imports(block: Block, namespace: dict[str, Any]) -> None:
    """Run the imports of the first block of ``block``'s page (what its reader has)."""
    first = next(b for b in BLOCKS if b.page == block.page)
    imports = [n for n in first.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(imports, []), str(ROOT / block.page), "exec"), namespace)


def labels_of(item: Any) -> list[int]:
    """The labels in a sample or batch: its last field (or ``cls``), an int or a tensor."""
    label = item["cls"] if isinstance(item, dict) else item[-1]
    if isinstance(label, torch.Tensor):
        return [int(x) for x in label.flatten()]
    return [int(label)]


def assert_epoch(labels: list[int], want: Counter[int], what: str) -> None:
    """``labels`` are ``want``'s: every sample of the shards exactly once."""
    assert labels, f"{what} yielded nothing"
    got = Counter(labels)
    missing, extra = sorted((want - got).elements()), sorted((got - want).elements())
    assert not missing and not extra, f"{what}: missing labels {missing}, extra {extra}"


def epochs_of(loops: list[list[Any]], total: int, *, passes: bool = False) -> list[list[int]]:
    """The labels of the loops' items cut into epochs of ``total`` samples.

    A loop left early and the one resuming it are one epoch. With ``passes`` (a block with
    ``cycle_epochs``), a loop is cut too, after each item that completes a pass.
    """
    epochs: list[list[int]] = []
    current: list[int] = []
    for items in loops:
        labels = [labels_of(x) for x in items]
        for chunk in labels if passes else [[x for item in labels for x in item]]:
            current += chunk
            if len(current) >= total:
                epochs.append(current)
                current = []
    return [*epochs, current] if current else epochs


def make_image_folder(root: Path, seed: int = 0) -> Counter[int]:
    """Write `FOLDER_CLASSES` as ``root/<class>/<n>.jpg`` (and ``.jpeg``, ``.JPEG``).

    JPEGs of 40 to 300 px a side, landscape and portrait, in RGB, grayscale and CMYK, at
    qualities 70–95. Returns how many images each label has (classes sorted by name).
    """
    rng = random.Random(seed)
    index = 0
    for name, count in FOLDER_CLASSES.items():
        (root / name).mkdir(parents=True)
        for _ in range(count):
            mode, suffix = JPEGS[index % len(JPEGS)]
            image = real_image(rng, mode, random_size(rng, index))
            image.save(root / name / f"{index:04d}{suffix}", "JPEG", quality=rng.randint(70, 95))
            index += 1
    return Counter(
        {label: FOLDER_CLASSES[name] for label, name in enumerate(sorted(FOLDER_CLASSES))}
    )


def run_write(argv: tuple[str, ...], cwd: Path) -> Counter[int]:
    """Make the image folder ``argv`` reads, run ``shardpipes write``; the labels' counts."""
    assert argv[3].startswith("out/"), f"{argv}: the block reads out/…, so the command writes it"
    counts = make_image_folder(cwd / argv[2])
    command = [sys.executable, "-m", "shardpipes", *argv[1:]]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{shlex.join(argv)}: {done.stderr[-4000:]}"
    assert sorted((cwd / "out").glob("train-*.tar")), f"{shlex.join(argv)} wrote no shards"
    return counts


def script_namespace(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A fresh module's namespace, importable while the test runs, as a script's is.

    So a function a block defines pickles by reference, as it would in ``__main__``.
    """
    module = types.ModuleType("readme_block")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module.__dict__


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def one_rank_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment torchrun gives a job of one process, on loopback."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def real_shards(tmp_path_factory: pytest.TempPathFactory) -> RealShards:
    """4 shards × 12 realistic samples (JPEG RGB/L/CMYK, PNG RGBA, 40–300 px)."""
    return build_shards(tmp_path_factory.mktemp("readme") / "data")


def test_every_page_is_collected() -> None:
    """Every ```python block of every page is a case; the quickstart writes, then reads."""
    for path in PAGES:
        fences = path.read_text(encoding="utf-8").count("\n```python\n")
        page = str(path.relative_to(ROOT))
        assert len([b for b in BLOCKS if b.page == page]) == fences, page
    assert [b.section for b in BLOCKS if b.commands] == ["Quickstart"]
    assert BLOCKS[0].page == "README.md"
    assert BLOCKS[0].commands


@pytest.mark.parametrize("block", [case(b) for b in BLOCKS if not b.trainer])
def test_readme_block(
    block: Block,
    real_shards: RealShards,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The block runs as written, and each epoch it reads holds every sample once."""
    monkeypatch.chdir(tmp_path)
    want = Counter(real_shards.labels)
    with contextlib.ExitStack() as stack:
        bases, options = {"local": str(real_shards.folder)}, {}
        for argv in block.commands:  # the shards a command writes are what the block reads
            want, bases["local"] = run_write(argv, tmp_path), str(tmp_path / "out")
        for scheme in sorted(block.schemes):
            bases[scheme], options[scheme] = stack.enter_context(
                served(request, scheme, real_shards)
            )
        tree = rewritten(block, Rewriter(bases, len(real_shards.paths), tmp_path))
        recorder = Recorder()
        namespace = script_namespace(monkeypatch)
        namespace |= {"_readme_options": options}
        namespace |= {"_readme_pipe": recorder.pipe, "_readme_seen": recorder.seen}
        if not block.imports_shardpipes:
            run_page_imports(block, namespace)
        if "init_process_group(" in block.code:
            one_rank_world(monkeypatch)
            stack.callback(destroy_process_group)
        exec(compile(tree, str(ROOT / block.page), "exec"), namespace)

        total = want.total()
        if recorder.loops:
            passes = "cycle_epochs(" in block.code
            epochs = epochs_of(recorder.loops, total, passes=passes)
            if passes:
                assert len(epochs) > 1, "a cycling block's loop read no second pass"
            for n, labels in enumerate(epochs, start=1):
                assert_epoch(labels, want, f"epoch {n} of the block's loops")
        elif "loader" in namespace:
            labels = [x for item in namespace["loader"] for x in labels_of(item)]
            assert_epoch(labels, want, "the block's loader")
        else:
            assert recorder.pipes, "the block builds neither a loader nor a pipe"
            for n, pipe in enumerate(recorder.pipes, start=1):
                labels = [x for item in pipe for x in labels_of(item)]
                assert_epoch(labels, want, f"pipe {n} of the block")


def destroy_process_group() -> None:
    """Leave no process group behind a block (one that crashed did not destroy its own)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# what the DDP block runs with under torchrun: the harness's hooks, and a report per rank
RANK_PRELUDE = f"""
import json
import os
from typing import Any

import torch

from tests.torchrun import arm_stack_dump

arm_stack_dump()

{inspect.getsource(labels_of)}

_readme_options = {{}}
_readme_loops = []


def _readme_pipe(value):
    return value


def _readme_seen(loader):
    labels = []
    _readme_loops.append(labels)
    for item in loader:
        labels += labels_of(item)
        yield item

"""
RANK_REPORT = """
with open(os.path.join({out!r}, f"rank{{os.environ.get('RANK', '0')}}.json"), "w") as _f:
    json.dump({{"world_size": os.environ.get("WORLD_SIZE", "1"), "loops": _readme_loops}}, _f)
"""


@pytest.mark.slow
def test_ddp_block_under_torchrun(real_shards: RealShards, tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=2`` on the DDP block: the ranks share out every epoch."""
    (block,) = [b for b in BLOCKS if "init_process_group(" in b.code]
    tree = rewritten(
        block, Rewriter({"local": str(real_shards.folder)}, len(real_shards.paths), tmp_path)
    )
    script = tmp_path / "train.py"
    script.write_text(RANK_PRELUDE + ast.unparse(tree) + RANK_REPORT.format(out=str(tmp_path)))
    done = torchrun(script, ranks=2, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == ["2", "2"]
    epochs = list(zip(*(r["loops"] for r in reports), strict=True))
    assert len(epochs) == 2, "the block runs two epochs"
    for n, ranks in enumerate(epochs, start=1):
        assert all(ranks), f"epoch {n}: a rank read nothing"
        assert len(ranks[0]) == len(ranks[1]), f"epoch {n}: even=True, yet the ranks differ"
        assert_epoch([*ranks[0], *ranks[1]], Counter(real_shards.labels), f"epoch {n}")


@pytest.mark.slow
@pytest.mark.parametrize("block", [case(b) for b in BLOCKS if b.trainer])
def test_trainer_block(block: Block, real_shards: RealShards, tmp_path: Path) -> None:
    """A Lightning block runs as a script; an accelerate one on 2 processes, each sample once.

    The accelerate block stops after its checkpoint and resumes: on each process its two
    loops are one epoch, and the processes share it out.
    """
    tree = rewritten(
        block, Rewriter({"local": str(real_shards.folder)}, len(real_shards.paths), tmp_path)
    )
    script = tmp_path / "train.py"
    script.write_text(RANK_PRELUDE + ast.unparse(tree) + RANK_REPORT.format(out=str(tmp_path)))
    if block.trainer == "accelerate":
        done = accelerate_launch(script, cwd=tmp_path)
    else:
        done = torchrun(script, ranks=None, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = 2 if block.trainer == "accelerate" else 1
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
    assert [r["world_size"] for r in reports] == [str(ranks)] * ranks
    if block.trainer == "lightning":
        assert "Restored all states from the checkpoint" in done.stderr
        return
    saved = sorted(path.name for path in (tmp_path / "checkpoint").glob("loader-*.pt"))
    assert saved == ["loader-0.pt", "loader-1.pt"], "each process saves its own loader state"
    epochs = [[x for loop in r["loops"] for x in loop] for r in reports]
    assert all(len(r["loops"]) == 2 for r in reports), "a loop stopped, then the rest"
    assert len(epochs[0]) == len(epochs[1]), "even=True, yet the processes differ"
    assert_epoch([*epochs[0], *epochs[1]], Counter(real_shards.labels), "the epoch")
