"""Distributed ranks for real: a torchrun job (gloo, CPU) × DataLoader workers, exactly once.

One ``torchrun --nproc_per_node=2`` job runs every case in ``tests/dist_job.py``; each rank
writes the sample ids it saw. Shapes: shards ≫ workers, shards not divisible by the total
workers, one shard. Each sample's label is its unique id.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_tar
from tests.torchrun import torchrun

pytestmark = pytest.mark.slow

WORLD_SIZE, NUM_WORKERS = 2, 2
SHAPES = {"many": [5] * 16, "uneven": [7, 3, 5, 4, 6, 2], "one": [41]}
BATCH = 3


def write_shape(root: Path, counts: list[int]) -> list[str]:
    """Shards whose samples are a tiny ``png`` (not decoded) and a unique ``cls`` id."""
    root.mkdir(parents=True)
    urls, sample = [], 0
    for s, count in enumerate(counts):
        members = []
        for _ in range(count):
            members += [
                (f"k{sample:05d}.png", b"not decoded"),
                (f"k{sample:05d}.cls", b"%d" % sample),
            ]
            sample += 1
        url = str(root / f"train-{s:03d}.tar")
        write_tar(url, members)
        urls.append(url)
    return urls


def cases_for(name: str, urls: list[str]) -> dict[str, dict[str, Any]]:
    common = {"image": "bytes", "batch_size": BATCH}
    shards = {"urls": urls, "buffer_size": 8, **common}
    cases = {
        f"{name}/seeded": {"options": {**shards, "seed": 5}, "epochs": 2},
        f"{name}/loader-seed": {"options": shards},
        f"{name}/even": {"options": {**shards, "seed": 5, "even": True}, "epochs": 2},
        f"{name}/no-loader": {"options": {**shards, "seed": 5}, "num_workers": None},
        f"{name}/no-loader-even": {"options": {**shards, "even": True}, "num_workers": None},
        f"{name}/resumable": {"options": {**shards, "seed": 5}, "resumable": True, "epochs": 2},
    }
    if name == "uneven":  # workers started by spawn have no process group: Resumable tells them
        options = {**shards, "even": True}
        cases[f"{name}/resumable-spawn"] = {
            "options": options,
            "resumable": True,
            "context": "spawn",
        }
    if len(urls) == 1:
        cases[f"{name}/tar_images"] = {
            "recipe": "tar_images",
            "options": {"url": urls[0], **common},
        }
        for recipe in ("tar_images", "indexed_tar"):
            options = {"url": urls[0], "even": True, **common}
            cases[f"{name}/{recipe}-even"] = {"recipe": recipe, "options": options}
    for case in cases.values():
        case.setdefault("recipe", "tar_shards")
        case.setdefault("num_workers", NUM_WORKERS)
    return cases


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the torchrun job once over every shape and case; return (cases, rank reports)."""
    root = tmp_path_factory.mktemp("dist")
    cases: dict[str, Any] = {}
    for name, counts in SHAPES.items():
        cases.update(cases_for(name, write_shape(root / name, counts)))
        for case in cases.values():
            case.setdefault("n", sum(counts))
    (root / "cases.json").write_text(json.dumps(cases))
    out = root / "out"
    out.mkdir()
    script = Path(__file__).with_name("dist_job.py")
    done = torchrun(script, [str(root / "cases.json"), str(out)], ranks=WORLD_SIZE)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    assert [r["world_size"] for r in reports] == [WORLD_SIZE] * WORLD_SIZE
    return cases, reports


def epochs_of(reports: list[dict[str, Any]], name: str) -> list[list[dict[str, Any]]]:
    """Per epoch, each rank's {"keys", "batches"}."""
    return [list(e) for e in zip(*(r["cases"][name] for r in reports), strict=True)]


CASE_NAMES = [name for shape in SHAPES for name in cases_for(shape, ["x"] * len(SHAPES[shape]))]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_ranks_split_the_data_exactly_once(job: tuple[dict[str, Any], Any], name: str) -> None:
    """The ranks' samples are disjoint; their union is the dataset (even: all but n % total)."""
    cases, reports = job
    case = cases[name]
    n, even = case["n"], case["options"].get("even", False)
    total = WORLD_SIZE * (case["num_workers"] or 1)  # no DataLoader: one reader per rank
    for ranks in epochs_of(reports, name):
        seen = Counter(k for rank in ranks for k in rank["keys"])
        assert max(seen.values()) == 1, f"{name}: a sample came twice"
        assert set(seen) <= set(range(n))
        if even:
            assert n - len(seen) == n % total, name
            assert len({len(rank["keys"]) for rank in ranks}) == 1, name
            assert len({rank["batches"] for rank in ranks}) == 1, name
        else:
            assert len(seen) == n, name


def test_epochs_change_the_order_on_every_rank(job: tuple[dict[str, Any], Any]) -> None:
    """set_epoch gives a new shard order, and still exactly once (checked above)."""
    _, reports = job
    first, second = epochs_of(reports, "many/seeded")
    assert all(a["keys"] != b["keys"] for a, b in zip(first, second, strict=True))


def test_even_batches_differ_without_even(job: tuple[dict[str, Any], Any]) -> None:
    """The uneven shape really is uneven: without even=True the ranks' batch counts differ."""
    _, reports = job
    ranks = epochs_of(reports, "uneven/seeded")[0]
    assert len({len(rank["keys"]) for rank in ranks}) > 1
