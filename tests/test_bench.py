"""Tests of ``shardpipes bench`` and the ``shardpipes.cli.bench`` modules behind it."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from shardpipes.cli import main
from shardpipes.cli.bench import STAGES, CollateError, collate_ragged, run_bench
from shardpipes.cli.bench_report import StageResult, costs, slowest
from tests.conftest import Dataset, image_bytes, write_tar

SECRET = "hunter2-do-not-print"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _bench_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, Any]]:
    status, out, err = _run(capsys, "bench", *argv, "--json")
    assert (status, err) == (0, "")
    return {stage["stage"]: stage for stage in json.loads(out)["stages"]}


def _pattern(data: Dataset) -> str:
    return str(Path(data.urls[0]).parent / f"train-{{000000..{len(data.urls) - 1:06d}}}.tar")


def _member_bytes(urls: list[str]) -> int:
    total = 0
    for url in urls:
        with tarfile.open(url) as tar:
            total += sum(m.size for m in tar.getmembers())
    return total


def _check_counts(stages: dict[str, dict[str, Any]], data: Dataset) -> None:
    assert list(stages) == list(STAGES)
    assert stages["read"]["nbytes"] == sum(os.path.getsize(u) for u in data.urls)
    assert stages["read"]["samples"] is None
    assert stages["tar"]["nbytes"] == _member_bytes(data.urls)
    for stage in ("tar", "decode", "batch"):
        assert stages[stage]["samples"] == len(data.keys)
    for result in stages.values():
        assert result["error"] is None
        assert not result["capped"]
        assert result["first_seconds"] is not None


class TestCounts:
    @pytest.mark.parametrize("image", ["pil", "numpy", "torch", "bytes"])
    def test_every_sample_in_process(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset], image: str
    ) -> None:
        """With no workers each stage counts every sample, and read every shard byte."""
        data = make_shards(3, [5, 6, 7], images=True)
        stages = _bench_json(
            capsys, _pattern(data), "--workers", "0", "--batch-size", "4", "--image", image
        )
        _check_counts(stages, data)
        assert not stages["batch"]["ragged"]

    @pytest.mark.slow
    @pytest.mark.parametrize("shards", [1, 3])
    def test_every_sample_with_workers(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset], shards: int
    ) -> None:
        """With 2 workers (whole shards, or one shard in parts) the counts are the same."""
        data = make_shards(shards, [5 + s for s in range(shards)], images=True)
        _check_counts(_bench_json(capsys, _pattern(data), "--workers", "2"), data)

    @pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
    def test_max_samples_caps_each_stage(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset], workers: int
    ) -> None:
        """``--max-samples`` stops each stage after that many samples (plus under a batch)."""
        data = make_shards(4, 10, images=True)
        argv = ["--workers", str(workers), "--batch-size", "4", "--max-samples", "10"]
        stages = _bench_json(capsys, _pattern(data), *argv)
        for stage in ("tar", "decode", "batch"):
            assert 10 <= stages[stage]["samples"] < 10 + 4
            assert stages[stage]["capped"]
        assert 0 < stages["read"]["nbytes"] < sum(os.path.getsize(u) for u in data.urls) / 2

    def test_ragged_images_are_kept_as_lists(self, tmp_path: Path) -> None:
        """Images of different sizes do not fail the batch stage; they stay lists."""
        members = [(f"k{i}.png", image_bytes(0, i, size=(4 + i, 3))) for i in range(5)]
        write_tar(str(tmp_path / "r.tar"), members)
        results = run_bench(str(tmp_path / "r.tar"), workers=0, batch_size=2, progress=False)
        batch = results[-1]
        assert (batch.stage, batch.samples, batch.ragged, batch.error) == ("batch", 5, True, None)


class TestOutput:
    def test_table(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset]
    ) -> None:
        """The table has a header, the four stage rows in order, and names the slowest stage."""
        data = make_shards(2, 4, images=True)
        status, out, err = _run(capsys, "bench", _pattern(data), "--workers", "0")
        assert (status, err) == (0, "")
        lines = out.splitlines()
        assert lines[0].split()[:3] == ["stage", "samples", "seconds"]
        assert [line.split()[0] for line in lines[1:5]] == list(STAGES)
        assert lines[1].split()[1] == "-"
        assert [line.split()[1] for line in lines[2:5]] == ["8"] * 3
        assert "% of the time per sample" in lines[-1]
        assert lines[-1].split()[0] in STAGES

    @pytest.mark.parametrize(("flag", "shown"), [([], False), (["--progress"], True)])
    def test_progress_bars_on_stderr(
        self,
        capsys: pytest.CaptureFixture[str],
        make_shards: Callable[..., Dataset],
        flag: list[str],
        shown: bool,
    ) -> None:
        """Bars go to stderr only when forced (stderr is not a terminal here)."""
        data = make_shards(1, 3)
        status, out, err = _run(capsys, "bench", _pattern(data), "--workers", "0", *flag)
        assert status == 0
        assert all(f"{stage:<6}:" in err for stage in STAGES) == shown
        assert "%|" not in out

    def test_storage_options_are_never_printed(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset]
    ) -> None:
        """``-o`` values appear neither in the results nor in an error."""
        data = make_shards(2, 3)
        options = ["-o", f"token={SECRET}", "--workers", "0"]
        for argv in ([_pattern(data), "--json"], [_pattern(data)], [data.urls[0] + ".nope"]):
            _, out, err = _run(capsys, "bench", *argv, *options, "--progress")
            assert SECRET not in out + err


class TestErrors:
    @pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
    def test_missing_shard(
        self, capsys: pytest.CaptureFixture[str], make_shards: Callable[..., Dataset], workers: str
    ) -> None:
        """A missing shard exits 1 with one line naming it, even from a worker."""
        data = make_shards(2, 3)
        pattern = _pattern(data).replace("000001}", "000002}")
        missing = data.urls[0].replace("000000", "000002")
        status, out, err = _run(capsys, "bench", pattern, "--workers", workers)
        assert (status, out) == (1, "")
        assert err.splitlines() == [
            f"shardpipes: error: {missing}: no such file (1 of 3 shards missing)"
        ]

    def test_a_mix_of_fields_batches_what_they_share(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A mix of jpg and png samples: the batch stage keeps the fields they share."""
        png, jpg = image_bytes(0, 0), image_bytes(0, 1, "jpg")
        members = [("a.png", png), ("a.cls", b"0"), ("b.jpg", jpg), ("b.cls", b"1")]
        write_tar(str(tmp_path / "m.tar"), members)
        argv = ["bench", str(tmp_path / "m.tar"), "--workers", "0", "--batch-size", "2"]
        status, out, err = _run(capsys, *argv)
        assert (status, err) == (0, "")
        assert out.splitlines()[4].split()[:2] == ["batch", "2"]

    def test_batch_that_cannot_collate(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A field that is an int in one sample and text in another: the batch stage fails."""
        members = [("a.cls", b"0"), ("a.json", b"1"), ("b.cls", b"1"), ("b.json", b'"x"')]
        write_tar(str(tmp_path / "m.tar"), members)
        argv = ["bench", str(tmp_path / "m.tar"), "--workers", "0", "--batch-size", "2"]
        status, out, err = _run(capsys, *argv)
        assert status == 1
        assert out.splitlines()[4].split() == ["batch", "failed"]
        assert len(err.splitlines()) == 1
        assert err.startswith("shardpipes: error: batch stage: cannot collate a batch: ")

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--workers", "-1"], "must be a non-negative integer"),
            (["--batch-size", "0"], "must be a positive integer"),
            (["--max-samples", "0"], "must be a positive integer"),
            (["--image", "gif"], "invalid choice: 'gif'"),
        ],
    )
    def test_usage(self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
        """Bad options exit 2 with one line."""
        status, out, err = _run(capsys, "bench", "x.tar", *argv)
        assert (status, out) == (2, "")
        assert len(err.splitlines()) == 1
        assert message in err

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"workers": -1}, "workers must be a non-negative integer (got -1)"),
            ({"batch_size": 0}, "batch_size must be a positive integer (got 0)"),
            ({"max_samples": True}, "max_samples must be a positive integer (got True)"),
            ({"image": "gif"}, "image must be one of"),
        ],
    )
    def test_arguments(self, kwargs: dict[str, Any], message: str) -> None:
        """``run_bench`` checks its arguments before any I/O."""
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            run_bench("does-not-matter.tar", **kwargs)


class TestHelpers:
    def test_collate_ragged(self) -> None:
        """Same-size images stack; different sizes stay lists; other fields collate as usual."""
        same = [{"__key__": f"k{i}", "png": torch.zeros(3, 2, 2), "cls": i} for i in range(2)]
        batch = collate_ragged(same)
        assert batch["png"].shape == (2, 3, 2, 2)
        ragged = [{**s, "png": torch.zeros(3, 2, 2 + i)} for i, s in enumerate(same)]
        batch = collate_ragged(ragged)
        assert [t.shape for t in batch["png"]] == [(3, 2, 2), (3, 2, 3)]
        assert batch["cls"].tolist() == [0, 1]
        mixed = collate_ragged([same[0], {"__key__": "x", "jpg": b"", "cls": 1}])
        assert set(mixed) == {"__key__", "cls"}  # only the fields both samples have
        with pytest.raises(CollateError, match="cannot collate"):
            collate_ragged([{"cls": 1}, {"cls": "one"}])

    @pytest.mark.parametrize(
        ("seconds", "own", "line"),
        [
            ([1, 2, 6, 7], [0.01, 0.01, 0.04, 0.01], "decode costs 57% of the time per sample"),
            ([1, 4, 2, 5], [0.01, 0.03, 0.0, 0.01], "tar costs 60% of the time per sample"),
        ],
    )
    def test_costs(self, seconds: list[float], own: list[float], line: str) -> None:
        """Each stage's cost per sample is its increase over the most expensive stage before."""
        results = [
            StageResult(stage, s, None if stage == "read" else 100)
            for stage, s in zip(STAGES, seconds, strict=True)
        ]
        assert costs(results) == pytest.approx(dict(zip(STAGES, own, strict=True)))
        assert (slowest(results) or "").startswith(line)

    def test_costs_leave_out_failed_stages(self) -> None:
        """A failed stage has no cost; with no tar samples there is nothing to compare."""
        results = [
            StageResult("read", 1),
            StageResult("tar", 2, 10),
            StageResult("batch", 0, error="x"),
        ]
        assert set(costs(results)) == {"read", "tar"}
        assert costs([StageResult("read", 1), StageResult("tar", 2, 0)]) == {}
        assert slowest([StageResult("tar", 2, 0)]) is None
