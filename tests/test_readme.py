"""Every ```python block of README.md runs, as written, on realistic shards.

Each block is parsed out of README.md when the tests are collected and run as its own case
(id: the line of its first statement and its section), in a fresh namespace, after these
rewrites of its syntax tree (nothing else is changed):

- shard paths: ``data/…`` and ``out/…`` become the shards of `tests.realdata` in a tmp
  folder, ``new/…`` (shards a block writes) a folder of its own under tmp_path; ``s3://``, ``gs://``, ``az://`` and ``https://`` ones the same shards uploaded to
  the loopback servers of ``tests/cloud`` (``https`` becomes ``http``). A brace range is
  rewritten to the real shard count unless it lies within it (two sources of a mix take
  disjoint ranges of the real shards), a glob is kept. ``storage_options=`` on a call whose
  URL is rewritten gets that server's options. Any other ``.tar`` or absolute path fails.
- ``num_workers=N`` becomes ``min(N, 2)`` (2 cores).
- ``for … in loader:`` records what the loop saw; ``pipe = …`` records each pipe built.

A block that imports ``shardpipes`` is a self-contained example: it must import what it
uses. Any other block continues the page and starts with the first block's imports. Names a
block uses without defining them come from `GIVEN`; none else (a ``NameError`` fails).

Then real data must have gone through: every pass of a ``for … in loader`` loop (cut into
passes over the shards where the block has ``cycle_epochs``), else one
iteration of the block's ``loader``, else one of each pipe it built, must yield each
sample exactly once (by label: see `tests.realdata`). A block that crashes fails.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cloud import conftest as cloud
from tests.realdata import RealShards, build_shards

README = Path(__file__).resolve().parents[1] / "README.md"
MAX_WORKERS = 2

# what a block uses but leaves to the reader; short, and only what some block needs
GIVEN: dict[str, Any] = {
    "epochs": 2,  # "for epoch in range(epochs)": two, so set_epoch gets a new order
    "checkpoint": {},  # the resume block stores the loader state in it
}

# the folder of shards a block writes (under tmp_path), e.g. "new/train-%06d.tar"
WRITTEN = "new"

# absolute paths in blocks, and the folder under tmp_path each one becomes
LOCAL_PATHS = {"/mnt/nvme/shards": "cache"}

# a shard path as the README writes one: scheme://host/…/train-NAMES.tar or data/…, out/…
SHARD_PATH = re.compile(
    r"^(?:(?P<scheme>s3|gs|az|https?)://[^/]+/(?:[^/]+/)*|(?:data|out)/)train-(?P<names>[^/]+)\.tar$"
)
BRACE_RANGE = re.compile(r"^\{\d+\.\.\d+\}$")

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
    """One ```python block of the README."""

    line: int  # README line of the block's first line of code
    section: str
    code: str

    @property
    def id(self) -> str:
        """``L23-chain-pipes-in-code``."""
        return f"L{self.line}-" + "-".join(re.findall(r"[a-z0-9]+", self.section.lower()))

    @property
    def tree(self) -> ast.Module:
        """The parsed code, its line numbers those of the README."""
        return ast.increment_lineno(ast.parse(self.code, str(README)), self.line - 1)

    @property
    def schemes(self) -> set[str]:
        """The remote schemes of the shard paths in the block."""
        paths = (SHARD_PATH.match(s) for s in string_constants(self.tree))
        return {m["scheme"] for m in paths if m and m["scheme"]}

    @property
    def imports_shardpipes(self) -> bool:
        """Whether the block imports shardpipes itself (a self-contained example)."""
        for node in ast.walk(self.tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(name.split(".")[0] == "shardpipes" for name in names):
                return True
        return False


def string_constants(tree: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def readme_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, with their line and ``##`` section."""
    blocks: list[Block] = []
    code: list[str] = []
    section, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if start:
            if line.strip() == "```":
                blocks.append(Block(start, section, "\n".join(code) + "\n"))
                start, code = 0, []
            else:
                code.append(line)
        elif line.startswith("## "):
            section = line[3:]
        elif line.strip() == "```python":
            start = number + 1
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


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
        return node


def hook(name: str, value: ast.expr) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), [value], [])


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


def run_page_imports(namespace: dict[str, Any]) -> None:
    """Run the first block's imports in ``namespace`` (what a reader of the page has)."""
    imports = [n for n in BLOCKS[0].tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(imports, []), str(README), "exec"), namespace)


def labels_of(item: Any) -> list[int]:
    """The labels in a sample or batch: its last field (or ``cls``), an int or a tensor."""
    label = item["cls"] if isinstance(item, dict) else item[-1]
    if isinstance(label, torch.Tensor):
        return [int(x) for x in label.flatten()]
    return [int(label)]


def assert_epoch(items: list[Any], shards: RealShards, what: str) -> None:
    """``items`` hold every sample of the shards exactly once."""
    assert items, f"{what} yielded nothing"
    got, want = Counter(x for item in items for x in labels_of(item)), Counter(shards.labels)
    missing, extra = sorted(want - got), sorted(got - want)
    assert not missing and not extra, f"{what}: missing labels {missing}, extra {extra}"


def epochs_of(
    loops: list[list[Any]], shards: RealShards, *, passes: bool = False
) -> list[list[Any]]:
    """The loops' items cut into epochs (a loop left early and the one resuming it are one).

    With ``passes`` (a block with ``cycle_epochs``), a loop is cut too, after each item that
    completes a pass over the shards.
    """
    epochs, current = [], []
    for items in loops:
        for item in items if passes else [items]:
            current += [item] if passes else item
            if sum(len(labels_of(x)) for x in current) >= len(shards.labels):
                epochs.append(current)
                current = []
    return [*epochs, current] if current else epochs


@pytest.fixture(scope="module")
def real_shards(tmp_path_factory: pytest.TempPathFactory) -> RealShards:
    """4 shards × 12 realistic samples (JPEG RGB/L/CMYK, PNG RGBA, 40–300 px)."""
    return build_shards(tmp_path_factory.mktemp("readme") / "data")


@pytest.mark.parametrize("block", [case(b) for b in BLOCKS])
def test_readme_block(
    block: Block, real_shards: RealShards, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The block runs as written, and each epoch it reads holds every sample once."""
    with contextlib.ExitStack() as stack:
        bases, options = {"local": str(real_shards.folder)}, {}
        for scheme in sorted(block.schemes):
            bases[scheme], options[scheme] = stack.enter_context(
                served(request, scheme, real_shards)
            )
        rewriter = Rewriter(bases, len(real_shards.paths), tmp_path)
        tree = ast.fix_missing_locations(rewriter.visit(block.tree))
        assert not rewriter.unknown, f"paths the harness cannot map: {rewriter.unknown}"
        recorder = Recorder()
        namespace = {**copy.deepcopy(GIVEN), "_readme_options": options}
        namespace |= {"_readme_pipe": recorder.pipe, "_readme_seen": recorder.seen}
        if not block.imports_shardpipes:
            run_page_imports(namespace)
        exec(compile(tree, str(README), "exec"), namespace)

        if recorder.loops:
            passes = "cycle_epochs(" in block.code
            epochs = epochs_of(recorder.loops, real_shards, passes=passes)
            if passes:
                assert len(epochs) > 1, "a cycling block's loop read no second pass"
            for n, items in enumerate(epochs, start=1):
                assert_epoch(items, real_shards, f"epoch {n} of the block's loops")
        elif "loader" in namespace:
            assert_epoch(list(namespace["loader"]), real_shards, "the block's loader")
        else:
            assert recorder.pipes, "the block builds neither a loader nor a pipe"
            for n, pipe in enumerate(recorder.pipes, start=1):
                assert_epoch(list(pipe), real_shards, f"pipe {n} of the block")
