"""shardpipes against its peers, side by side: ``python benchmarks/run.py [--quick]``.

Generates the data once (``data.py``, cached), then runs every row of ``ROWS`` with
``num_workers`` 0 and 2, each run in a fresh process (``rows.py``; the ``torchdata09``
rows in a venv of their own, ``td09.py``), ``--repeats`` times, interleaved so that the
machine's noise falls on every row alike. Writes ``results/latest.{md,json,png}``: the
min/median/max rate of each row, first-batch latency, peak RSS of the main process and
of a worker, whether every sample came exactly once, and the target ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import data as bench_data  # noqa: E402

# (row, kinds it runs on, what it is); the table keeps this order
ROWS: list[tuple[str, tuple[str, ...], str]] = [
    ("shardpipes", ("images", "small"), "`tar_shards` recipe, batched in the worker"),
    ("shardpipes_chain", ("images", "small"), "the same as chained pipes"),
    ("shardpipes_threads2", ("images",), "`tar_shards` decoding on 2 threads per worker"),
    ("shardpipes_shuffle5000", ("images",), "`tar_shards`, 5,000-sample buffer, data read 6x"),
    ("webdataset", ("images", "small"), "webdataset 1.0.2, idiomatic"),
    ("torchdata09", ("images", "small"), "torchdata 0.9 DataPipes (own venv)"),
    ("notebook_folder", ("images",), "the notebook's folder Dataset"),
    ("notebook_tarsplit", ("images",), "the notebook's tar-per-worker IterableDataset"),
    ("tarfile", ("small",), "plain `tarfile` in an IterableDataset"),
    ("limit_decode", ("images",), "limit: PIL decode + resize + crop, bytes in memory"),
    ("limit_decode_draft", ("images",), "limit: the same with `Image.draft`"),
    ("limit_read", ("images", "small"), "limit: raw read of the shard files"),
    ("limit_tar_parse", ("small",), "limit: raw tar-header parse"),
]
WORKERS = (0, 2)
UNITS = {"images": "img/s", "small": "samples/s"}


def _runs(kinds: Iterable[str], rows: set[str] | None, workers: Iterable[int]) -> list[Any]:
    return [
        (kind, w, name)
        for kind in kinds
        for w in workers
        for name, row_kinds, _ in ROWS
        if kind in row_kinds and (rows is None or name in rows)
    ]


def run_row(python: str, name: str, kind: str, workers: int, root: Path) -> dict[str, Any]:
    """Run one row in a fresh process; its JSON result (or the error it died of)."""
    cmd = [python, str(HERE / "rows.py"), name, "--kind", kind]
    cmd += ["--workers", str(workers), "--data", str(root)]
    return run_json(cmd, timeout=900)


def run_json(cmd: list[str], *, timeout: float) -> dict[str, Any]:
    """Run ``cmd``; the JSON object of its last ``{`` line (or the error it died of)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: {' | '.join(tail)}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """min/median/max of the repeats of one row, and the rest from the median run."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"error": results[-1]["error"] if results else "not run", "repeats": 0}
    rates = sorted(r["rate"] for r in ok)
    firsts = [r["first_batch_s"] for r in ok if r.get("first_batch_s") is not None]
    workers = [r["rss_worker_mb"] for r in ok if r.get("rss_worker_mb")]
    out = {
        "repeats": len(ok),
        "min": rates[0],
        "median": statistics.median(rates),
        "max": rates[-1],
        "first_batch_s": statistics.median(firsts) if firsts else None,
        "rss_main_mb": max(r["rss_main_mb"] for r in ok),
        "rss_worker_mb": max(workers) if workers else None,
        "correct": "yes" if all(r.get("correct") == "yes" for r in ok) else _wrong(ok),
        "samples": ok[0]["samples"],
        "copies": ok[0].get("copies", 1),
    }
    if any("mb_per_s" in r for r in ok):
        out["mb_per_s"] = statistics.median(r["mb_per_s"] for r in ok if "mb_per_s" in r)
    if len(ok) < len(results):
        out["error"] = f"{len(results) - len(ok)} of {len(results)} runs failed"
    return out


def _wrong(results: list[dict[str, Any]]) -> str:
    return next(r["correct"] for r in results if r.get("correct") != "yes")


def _get(table: dict[str, Any], kind: str, workers: int, row: str) -> float | None:
    entry = table.get(kind, {}).get(str(workers), {}).get(row, {})
    value = entry.get("median")
    return float(value) if value is not None else None


def targets(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets as ratios of medians measured in this run."""
    checks = [
        ("images, 2 workers: shardpipes / limit_decode", "images", 2, "limit_decode", 0.95),
        (
            "images, 2 workers: shardpipes / limit_decode_draft",
            "images",
            2,
            "limit_decode_draft",
            0.95,
        ),
        ("images, 2 workers: shardpipes / webdataset", "images", 2, "webdataset", 1.2),
        ("small, 0 workers: shardpipes / webdataset", "small", 0, "webdataset", 5.0),
        ("small, 2 workers: shardpipes / webdataset", "small", 2, "webdataset", 2.0),
    ]
    out = []
    for label, kind, workers, peer, goal in checks:
        ours, theirs = _get(table, kind, workers, "shardpipes"), _get(table, kind, workers, peer)
        ratio = ours / theirs if ours and theirs else None
        out.append({"target": label, "goal": goal, "ratio": ratio,
                    "met": ratio is not None and ratio >= goal})  # fmt: skip
    for kind in ("images", "small"):
        for workers in WORKERS:
            row = table.get(kind, {}).get(str(workers), {})
            ours, theirs = (
                row.get(n, {}).get("first_batch_s") for n in ("shardpipes", "webdataset")
            )
            ratio = theirs / ours if ours and theirs else None
            out.append({
                "target": f"{kind}, {workers} workers: first batch, webdataset / shardpipes",
                "goal": 1.0, "ratio": ratio, "met": ratio is not None and ratio >= 1.0,
            })  # fmt: skip
    for kind, goal in (("small", 0.8), ("images", 0.9)):  # issue 12: chains as fast as recipes
        chain = _get(table, kind, 2, "shardpipes_chain")
        recipe = _get(table, kind, 2, "shardpipes")
        ratio = chain / recipe if chain and recipe else None
        out.append({
            "target": f"{kind}, 2 workers: shardpipes_chain / shardpipes",
            "goal": goal, "ratio": ratio, "met": ratio is not None and ratio >= goal,
        })  # fmt: skip
    return out


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables."""
    lines = [
        f"One run on {report['machine']}, {report['date']}; each row a fresh process,"
        f" {report['repeats']} repeats interleaved. Medians unless said; rates in"
        " img/s (images) or samples/s (small).",
        "",
    ]
    notes = {name: note for name, _, note in ROWS}
    for kind, by_workers in report["table"].items():
        lines += [f"### {kind} ({report['counts'][kind]:,} samples)", ""]
        lines += [
            "| row | workers | min | median | max | first batch (s) | RSS main / worker (MB)"
            " | exactly once | what |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for workers, rows in by_workers.items():
            for name, s in rows.items():
                if "median" not in s:
                    lines.append(f"| {name} | {workers} | | | | | | error: {s['error']} | |")
                    continue
                rss = f"{s['rss_main_mb']:.0f} / {_fmt(s['rss_worker_mb'])}"
                what = notes[name] + (f" ({s['mb_per_s']:,.0f} MB/s)" if "mb_per_s" in s else "")
                lines.append(
                    f"| {name} | {workers} | {_fmt(s['min'])} | **{_fmt(s['median'])}** | "
                    f"{_fmt(s['max'])} | {_fmt(s['first_batch_s'], 2)} | {rss} | "
                    f"{s['correct']} | {what} |"
                )
        lines.append("")
    lines += ["### Targets (ratios of medians in this run)", "", "| target | goal | ratio | met |"]
    lines.append("|---|---:|---:|---|")
    for t in report["targets"]:
        ratio = "—" if t["ratio"] is None else f"{t['ratio']:.2f}"
        lines.append(f"| {t['target']} | ≥ {t['goal']} | {ratio} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Path) -> bool:
    """A bar chart of median rates (min-max as error bars); False without matplotlib."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kinds = list(report["table"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 5.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        names = [n for n, ks, _ in ROWS if kind in ks]
        for offset, workers in ((-0.2, 0), (0.2, 2)):
            rows = report["table"][kind].get(str(workers), {})
            med = [rows.get(n, {}).get("median") or 0 for n in names]
            low = [m - (rows.get(n, {}).get("min") or m) for n, m in zip(names, med, strict=True)]
            high = [(rows.get(n, {}).get("max") or m) - m for n, m in zip(names, med, strict=True)]
            xs = [i + offset for i in range(len(names))]
            ax.bar(xs, med, width=0.4, yerr=[low, high], label=f"num_workers={workers}")
        ax.set_xticks(range(len(names)), names, rotation=40, ha="right")
        ax.set_ylabel(UNITS[kind])
        ax.set_yscale("log" if kind == "small" else "linear")
        ax.set_title(f"{kind}: median of {report['repeats']} (bars: min-max)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny data, 1 repeat (smoke test)")
    parser.add_argument("--repeats", type=int, help="runs per row (default 3; quick 1)")
    parser.add_argument("--rows", help="comma-separated rows (default all)")
    parser.add_argument("--kinds", default="images,small", help="images,small")
    parser.add_argument("--workers", default="0,2", help="num_workers values (default 0,2)")
    parser.add_argument("--data", type=Path, help="data folder (default benchmarks/.data)")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    parser.add_argument("--no-td09", action="store_true", help="skip the torchdata09 venv rows")
    args = parser.parse_args(argv)

    repeats = args.repeats or (1 if args.quick else 3)
    root = args.data or HERE / (".data-quick" if args.quick else ".data")
    rows = set(args.rows.split(",")) if args.rows else None
    if args.no_td09:
        rows = (rows or {n for n, _, _ in ROWS}) - {"torchdata09"}
    kinds = args.kinds.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    print(f"data: {root}", file=sys.stderr)
    layout = bench_data.ensure(root, quick=args.quick)
    runs = _runs(kinds, rows, workers)
    pythons = {name: sys.executable for _, _, name in runs}
    if "torchdata09" in pythons:
        import td09

        pythons["torchdata09"] = str(td09.ensure_venv())

    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {run: [] for run in runs}
    started = time.time()
    for repeat in range(repeats):
        for kind, w, name in runs:
            result = run_row(pythons[name], name, kind, w, root)
            results[kind, w, name].append(result)
            shown = (
                result.get("error") or f"{result['rate']:,.0f} {UNITS[kind]} {result['correct']}"
            )
            print(f"[{repeat + 1}/{repeats}] {kind:6s} w={w} {name:24s} {shown}", file=sys.stderr)

    table: dict[str, Any] = {}
    for (kind, w, name), rs in results.items():
        table.setdefault(kind, {}).setdefault(str(w), {})[name] = summarize(rs)
    import torch

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "repeats": repeats,
        "seconds": round(time.time() - started),
        "counts": layout["counts"],
        "table": table,
        "targets": targets(table),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / "latest.md").write_text(text)
    drew = chart(report, args.out / "latest.png")
    print(text)
    print(f"wrote {args.out / 'latest.md'}, latest.json" + (", latest.png" if drew else
          " (no chart: matplotlib is not installed)"), file=sys.stderr)  # fmt: skip
    return 0 if all(s.get("correct") == "yes" for k in table.values() for w in k.values()
                    for s in w.values()) else 1  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
