"""Mutation fuzzing of the tar reader and the sample grouping, with atheris (libFuzzer).

Every input goes through ``iter_members`` + ``group_samples`` twice: raising (the first bad
member ends it with a ``TarFormatError``), and skipping (an ``on_error`` that records and
goes on, as ``handler="warn"`` does). Only ``TarFormatError`` may come out; anything else
(``IndexError``, ``struct.error``, ``MemoryError``, ``UnicodeDecodeError``…) is a crash. An
input that takes over a second is a crash too (libFuzzer's ``-timeout``, and a check here).

    make fuzz                                  # about 2 minutes
    make fuzz FUZZ_SECONDS=1800                # longer
    .venv/bin/python fuzz/fuzz_tar.py -runs=1000 CORPUS_DIR   # any libFuzzer flags

The seed corpus (valid ustar, GNU, pax and gzip tars with long and unicode names, edge
sizes) is written at start to the corpus folder given when it is empty, or to a temporary
folder when none is given.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import tarfile
import tempfile
import time

import atheris

with atheris.instrument_imports(include=["shardpipes"]):
    from shardpipes._core.samples import group_samples
    from shardpipes._core.tar import iter_members
    from shardpipes.errors import TarFormatError

MAX_MEMBER = 1 << 20  # small, so that the guard is reached
SLOW = 1.0


def _drain(data: bytes, on_error: object) -> int:
    members = iter_members(
        io.BytesIO(data), url="fuzz://input.tar", max_member_bytes=MAX_MEMBER, on_error=on_error
    )
    return sum(1 for _ in group_samples(members, url="fuzz://input.tar", handler="ignore"))


def test_one_input(data: bytes) -> None:
    """The fuzz target: raising and skipping reads of ``data``."""
    began = time.perf_counter()
    with contextlib.suppress(TarFormatError):
        _drain(data, None)
    reported: list[TarFormatError] = []
    _drain(data, lambda exc, fatal: reported.append(exc))
    for exc in reported:
        if exc.url != "fuzz://input.tar" or exc.offset is None:
            msg = f"an error without its URL or offset: {exc!r}"
            raise AssertionError(msg)
    took = time.perf_counter() - began
    if took > SLOW:
        msg = f"one input took {took:.2f} s ({len(data)} bytes)"
        raise RuntimeError(msg)


def seeds() -> list[bytes]:
    """Small valid archives in every format the reader knows."""
    out = []
    names = ["a.jpg", "a.cls", "dir/b.seg.png", "b" * 120 + ".txt", "ünïcode/ç.json"]
    sizes = [0, 1, 511, 512, 513, 1024]
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
            for i, name in enumerate(names):
                if fmt == tarfile.USTAR_FORMAT and len(name.encode()) > 100:
                    continue
                info = tarfile.TarInfo(name)
                info.size = sizes[i % len(sizes)]
                tar.addfile(info, io.BytesIO(bytes([i]) * info.size))
        out.append(buf.getvalue())
    out.append(gzip.compress(out[-1]))
    return out


def main() -> None:
    """Run libFuzzer with the seed corpus (unless a corpus folder is given)."""
    argv = list(sys.argv)
    folders = [a for a in argv[1:] if not a.startswith("-")]
    if not folders:
        folders = [tempfile.mkdtemp(prefix="shardpipes-fuzz-")]
        argv.append(folders[0])
    if not os.listdir(folders[0]):  # an empty corpus starts from the seeds
        for i, seed in enumerate(seeds()):
            with open(os.path.join(folders[0], f"seed-{i}"), "wb") as f:
                f.write(seed)
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
