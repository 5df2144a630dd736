"""Readers over a shaped network: ``python benchmarks/latency.py [--quick]`` (issue 13 §2).

Writes tar shards of random ``.bin`` payloads (``--sample-kb``) and a ``.cls`` holding
each sample's index, once, into a cache folder; serves them with the aiohttp static
server and from a SeaweedFS S3 bucket (``tests/cloud/servers.py``, each a process of its
own); and puts one ``shaper.py`` proxy per profile (round trip / bandwidth per
connection) in front of each server. Then, for each profile and ``--workers`` value,
runs these rows, each in a fresh process, ``--repeats`` times, interleaved:

- ``shardpipes_http``: ``tar_shards(urls, fields=("bin", "cls"), shuffle=False,
  batch_size=16, **sp_options)`` in ``DataLoader(batch_size=None, num_workers=W)``;
- ``shardpipes_s3``: the same over ``s3://`` (s3fs, endpoint at the proxy);
- ``webdataset_http``: webdataset 1.0.2's ``WebDataset(urls, shardshuffle=False)
  .to_tuple("bin", "cls").batched(16)`` (it reads ``http://`` with one ``curl`` per shard);
- ``ideal``: computed, not run: W connections each at the full rate.

Each row reports MB/s of payload (10^6 bytes of ``.bin`` per second of wall time, from
building the loader to its last batch), the time to the first batch, whether every
sample came exactly once (the ``.cls`` indices), the peak RSS (VmHWM) of the largest
DataLoader worker and of the main process, and the TCP connections the proxy accepted.
The proxies run in threads of this process, which waits idle while a row runs in its
child; a curl check per profile shows whether they keep up (see ``proxy_check``).
Writes ``--out`` + ``.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import data as bench_data  # noqa: E402
from rows import correctness  # noqa: E402
from shaper import Shaper, parse_rate, parse_seconds  # noqa: E402

BATCH = 16
ROWS = {
    "shardpipes_http": "shardpipes `tar_shards`, HTTP (fsspec HTTPFileSystem)",
    "shardpipes_s3": "shardpipes `tar_shards`, S3 (SeaweedFS through s3fs)",
    "webdataset_http": "webdataset 1.0.2, HTTP (one `curl` per shard)",
}
IDEAL = "ideal"  # W connections at the full rate, computed
PEER = "webdataset_http"
TARGET = ("50ms/40MB", 2)  # the profile and workers for the targets
# What a worker's RSS may grow by beyond its readahead buffers (the RSS target's constant):
# the client library and its session (measured here: fsspec's HTTP over aiohttp 18 MiB,
# s3fs and botocore 33 MiB), the tar reader's 1 MiB reads, a batch of 16 samples being
# built and pickled, and allocator slack. See the README's Latency section.
RSS_CONSTANT_MIB = 64
SIZES = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
QUICK = {"shards": 4, "shard_mb": 1.0, "sample_kb": 20.0, "profiles": "20ms/100MB", "workers": "2"}


class Profile(NamedTuple):
    name: str  # "50ms/40MB"
    rtt: float  # seconds
    rate: float  # bytes per second per connection


class Shards(NamedTuple):
    folder: Path
    paths: list[Path]
    samples: int
    sample_bytes: int


def parse_profile(text: str) -> Profile:
    """``"50ms/40MB"``: a round trip and a per-connection rate."""
    rtt, rate = text.split("/")
    value = parse_rate(rate)
    if value is None:
        msg = f"a profile needs a rate (got {text!r})"
        raise ValueError(msg)
    return Profile(text, parse_seconds(rtt), value)


def parse_option(text: str) -> tuple[str, int | str]:
    """``--sp-option key=value``: an int (``64MiB``, ``4MB`` are ints too) or else a str."""
    key, sep, value = text.partition("=")
    if not (key and sep):
        msg = f"--sp-option must be key=value (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    digits = value.rstrip("KMGIBkmgib")
    unit = value[len(digits) :].upper()
    if digits.isdigit() and (unit == "" or unit in SIZES):
        return key, int(digits) * SIZES.get(unit, 1)
    return key, value


# --- data and servers ------------------------------------------------------------------


def ensure_shards(cache: Path, shards: int, shard_mb: float, sample_kb: float) -> Shards:
    """The shards of this size under ``cache``, written once (the manifest last)."""
    size = round(sample_kb * 1000)
    count = shards * int(shard_mb * 1e6 // size)
    folder = cache / f"{shards}x{shard_mb:g}MB-{sample_kb:g}KB"
    manifest = {"version": bench_data.VERSION, "shards": shards, "count": count, "size": size}
    paths = [folder / f"train-{s}.tar" for s in range(shards)]
    if not (
        (folder / "manifest.json").exists()
        and json.loads((folder / "manifest.json").read_text()) == manifest
    ):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        paths = bench_data.write_bytes_shards(folder, "train", count, size, shards=shards)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return Shards(folder, paths, count, size)


def _exit_on(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds the with blocks: servers and proxies stop


@contextmanager
def servers(data: Shards, profiles: list[Profile], scratch: Path) -> Iterator[dict[str, Any]]:
    """The HTTP and S3 servers, a proxy per (profile, server); all stopped on any exit."""
    from tests.cloud.servers import HOST, SeaweedS3, StaticHTTP, aws_env

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on)
    with ExitStack() as stack:
        stack.enter_context(aws_env())  # fake credentials, no route to real AWS
        http = stack.enter_context(StaticHTTP(data.folder))
        s3 = stack.enter_context(SeaweedS3(scratch / "weed"))
        bucket = s3.make_bucket(data.paths)
        proxies = {}
        for p in profiles:
            for kind, port in (("http", http.port), ("s3", s3.ports["s3"])):
                proxy = Shaper(HOST, port, rtt=p.rtt, rate=p.rate)
                proxies[p.name, kind] = stack.enter_context(proxy)
        yield {"proxies": proxies, "bucket": bucket, "s3_options": s3.storage_options}


def row_spec(row: str, env: dict[str, Any], data: Shards, profile: Profile) -> dict[str, Any]:
    """What a row's process needs: its URLs and storage options (through the proxy)."""
    kind = row.rsplit("_", 1)[1]
    endpoint = f"http://127.0.0.1:{env['proxies'][profile.name, kind].port}"
    names = [path.name for path in data.paths]
    if kind == "http":
        return {"urls": [f"{endpoint}/{name}" for name in names], "storage_options": None}
    options = {**env["s3_options"], "client_kwargs": {"endpoint_url": endpoint}}
    options["skip_instance_cache"] = True
    return {"urls": [f"s3://{env['bucket']}/{name}" for name in names], "storage_options": options}


# --- the proxy check -------------------------------------------------------------------


def proxy_check(port: int, data: Shards, profile: Profile, connections: int) -> dict[str, Any]:
    """``connections`` parallel ``curl`` GETs of one shard each through the HTTP proxy.

    The body's pace (bytes / (total time - time to first byte)) of the slowest
    connection against the profile's rate: near 1.0, the proxy keeps up.
    """
    write = "%{size_download} %{time_starttransfer} %{time_total}"
    urls = [f"http://127.0.0.1:{port}/{path.name}" for path in data.paths[:connections]]
    procs = [
        subprocess.Popen(
            ["curl", "-sS", "-o", os.devnull, "-w", write, url], stdout=subprocess.PIPE, text=True
        )
        for url in urls
    ]
    timed = [tuple(float(v) for v in proc.communicate(timeout=600)[0].split()) for proc in procs]
    paces = [size / (total - first) for size, first, total in timed]
    return {
        "profile": profile.name,
        "connections": connections,
        "bytes": int(sum(t[0] for t in timed)),
        "first_byte_s": max(t[1] for t in timed),
        "pace_mb_s": min(paces) / 1e6,
        "of_rate": min(paces) / profile.rate,
    }


# --- one row, in a process of its own --------------------------------------------------


def vm_kb(pid: int, field: str) -> int:
    """A ``Vm*`` field of ``/proc/PID/status``, in kB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith(f"{field}:"))


class WorkerProbe:
    """A ``worker_init_fn`` that notes each DataLoader worker's pid and RSS at its start."""

    def __init__(self, workers: int) -> None:
        self.pids = multiprocessing.RawArray("l", max(workers, 1))
        self.start_kb = multiprocessing.RawArray("l", max(workers, 1))

    def __call__(self, worker_id: int) -> None:
        self.pids[worker_id] = os.getpid()
        self.start_kb[worker_id] = vm_kb(os.getpid(), "VmRSS")

    def peaks(self) -> list[tuple[float, float]]:
        """(peak RSS, RSS at start) of each worker in MiB, read while they are alive."""
        return [
            (vm_kb(pid, "VmHWM") / 1024, start / 1024)
            for pid, start in zip(self.pids, self.start_kb, strict=True)
            if pid
        ]


def dataset(spec: dict[str, Any]) -> Any:
    """The row's pipe (shardpipes) or dataset (webdataset), batched in the workers."""
    if spec["row"] == PEER:
        from peers import webdataset_bytes

        return webdataset_bytes(spec["urls"], BATCH)
    from shardpipes.recipes import tar_shards

    options = dict(spec["sp_options"])
    if spec["storage_options"] is not None:
        options["storage_options"] = spec["storage_options"]
    return tar_shards(
        spec["urls"], fields=("bin", "cls"), shuffle=False, batch_size=BATCH, **options
    )


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Iterate the row's loader once; time it and check every sample came once."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    workers = spec["workers"]
    probe = WorkerProbe(workers)
    # the full collection that importing torch leaves due (~0.1 s here) falls on whichever
    # row allocates next: run it now, out of every row's clock
    gc.collect()
    start = time.perf_counter()
    loader = DataLoader(
        dataset(spec),
        batch_size=None,
        num_workers=workers,
        persistent_workers=workers > 0,
        worker_init_fn=probe,
    )
    first, labels, payload = None, [], 0
    for payloads, cls in loader:  # persistent workers: alive after the last batch
        first = first if first is not None else time.perf_counter() - start
        labels += cls.tolist()
        payload += sum(map(len, payloads))
    seconds = time.perf_counter() - start
    peaks = probe.peaks()
    return {
        "seconds": seconds,
        "mb_s": payload / seconds / 1e6,
        "first_batch_s": first,
        "samples": len(labels),
        "payload_bytes": payload,
        "exactly_once": correctness(labels, spec["count"]) == "yes",
        "correct": correctness(labels, spec["count"]),
        "rss_worker_mib": max((peak for peak, _ in peaks), default=None),
        "rss_worker_growth_mib": max((peak - at for peak, at in peaks), default=None),
        "rss_main_mib": vm_kb(os.getpid(), "VmHWM") / 1024,
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """``run_one`` for ``--run``: an error is reported in the JSON, not raised."""
    try:
        return run_one(spec)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


# --- the report ------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one row (RSS: the maximum), and the min-max of MB/s."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"] if runs else "not run", "repeats": 0}

    def values(key: str) -> list[Any]:
        return [r[key] for r in ok if r.get(key) is not None]

    out: dict[str, Any] = {
        "repeats": len(ok),
        "min": min(values("mb_s")),
        "max": max(values("mb_s")),
        "samples": ok[0]["samples"],
    }
    for key in ("mb_s", "first_batch_s", "connections", "seconds", "proxy_cpu"):
        out[key] = statistics.median(values(key)) if values(key) else None
    for key in ("rss_worker_mib", "rss_worker_growth_mib", "rss_main_mib"):
        out[key] = max(values(key)) if values(key) else None
    out["exactly_once"] = all(r["exactly_once"] for r in ok)
    out["correct"] = next((r["correct"] for r in ok if not r["exactly_once"]), "yes")
    if len(ok) < len(runs):
        out["error"] = f"{len(runs) - len(ok)} of {len(runs)} runs failed"
    return out


def targets(table: dict[str, Any], sp_options: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets at 50 ms / 40 MB/s, 2 workers (``None``: not measured)."""
    cell = table.get(f"{TARGET[0]}|{TARGET[1]}", {})

    def get(row: str, key: str) -> float | None:
        value = cell.get(row, {}).get(key)
        return float(value) if value is not None else None

    from shardpipes.fs.readahead import READAHEAD

    readahead = sp_options.get("readahead", READAHEAD)
    bound = (readahead if isinstance(readahead, int) else 0) / (1 << 20) + RSS_CONSTANT_MIB
    out = []
    for row in ("shardpipes_http", "shardpipes_s3"):
        speed = _ratio(get(row, "mb_s"), get(PEER, "mb_s"))
        first = _ratio(get(row, "first_batch_s"), get(PEER, "first_batch_s"))
        growth = get(row, "rss_worker_growth_mib")
        out += [
            {"target": f"MB/s, {row} / {PEER}", "goal": "≥ 1.5", "value": speed,
             "met": None if speed is None else speed >= 1.5},
            {"target": f"first batch, {row} / {PEER}", "goal": "≤ 1.0", "value": first,
             "met": None if first is None else first <= 1.0},
            {"target": f"worker RSS growth (MiB), {row}", "goal": f"≤ {bound:.0f}",
             "value": growth, "met": None if growth is None else growth <= bound},
        ]  # fmt: skip
    return out


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _table_rows(report: dict[str, Any]) -> list[str]:
    lines = []
    for cell, rows in report["table"].items():
        profile, workers = cell.split("|")
        peer = rows.get(PEER, {}).get("mb_s")
        for row, s in rows.items():
            what = f"`{row}`" if row != IDEAL else f"ideal: {workers} × the rate (computed)"
            if s.get("mb_s") is None:
                lines.append(f"| {profile} | {workers} | {what} | error: {s['error']} |")
                continue
            ratio = f"{s['mb_s'] / peer:.2f}" if peer else "—"
            spread = f"{_num(s.get('min'))}–{_num(s.get('max'))}" if row != IDEAL else ""
            rss = f"{_num(s.get('rss_worker_mib'), 0)} (+{_num(s.get('rss_worker_growth_mib'), 0)})"
            once = {True: "yes", False: s.get("correct"), None: ""}[s.get("exactly_once")]
            lines.append(
                f"| {profile} | {workers} | {what} | **{_num(s['mb_s'])}** | {spread} | {ratio} | "
                f"{_num(s.get('first_batch_s'), 2)} | {once} | {rss if row != IDEAL else ''} | "
                f"{_num(s.get('rss_main_mib'), 0)} | {_num(s.get('connections'), 0)} |"
                f" {_num(s.get('proxy_cpu'), 2)} |"
            )
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: proxy check, the rows, the targets."""
    d, opts = report["data"], report["sp_options"]
    lines = [
        f"One run on {report['machine']}, {report['date']}: {d['shards']} shards of"
        f" {d['shard_mb']:g} MB ({d['count']:,} samples of {d['sample_kb']:g} KB and a `.cls`),"
        f" batches of {BATCH}; each row a fresh process, {report['repeats']} repeat(s)"
        " interleaved; medians, MB/s of payload (min–max over the repeats). shardpipes"
        f" options: {', '.join(f'{k}={v}' for k, v in opts.items()) or 'none'}. Load"
        f" average (1 min) {report['load_average'][0]} before, {report['load_average'][1]}"
        f" after; {report['seconds']} s in all.",
        "",
        "Proxy check (curl through the HTTP proxy, one shard per connection):",
        "",
        "| profile | connections | slowest connection's pace (MB/s) | of the rate |"
        " first byte (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c['profile']} | {c['connections']} | {c['pace_mb_s']:.1f} | {c['of_rate']:.2f} |"
        f" {c['first_byte_s']:.3f} |"
        for c in report["proxy_check"]
    ]
    lines += [
        "",
        "| profile | workers | row | MB/s | min–max | × webdataset | first batch (s) |"
        " exactly once | worker RSS peak (+growth), MiB | main RSS, MiB | connections |"
        " proxy CPU |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
        *_table_rows(report),
        "",
        f"Targets ({TARGET[0]}, {TARGET[1]} workers; the RSS bound is readahead +"
        f" {RSS_CONSTANT_MIB} MiB):",
        "",
        "| target | goal | measured | met |",
        "|---|---|---:|---|",
    ]
    for t in report["targets"]:
        met = {True: "yes", False: "no", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['goal']} | {_num(t['value'], 2)} | {met} |")
    return "\n".join(lines) + "\n"


# --- the run ---------------------------------------------------------------------------


def measure(
    args: argparse.Namespace, data: Shards, profiles: list[Profile], workers: list[int]
) -> tuple[dict[Any, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The proxy checks, then every row ``args.repeats`` times, interleaved."""
    from run import run_json

    runs = [(p, w, row) for p in profiles for w in workers for row in args.rows]
    results: dict[Any, list[dict[str, Any]]] = {(p.name, w, row): [] for p, w, row in runs}
    with (
        tempfile.TemporaryDirectory(prefix="latency-") as scratch,
        servers(data, profiles, Path(scratch)) as env,
    ):
        checks = [
            proxy_check(env["proxies"][p.name, "http"].port, data, p, n)
            for p in profiles
            for n in sorted({1, *workers})
            if n <= len(data.paths)
        ]
        for repeat in range(args.repeats):
            for p, w, row in runs:
                spec = {"row": row, "workers": w, "count": data.samples, "sp_options": args.sp}
                spec.update(row_spec(row, env, data, p))
                proxy = env["proxies"][p.name, row.rsplit("_", 1)[1]]
                before, cpu = proxy.connections, time.process_time()
                timeout = 120 + 10 * data.samples * data.sample_bytes / p.rate
                result = run_json(
                    [sys.executable, __file__, "--run", json.dumps(spec)], timeout=timeout
                )
                result["connections"] = proxy.connections - before
                if "seconds" in result:  # this process's CPU is the proxies': per second
                    result["proxy_cpu"] = (time.process_time() - cpu) / result["seconds"]
                results[p.name, w, row].append(result)
                shown = result.get("error") or (
                    f"{result['mb_s']:6.1f} MB/s, first batch {result['first_batch_s']:.2f} s,"
                    f" exactly once: {result['correct']}"
                )
                print(
                    f"[{repeat + 1}/{args.repeats}] {p.name} w={w} {row:16s} {shown}",
                    file=sys.stderr,
                    flush=True,
                )
    return results, checks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=float, default=20.0)
    parser.add_argument("--sample-kb", type=float, default=100.0)
    parser.add_argument("--workers", default="2,4", help="num_workers values (default 2,4)")
    parser.add_argument(
        "--profiles",
        default="50ms/40MB,20ms/100MB,100ms/25MB",
        help="round trip/rate per connection, comma-separated",
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated (default all)")
    parser.add_argument(
        "--sp-option",
        dest="sp",
        action="append",
        type=parse_option,
        default=[],
        metavar="KEY=VALUE",
        help="a tar_shards option for the shardpipes rows (repeatable)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, one profile, 2 workers, 1 repeat (smoke test)",
    )
    parser.add_argument("--data", type=Path, default=HERE / ".data-latency", help="cache folder")
    parser.add_argument(
        "--out",
        type=Path,
        help="writes OUT.json and OUT.md "
        "(default benchmarks/results/latency, quick: latency-quick)",
    )
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a row's JSON spec: run it here
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK, repeats=1)
    args.sp = dict(args.sp)
    args.rows = [row for row in args.rows.split(",") if row]
    if unknown := set(args.rows) - set(ROWS):
        parser.error(f"unknown rows {sorted(unknown)}; choose from {list(ROWS)}")
    out = args.out or HERE / "results" / ("latency-quick" if args.quick else "latency")
    args.out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run:
        print(json.dumps(child(json.loads(args.run))))
        return 0
    if shutil.which("curl") is None:
        print("curl not found: webdataset reads http:// URLs with it", file=sys.stderr)
        return 2
    profiles = [parse_profile(text) for text in args.profiles.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    data = ensure_shards(args.data, args.shards, args.shard_mb, args.sample_kb)
    # shardpipes' bytecode, as pip compiles an installed wheel's (an editable install under
    # PYTHONDONTWRITEBYTECODE=1, as here, would compile every module at each import: +0.15 s)
    compileall.compile_dir(str(HERE.parent / "shardpipes"), quiet=1)
    started, load_before = time.monotonic(), os.getloadavg()[0]
    results, checks = measure(args, data, profiles, workers)
    table: dict[str, dict[str, Any]] = {}
    for (profile, w, row), runs in results.items():
        table.setdefault(f"{profile}|{w}", {})[row] = summarize(runs)
    for p in profiles:
        for w in workers:
            table[f"{p.name}|{w}"][IDEAL] = {"mb_s": w * p.rate / 1e6}
    import torch

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "seconds": round(time.monotonic() - started),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "repeats": args.repeats,
        "data": {
            "shards": args.shards,
            "shard_mb": args.shard_mb,
            "sample_kb": args.sample_kb,
            "count": data.samples,
            "payload_bytes": data.samples * data.sample_bytes,
        },
        "sp_options": args.sp,
        "proxy_check": checks,
        "table": table,
        "runs": {f"{p}|{w}|{row}": runs for (p, w, row), runs in results.items()},
        "targets": targets(table, args.sp),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    Path(f"{args.out}.md").write_text(text)
    print(text)
    print(f"wrote {args.out}.json, .md in {report['seconds']} s", file=sys.stderr)
    return (
        0
        if all(
            s.get("exactly_once", True) and "error" not in s
            for cell in table.values()
            for s in cell.values()
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
