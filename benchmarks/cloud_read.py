"""Sequential read throughput of one tar shard over S3 (s3fs) and HTTP, by block size.

    .venv/bin/python benchmarks/cloud_read.py [--members 200] [--repeats 5]

Writes one tar of ``--members`` members of 1 MiB random bytes (200: 210 MB), uploads it
to a local SeaweedFS S3 server and serves it with the aiohttp static server (both from
``tests/cloud/servers.py``), then reads it back:

* ``open_input``: ``shardpipes.fs.open_input(url, storage_options)`` read in 1 MiB
  ``read()`` calls, as shardpipes' tar reader reads, for several block sizes, set through
  storage_options (s3fs: ``default_block_size``, default 50 MiB, readahead cache;
  HTTPFileSystem: ``block_size``, default 5 MiB, bytes cache);
* ``tar_shards``: ``recipes.tar_shards(url, fields=("bin",), shuffle=False)`` iterated in
  this process, payload bytes counted: end to end with tar parsing, at the default and
  at the best ``open_input`` block size.

Each timing includes the open (a HEAD on a warm filesystem instance: fsspec caches one
instance per distinct storage_options, so each block size gets its own; a fresh s3fs
instance, ``skip_instance_cache=True``, costs 0.15-0.45 s of session set-up, as much as
the read itself, so instances are reused and warmed up once). Repeats are interleaved
across cases; MB/s is 10^6 bytes/s. "RSS +MB" is how far one read raises the RSS
high-water mark (VmHWM, reset first) of a fresh process that has opened the file once:
the memory one open shard costs a DataLoader worker (glibc keeps freed heap resident).
The HTTP server runs in a process of its own, as weed does.

Numbers are loopback: client and server share the same cores (2 here) and never touch a
network, so they show CPU and copy costs per block size, not latency or bandwidth.
Writes benchmarks/results/cloud_read.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from shardpipes.fs import open_input  # noqa: E402
from shardpipes.recipes import tar_shards  # noqa: E402
from tests.cloud.servers import SeaweedS3, StaticHTTP, aws_env  # noqa: E402

MiB = 1 << 20
Options = dict[str, Any]


class Backend(NamedTuple):
    kind: str
    key: str  # the filesystem constructor's block size argument
    default: int  # its default block size, MiB
    sizes: tuple[int | None, ...]  # MiB; None: the default


# s3fs's constructor calls it default_block_size (block_size= is a TypeError there)
S3 = Backend("S3 (SeaweedFS, s3fs)", "default_block_size", 50, (None, 1, 5, 16, 64))
HTTP = Backend("HTTP (aiohttp static, HTTPFileSystem)", "block_size", 5, (None, 16, 64))


def write_tar(path: Path, members: int) -> int:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(members):
            info = tarfile.TarInfo(f"{i:06d}.bin")
            info.size = MiB
            tar.addfile(info, io.BytesIO(os.urandom(MiB)))
    return path.stat().st_size


def read_stream(url: str, options: Options) -> int:
    total = 0
    with open_input(url, options) as f:
        while data := f.read(MiB):
            total += len(data)
    return total


def read_tar(url: str, options: Options) -> int:
    pipe = tar_shards(url, fields=("bin",), shuffle=False, storage_options=options)
    return sum(len(sample[0]) for sample in pipe)


READERS = {"open_input": read_stream, "tar_shards": read_tar}


def probe(how: str, url: str, options: Options) -> None:
    """In a fresh process, instance warm: print the MB one read adds to the RSS high-water mark."""
    torch.set_num_threads(1)
    with open_input(url, options):
        pass
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to VmRSS (Linux)
    before = vm("VmRSS")
    READERS[how](url, options)
    print((vm("VmHWM") - before) * 1024 / 1e6)


def vm(field: str) -> int:
    """A ``Vm*`` field of /proc/self/status, in kB."""
    lines = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith(f"{field}:"))


def serve_http(root: str, ports: Queue[int]) -> None:
    """The static HTTP server in a process of its own (in this one it would share the GIL)."""
    with StaticHTTP(Path(root)) as http:
        ports.put(http.port)
        threading.Event().wait()


def rss_growth(how: str, url: str, options: Options) -> float:
    command = [sys.executable, __file__, "--probe", how, url, json.dumps(options)]
    return float(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def timed(fn: Callable[[], int], expected: int) -> float:
    """Run ``fn`` (it returns the bytes it read); return its MB/s."""
    start = time.perf_counter()
    got = fn()
    seconds = time.perf_counter() - start
    assert got == expected, f"read {got} bytes, expected {expected}"
    return got / seconds / 1e6


def measure(
    title: str, how: str, url: str, cases: Mapping[str, Options], expected: int, repeats: int
) -> dict[str, Any]:
    """Time every case ``repeats`` times, interleaved; print a Markdown table."""
    load_before = os.getloadavg()
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, options in cases.items():
            rates[name].append(timed(partial(READERS[how], url, options), expected))
    load_after = os.getloadavg()
    rss = {name: rss_growth(how, url, options) for name, options in cases.items()}
    rows = {}
    print(f"\n### {title}\n\nload average before: {load_before[0]:.2f} {load_before[1]:.2f}")
    print("\n| block size | median MB/s | min–max MB/s | RSS +MB |\n|---|---:|---:|---:|")
    for name, got in rates.items():
        rows[name] = {"mb_s": got, "median_mb_s": statistics.median(got), "rss_mb": rss[name]}
        print(f"| {name} | {statistics.median(got):.0f} | {min(got):.0f}–{max(got):.0f}"
              f" | {rss[name]:.0f} |")  # fmt: skip
    print(f"\nload average after: {load_after[0]:.2f} {load_after[1]:.2f}", flush=True)
    return {"title": title, "load_before": load_before, "load_after": load_after, "rows": rows}


def bench(
    b: Backend, url: str, base: Options, expected: tuple[int, int], repeats: int
) -> list[dict[str, Any]]:
    def options_for(size: int | None) -> Options:
        return dict(base) if size is None else {**base, b.key: size * MiB}

    def label(size: int | None) -> str:
        return f"default ({b.default} MiB)" if size is None else f"{size} MiB"

    cases = {label(s): options_for(s) for s in b.sizes}
    for size, options in zip(b.sizes, cases.values(), strict=True):
        with open_input(url, options) as f:  # warm the instance: session, credentials
            f.read(MiB)
            assert f._file.blocksize == (size or b.default) * MiB  # type: ignore[attr-defined]
    first = measure(f"{b.kind}: open_input, 1 MiB reads", "open_input", url, cases,
                    expected[0], repeats)  # fmt: skip
    median = {s: first["rows"][label(s)]["median_mb_s"] for s in b.sizes if s}
    best = max(median, key=median.__getitem__)  # the best explicit size: vs the default
    title = f"{b.kind}: tar_shards, fields=('bin',), MB/s of payload"
    tar_cases = {label(s): options_for(s) for s in (None, best)}
    return [first, measure(title, "tar_shards", url, tar_cases, expected[1], repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)  # HOW URL OPTIONS_JSON
    args = parser.parse_args()
    if args.probe:
        return probe(args.probe[0], args.probe[1], json.loads(args.probe[2]))
    torch.set_num_threads(1)
    began = time.perf_counter()
    tables: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cloud-read-") as tmp:
        root = Path(tmp)
        (root / "http").mkdir()
        shard = root / "http" / "shard-000.tar"
        size = write_tar(shard, args.members)
        expected = (size, args.members * MiB)
        print(f"# cloud_read: one tar of {size / 1e6:.1f} MB ({args.members} x 1 MiB), "
              f"{args.repeats} repeats, {os.cpu_count()} cores")  # fmt: skip
        with aws_env(), SeaweedS3(root / "weed") as s3, aws_env(endpoint_url=s3.endpoint_url):
            url = f"s3://{s3.make_bucket([shard])}/{shard.name}"
            tables += bench(S3, url, s3.storage_options, expected, args.repeats)
        spawn = multiprocessing.get_context("spawn")
        ports: Queue[int] = spawn.Queue()
        server = spawn.Process(target=serve_http, args=(str(root / "http"), ports), daemon=True)
        server.start()
        try:
            url = f"http://127.0.0.1:{ports.get(timeout=60)}/{shard.name}"
            tables += bench(HTTP, url, {}, expected, args.repeats)
        finally:
            server.terminate()
            server.join()
    wall = time.perf_counter() - began
    print(f"\nwall time: {wall:.0f} s")
    out = ROOT / "benchmarks" / "results" / "cloud_read.json"
    versions = {m: importlib.metadata.version(m) for m in ("fsspec", "s3fs", "aiohttp", "torch")}
    out.write_text(json.dumps({"object_bytes": size, "repeats": args.repeats, "wall_s": wall,
                               "versions": versions, "tables": tables}, indent=1))  # fmt: skip
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
