"""Mutation testing with mutmut 3, configured here rather than in pyproject.toml.

``make mutate`` runs this. It mutates the modules given (by default every module of
``shardpipes/_core/``), runs each mutant against the tests mapped to its module below (and,
within those, only the tests that call the mutated function: mutmut records that), and writes
``mutants/report.md``: the score per module and every surviving mutant with its line and diff.

    python tools/mutate.py                                   # all of shardpipes/_core/
    python tools/mutate.py --paths shardpipes/_core/braces.py
    python tools/mutate.py --paths shardpipes/pipes/shards.py --tests tests/pipes/test_shards.py

Tests marked ``slow`` (DataLoader workers, subprocesses) are left out unless ``--slow`` is
given (``MUTATE_ARGS=--slow``). Doctests are not run against mutants (mutmut copies each
function once per mutant, docstring included, so ``--doctest-modules`` would collect every
copy). Hypothesis runs with a fixed seed so that a score can be compared between runs.
Timeouts are CPU-time limits (``--timeout-multiplier`` times the tests' time), so a busy
machine does not cause them.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "shardpipes"
DEFAULT_PATHS = ["shardpipes/_core"]

#: The tests that exercise each module; a module missing here needs ``--tests``.
TESTS_BY_MODULE: dict[str, list[str]] = {
    "shardpipes/_core/braces.py": ["tests/core/test_braces.py"],
    "shardpipes/_core/decoders.py": ["tests/pipes/test_decode.py"],
    "shardpipes/_core/fields.py": ["tests/pipes/test_fields.py", "tests/test_one_engine.py"],
    "shardpipes/_core/handlers.py": ["tests/core/test_handlers.py", "tests/core/test_samples.py"],
    "shardpipes/_core/index.py": ["tests/core/test_index.py"],
    "shardpipes/_core/mixing.py": ["tests/pipes/test_mix.py"],
    "shardpipes/_core/prefetch.py": ["tests/core/test_prefetch.py"],
    "shardpipes/_core/tenbin.py": ["tests/core/test_tenbin.py", "tests/test_writing.py"],
    "shardpipes/_core/policy.py": ["tests/hostile/test_policy.py"],
    "shardpipes/_core/reading.py": ["tests/test_one_engine.py", "tests/pipes/test_tar.py"],
    "shardpipes/_core/shuffle.py": ["tests/test_resume.py", "tests/test_one_engine.py"],
    "shardpipes/_core/stage.py": ["tests/test_resume.py", "tests/pipes/test_length.py"],
    "shardpipes/_core/samples.py": ["tests/core/test_samples.py", "tests/core/test_split.py"],
    "shardpipes/_core/shared.py": ["tests/hostile/test_policy.py"],
    "shardpipes/_core/split.py": ["tests/core/test_split.py", "tests/pipes/test_block_shuffle.py"],
    "shardpipes/_core/steps.py": ["tests/test_one_engine.py"],
    "shardpipes/_core/tar.py": ["tests/core/test_tar.py"],
    "shardpipes/_core/writer.py": ["tests/core/test_writer.py"],
    "shardpipes/pipes/shards.py": ["tests/pipes/test_shards.py"],
    "shardpipes/_cache.py": [
        "tests/test_cache_unit.py",
        "tests/test_readahead_unit.py",
        "tests/cloud/test_cache.py",
        "tests/cloud/test_readahead.py",
    ],
    # the cloud tests start real servers (SeaweedFS, aiohttp, moto): slower than the units
    "shardpipes/_http.py": [
        "tests/test_http_client_unit.py",
        "tests/cloud/test_http_client.py",
        "tests/cloud/test_http.py",
        "tests/cloud/test_readahead.py",
        "tests/cloud/test_retries.py",
    ],
    "shardpipes/_readahead.py": [
        "tests/test_readahead_unit.py",
        "tests/cloud/test_readahead.py",
        "tests/cloud/test_http_client.py",
        "tests/cloud/test_retries.py",
        "tests/cloud/test_cache.py",
    ],
}

STATUS = {  # mutmut's exit codes, in four groups
    0: "survived",
    1: "killed",
    3: "killed",
    24: "timeout",
    -24: "timeout",
    36: "timeout",
    152: "timeout",
    255: "timeout",
    5: "no tests",
    33: "no tests",
}


def modules(paths: list[str]) -> list[str]:
    """The ``.py`` files under ``paths`` (files or folders), relative to the repository."""
    out = []
    for path in paths:
        p = ROOT / path
        if not p.exists():
            msg = f"no such file or folder: {path}"
            raise SystemExit(msg)
        found = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        out += [str(f.relative_to(ROOT)) for f in found if f.name != "__init__.py"]
    return out


def tests_for(mods: list[str], extra: list[str]) -> tuple[list[str], list[str]]:
    """The test files for ``mods`` (``extra`` if given, else the table's), and the modules.

    Without ``extra``, a module the table does not know is left out, with a note.
    """
    if extra:
        return extra, mods
    unknown = [m for m in mods if m not in TESTS_BY_MODULE]
    for m in unknown:
        print(f"skipping {m}: no tests mapped in tools/mutate.py (or pass MUTATE_TESTS=...)")
    mods = [m for m in mods if m in TESTS_BY_MODULE]
    if not mods:
        msg = "nothing to mutate"
        raise SystemExit(msg)
    return sorted({t for m in mods for t in TESTS_BY_MODULE[m] if (ROOT / t).exists()}), mods


def configure(mods: list[str], tests: list[str], multiplier: float, *, slow: bool) -> None:
    """Hand mutmut its configuration, as if read from a ``[tool.mutmut]`` table."""
    import mutmut.configuration as conf

    args = ["-p", "no:cacheprovider", "--hypothesis-seed=0"]
    if not slow:
        args += ["-m", "not slow"]
    settings: dict[str, Any] = {
        "source_paths": [PACKAGE],  # the whole package is copied; only `mods` are mutated
        "only_mutate": mods,
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": args,
        "timeout_multiplier": multiplier,
        "timeout_constant": 2.0,
        "use_git_change_detection": False,
    }
    conf._config_reader = lambda: settings.get  # type: ignore[assignment]
    conf.reset_config()
    # spawned processes (DataLoader workers with the spawn context) read mutmut's
    # configuration again, from mutants/ (their working folder): the same, as setup.cfg
    lines = ["[mutmut]"]
    for key, value in settings.items():
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {v}" for v in value))
        else:
            lines.append(f"{key} = {value}")
    (ROOT / "mutants").mkdir(exist_ok=True)
    (ROOT / "mutants" / "setup.cfg").write_text("\n".join(lines) + "\n")


def run_mutmut(max_children: int) -> None:
    """Run ``mutmut run`` in this process (its workers fork from it)."""
    from mutmut.__main__ import cli

    try:
        cli.main(["run", "--max-children", str(max_children)], standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise


def function_lines(source: str) -> dict[str, tuple[int, int]]:
    """Map mutmut's key of each function (``x_f``, ``xǁClassǁm``) to its line range."""
    spans = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    key = f"xǁ{node.name}ǁ{item.name}"
                    spans[key] = (item.lineno, item.end_lineno or item.lineno)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans[f"x_{node.name}"] = (node.lineno, node.end_lineno or node.lineno)
    return spans


def mutant_line(diff: str, lines: list[str], span: tuple[int, int]) -> int:
    """The source line that a mutant's diff changes (the first removed line, found in span)."""
    removed = [d[1:].strip() for d in diff.splitlines() if d.startswith("-") and d[1:2] != "-"]
    for number in range(span[0], span[1] + 1):
        if removed and lines[number - 1].strip() == removed[0]:
            return number
    return span[0]


def report(mods: list[str], tests: list[str], seconds: float, out: Path) -> str:
    """Write the markdown report and return the summary table."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    rows = ["| module | mutants | killed | timeout | survived | no tests | score |"]
    rows.append("|---|---:|---:|---:|---:|---:|---:|")
    details = []
    for mod in mods:
        data = SourceFileMutationData(path=Path(mod))
        data.load()
        counts = Counter(STATUS.get(code, "other") for code in data.exit_code_by_key.values())
        total = sum(counts.values())
        caught = counts["killed"] + counts["timeout"]
        score = f"{100 * caught / total:.1f} %" if total else "-"
        rows.append(
            f"| `{mod}` | {total} | {counts['killed']} | {counts['timeout']} | "
            f"{counts['survived']} | {counts['no tests']} | {score} |"
        )
        source = (ROOT / mod).read_text()
        lines, spans = source.splitlines(), function_lines(source)
        caught_statuses = ("killed", "timeout")
        left = [k for k, c in data.exit_code_by_key.items() if STATUS.get(c) not in caught_statuses]
        found = []
        for key in left:
            diff = get_diff_for_mutant(key, path=Path(mod))
            function = key.rpartition(".")[2].partition("__mutmut_")[0]
            line = mutant_line(diff, lines, spans.get(function, (1, len(lines))))
            status = STATUS.get(data.exit_code_by_key[key], "other")
            body = "\n".join(diff.splitlines()[2:])
            found.append((line, f"#### {mod}:{line} `{key}` ({status})\n\n```diff\n{body}\n```\n"))
        if found:
            details.append(f"### `{mod}`: {len(found)} left\n")
            details += [text for _, text in sorted(found)]
    summary = "\n".join(rows)
    text = (
        f"# Mutation testing report\n\nmutmut 3, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{seconds / 60:.1f} min. Tests: {', '.join(f'`{t}`' for t in tests)}.\n\n"
        "Score = (killed + timeout) / mutants.\n\n"
        f"{summary}\n\n## Surviving mutants\n\n" + ("\n".join(details) or "None.\n")
    )
    out.write_text(text)
    return summary


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run mutmut and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="*", default=[], help="modules or folders to mutate")
    parser.add_argument("--tests", nargs="*", default=[], help="test files (default: the map)")
    parser.add_argument("--max-children", type=int, default=1, help="test processes at once")
    parser.add_argument("--timeout-multiplier", type=float, default=3.0)
    parser.add_argument("--slow", action="store_true", help="run the tests marked slow too")
    parser.add_argument("--keep", action="store_true", help="reuse the results in mutants/")
    parser.add_argument("--report", default="mutants/report.md")
    parser.add_argument("--report-only", action="store_true", help="report the last run again")
    args = parser.parse_args(argv)

    mods = modules(args.paths or DEFAULT_PATHS)
    tests, mods = tests_for(mods, args.tests)
    print(f"mutating {len(mods)} modules against {' '.join(tests)}", flush=True)
    os.chdir(ROOT)
    if not (args.keep or args.report_only):
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    configure(mods, tests, args.timeout_multiplier, slow=args.slow)
    start = time.monotonic()
    if not args.report_only:
        run_mutmut(args.max_children)
    seconds = time.monotonic() - start
    summary = report(mods, tests, seconds, ROOT / args.report)
    print(f"\n{summary}\n\n{seconds / 60:.1f} min; surviving mutants with diffs: {args.report}")


if __name__ == "__main__":
    sys.exit(main())
