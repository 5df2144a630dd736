"""Our streaming tar reader against tarfile's stream mode, on many small members.

    .venv/bin/python benchmarks/tar_reader.py [--samples 50000]

Writes a shard of N samples (1 KiB ``.bin`` + ``.cls``) to a temp dir, then reads it
back three ways, best of 3: ``tarfile.open(mode="r|")`` reading every member,
``shardpipes._core.tar.iter_members``, and ``open_tar`` (members grouped into samples).
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
import time
from collections.abc import Callable

from shardpipes import list_shards
from shardpipes._core.tar import iter_members


def write(path: str, n: int) -> None:
    payload = os.urandom(1024)
    with tarfile.open(path, "w") as tar:
        for i in range(n):
            for ext, data in (("bin", payload), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def with_tarfile(path: str) -> int:
    count = 0
    with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
        for info in tar:
            if info.isreg():
                fobj = tar.extractfile(info)
                assert fobj is not None
                fobj.read()
                count += 1
    return count


def with_ours(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in iter_members(f, url=path))


def with_open_tar(path: str) -> int:
    return 2 * sum(1 for _ in list_shards(path).open_tar())


def best(fn: Callable[[str], int], path: str) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(3):
        start = time.perf_counter()
        count = fn(path)
        times.append(time.perf_counter() - start)
    return min(times), count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=50_000)
    n = parser.parse_args().samples
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "small.tar")
        write(path, n)
        print(f"{n} samples, {2 * n} members, {os.path.getsize(path) / 1e6:.1f} MB")
        for name, fn in [
            ("tarfile r|", with_tarfile),
            ("iter_members", with_ours),
            ("open_tar", with_open_tar),
        ]:
            seconds, members = best(fn, path)
            rate = members / seconds
            print(f"{name:14s} {rate:12,.0f} members/s  {rate / 2:12,.0f} samples/s")


if __name__ == "__main__":
    main()
