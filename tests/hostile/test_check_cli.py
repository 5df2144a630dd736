"""``shardpipes inspect --check`` and ``shardpipes bench --handler``: the bad members, listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardpipes.cli import main
from tests.hostile.corpus import DECODE_CASES, END, KEYS, TAR_CASES, samples


def folder(tmp_path: Path, *bad: str) -> str:
    """A good shard and one shard per named corpus case; the glob over them."""
    (tmp_path / "a-good.tar").write_bytes(samples(range(len(KEYS))) + END)
    for name in bad:
        case = TAR_CASES.get(name) or DECODE_CASES[name]
        (tmp_path / f"b-{name}.tar").write_bytes(case.data())
    return str(tmp_path / "*.tar")


def test_check_lists_every_bad_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One row per bad member (reason, offset, URL, member, problem); exit status 1."""
    pattern = folder(tmp_path, "bad_header_checksum", "jpeg_cut_in_the_scan", "pyd_pickle")
    assert main(["inspect", pattern, "--check"]) == 1
    out = capsys.readouterr().out
    rows = out.split("problem\n", 1)[1].splitlines()
    assert len(rows) == 3, out
    tar_row = next(r for r in rows if "bad_header_checksum" in r)
    assert tar_row.split()[:2] == ["tar", "10240"]
    assert "s0005.txt" in tar_row
    assert "checksum" in tar_row
    assert any(r.startswith("decode") and "s0005.jpg" in r for r in rows), rows
    assert any(r.startswith("unsafe") and "s0005.pyd" in r for r in rows), rows
    assert "bad: 3" in out
    # 10 + 9 + 10 + 10 read (the checksum shard's s0005 never is); 2 of them fail to decode
    assert "37 samples yielded of 39 read; 3 skipped (tar 1, decode 1, unsafe 1)" in out


def test_check_of_good_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing bad: exit status 0, and it says so."""
    assert main(["inspect", folder(tmp_path), "--check"]) == 0
    out = capsys.readouterr().out
    assert "no bad members" in out
    assert "10 samples yielded of 10 read; 0 skipped" in out


def test_without_check_a_bad_shard_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain inspect stops at the first bad shard with one line naming it."""
    assert main(["inspect", folder(tmp_path, "random_bytes")]) == 1
    err = capsys.readouterr().err
    assert "b-random_bytes.tar" in err
    assert len(err.strip().splitlines()) == 1


def test_bench_counts_what_it_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bench with --handler ignore runs over bad data and prints what was skipped."""
    pattern = folder(tmp_path, "bad_header_checksum")
    assert main(["bench", pattern, "--workers", "0", "--handler", "ignore"]) == 0
    out = capsys.readouterr().out
    assert "data: 19 samples yielded of 19 read; 1 skipped (tar 1); 2 shards, 0 failed" in out
