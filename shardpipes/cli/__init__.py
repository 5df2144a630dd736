"""The ``shardpipes`` command: write, index, inspect and benchmark shards; recipes; a demo.

Run ``shardpipes --help`` or ``shardpipes COMMAND --help``. Errors print one line,
``shardpipes: error: <message>``, and exit 2 (bad usage) or 1 (anything else: bad data, a
missing shard, refused credentials, an unreachable storage); ``--debug`` adds the
traceback, and a log line for each retry of a storage call.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardpipes._core.images import IMAGE_MODES
from shardpipes._core.writer import check_pattern, parse_size
from shardpipes.cli.common import UsageError, counted
from shardpipes.cli.write import write_command
from shardpipes.errors import DecodeError, ShardpipesError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _positive(text: str, minimum: int = 1) -> int:
    if not text.isdigit() or int(text) < minimum:
        kind = "a positive" if minimum else "a non-negative"
        msg = f"must be {kind} integer (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def _natural(text: str) -> int:
    return _positive(text, 0)


def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so that argparse reports its ``ValueError`` message as it is."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return wrapped


def _option(text: str) -> tuple[str, Any]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        msg = f"storage option must look like key=value (got {text!r})"
        raise argparse.ArgumentTypeError(msg)
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardpipes", description="Write, index, inspect and stream tar shards.")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks on errors, and each retry")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    so = _Parser(add_help=False)
    so.add_argument("--storage-option", "-o", dest="storage_options", type=_option,
                    action="append", default=[], metavar="KEY=VALUE",
                    help="fsspec option, repeatable (VALUE parsed as JSON if it can)")  # fmt: skip
    demo = sub.add_parser("demo", help="make a small image dataset and stream it with tar_shards")
    demo.set_defaults(run=_demo)
    demo.add_argument("--samples", type=_positive, default=512, help="images (default 512)")
    demo.add_argument("--shards", type=_positive, default=8, help="shards (default 8)")
    demo.add_argument("--workers", type=_natural, default=2, help="DataLoader workers (default 2)")
    demo.add_argument("--cache", help="dataset folder (default ~/.cache/shardpipes/demo)")
    sub.add_parser("recipes", help="list the prebuilt recipes").set_defaults(run=_recipes)
    write = sub.add_parser("write", parents=[so], help="write an image folder as tar shards")
    write.set_defaults(run=write_command)
    write.add_argument("src", help="folder with one sub-folder per class (any fsspec URL)")
    write.add_argument(
        "out", type=_arg(check_pattern), help="shard URL pattern, e.g. out/train-%%06d.tar"
    )
    limit = write.add_mutually_exclusive_group()
    limit.add_argument("--shard-size", type=_arg(parse_size), help="max shard size (256MB, 1GiB…)")
    limit.add_argument("--samples-per-shard", type=_positive, help="max samples per shard")
    write.add_argument("--shuffle", action="store_true",
                       help="shuffle the samples across all shards (see --seed)")  # fmt: skip
    write.add_argument("--seed", type=int, help="seed of --shuffle (default 0)")
    labels = write.add_mutually_exclusive_group()
    labels.add_argument("--classes", metavar="URL",
                        help="label by this class list: the classes.json written beside other "
                             "shards (e.g. train's), or a text file of one name per line; "
                             "default: the class list of another split written beside OUT, "
                             "else the class folders, sorted")  # fmt: skip
    labels.add_argument("--new-classes", action="store_true",
                        help="label by the class folders even when another split's class "
                             "list is beside OUT")  # fmt: skip
    write.add_argument("--handler", choices=("raise", "warn", "ignore"), default="raise",
                       help="an image that does not decode: stop (default), or skip it "
                            "(warn: naming it)")  # fmt: skip
    write.add_argument("--no-check", dest="check", action="store_false",
                       help="do not decode each image to check it (faster)")  # fmt: skip
    write.add_argument("--no-index", dest="index", action="store_false",
                       help="do not write the URL.idx sidecar of each shard")  # fmt: skip
    write.add_argument("--overwrite", action="store_true",
                       help="remove the shards that already match the pattern first")  # fmt: skip
    index = sub.add_parser("index", parents=[so], help="write URL.idx sidecar indexes")
    index.set_defaults(run=_index)
    index.add_argument("urls", nargs="+", metavar="URL", help="shard URLs, brace patterns, globs")
    _add_progress(index)
    inspect = sub.add_parser("inspect", parents=[so], help="count shards, samples, extensions")
    inspect.set_defaults(run=_inspect)
    inspect.add_argument("url", metavar="URL", help="shard URL, brace pattern or glob")
    inspect.add_argument("--check", action="store_true",
                         help="read every member, decode every one (images included), list "
                              "the bad ones; exit 1 if any")  # fmt: skip
    _add_progress(inspect)
    _add_bench(sub, so)
    return parser


def _add_bench(sub: Any, so: argparse.ArgumentParser) -> None:
    bench = sub.add_parser("bench", parents=[so], help="measure read, tar, decode, batch speed")
    bench.set_defaults(run=_bench)
    bench.add_argument("url", metavar="URL", help="shard URL, brace pattern or glob")
    bench.add_argument("--workers", type=_natural, default=2, help="DataLoader workers (default 2)")
    bench.add_argument("--batch-size", type=_positive, default=64, help="batch size (default 64)")
    bench.add_argument("--max-samples", type=_positive, help="stop each stage after N samples")
    bench.add_argument("--image", choices=IMAGE_MODES, default="torch",
                       help="decode images as (default torch)")  # fmt: skip
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument("--handler", choices=("raise", "warn", "ignore"), default="raise",
                       help="bad members/samples: stop (default), or skip and count")  # fmt: skip
    _add_progress(bench)


def _add_progress(command: argparse.ArgumentParser) -> None:
    shown = "progress bars on stderr (default: when it is a terminal)"
    command.add_argument("--progress", action=argparse.BooleanOptionalAction, help=shown)


def _bar(args: argparse.Namespace, items: Sequence[Any], what: str) -> Any:
    """``items`` with a progress bar on stderr, per ``--progress`` (else if it is a terminal)."""
    from tqdm import tqdm

    shown = args.progress if args.progress is not None else sys.stderr.isatty()
    return tqdm(items, unit="shard", desc=what, file=sys.stderr, disable=not shown, leave=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shardpipes`` command with ``argv`` (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 for bad data, 2 for bad usage, 130 on Ctrl-C.
    """
    debug = False
    quiet = logging.NullHandler()  # no retry warnings on stderr: the error line says it
    log = logging.getLogger("shardpipes")
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
        debug = args.debug
        if not debug:
            log.addHandler(quiet)
        return int(args.run(args))
    except UsageError as exc:
        return _fail(exc, 2, debug=False)  # argparse's own traceback would tell nothing
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line for every error, a backend's own included
        return _fail(exc, 1, debug=debug)
    finally:
        log.removeHandler(quiet)


_TORCH_SUFFIX = "\nThis exception is thrown by __iter__ of "
_OWN = (ShardpipesError, OSError, ValueError, ImportError, UsageError)  # messages that say it all


def _fail(exc: BaseException, status: int, *, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    # torch appends the pipe, storage_options (credentials) included: not on the one line
    message = str(exc).split(_TORCH_SUFFIX)[0] or type(exc).__name__
    if not isinstance(exc, _OWN):
        message = f"{type(exc).__name__}: {message}"
    print(f"shardpipes: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def _recipes(args: argparse.Namespace) -> int:
    from shardpipes import recipes

    summaries = recipes.describe()
    width = max(map(len, summaries))
    for name, summary in summaries.items():
        print(f"{name:<{width}}  {summary}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from shardpipes.pipes.index import write_index
    from shardpipes.pipes.shards import ShardLister

    options = dict(args.storage_options)
    urls = [u for u in ShardLister(args.urls, storage_options=options) if not u.endswith(".idx")]
    for url in _bar(args, urls, "index"):
        target, count = write_index(url, storage_options=options)
        print(f"{target}\t{counted(count, 'sample')}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from shardpipes._core.decoders import decode_field
    from shardpipes._core.policy import ErrorPolicy, reason
    from shardpipes.pipes.decode import decoder_table
    from shardpipes.pipes.reader import ReadOptions, ShardReader
    from shardpipes.pipes.shards import ShardLister

    options = dict(args.storage_options)
    urls = [u for u in ShardLister(args.url, storage_options=options) if not u.endswith(".idx")]
    bad: list[BaseException] = []

    def record(exc: BaseException, context: dict[str, Any]) -> bool:
        bad.append(exc)
        return True  # skip it, and go on

    policy = ErrorPolicy(record if args.check else "raise")
    policy.begin()
    reader = ShardReader(options=ReadOptions(storage_options=options, handler=policy))
    table = decoder_table("pil")
    counts, sizes = Counter[str](), defaultdict[str, int](int)
    for url in _bar(args, urls, "inspect"):
        for sample in reader.samples(url):
            for ext, data in sample.items():
                if ext.startswith("__"):
                    continue
                counts[ext] += 1
                sizes[ext] += len(data)
                if args.check:
                    try:
                        decode_field(sample, ext, table)
                    except DecodeError as exc:
                        policy.handle(exc, stage="decode", url=exc.url, member=exc.member)
    stats = policy.stats()
    print(f"shards: {len(urls)}\nsamples: {stats.read}")
    print(f"{'extension':<12}{'count':>10}{'total bytes':>16}{'mean bytes':>14}")
    for ext in sorted(counts):
        print(f"{ext:<12}{counts[ext]:>10}{sizes[ext]:>16}{sizes[ext] / counts[ext]:>14.1f}")
    if not args.check:
        return 0
    print(f"checked: {stats}")
    if not bad:
        print("no bad members")
        return 0
    print(f"bad: {len(bad)}\n{'reason':<14}{'offset':>12}  url  member  problem")
    for error in bad:
        where = getattr(error, "offset", None)
        shard, member = getattr(error, "url", None), getattr(error, "member", None)
        problem = " ".join(str(getattr(error, "problem", error)).split())
        print(f"{reason(error):<14}{'-' if where is None else where:>12}  {shard}  "
              f"{member or '-'}  {problem}")  # fmt: skip
    return 1


def _demo(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from shardpipes import _demo as demo

    cache = args.cache or demo.default_cache()
    data = demo.ensure_dataset(cache, samples=args.samples, shards=args.shards)
    urls = [os.path.join(data["folder"], name) for name, _, _ in data["shards"]]
    how = "reused" if data["reused"] else "wrote"
    images, shards = counted(data["samples"], "image"), counted(len(urls), "shard")
    print(f"{how} {images} in {shards}: {data['folder']}")
    expected = demo.reference(urls)
    start = time.perf_counter()
    with tqdm(total=data["samples"], unit="img", desc="read", file=sys.stderr) as bar:
        seen, labels = demo.stream(urls, workers=args.workers, progress=bar.update)
    elapsed = time.perf_counter() - start
    rate = labels.total() / elapsed
    workers = counted(args.workers, "worker")
    print(f"read {counted(labels.total(), 'sample')} with {workers}: {rate:.0f} samples/s")
    once = demo.exactly_once(data, expected, seen, labels)
    print(f"exactly once: {'yes' if once else 'no'}")
    return 0 if once else 1


def _bench(args: argparse.Namespace) -> int:
    from shardpipes.cli import bench, bench_report

    results = bench.run_bench(
        args.url, workers=args.workers, batch_size=args.batch_size, image=args.image,
        storage_options=dict(args.storage_options), max_samples=args.max_samples,
        progress=args.progress, handler=args.handler,
    )  # fmt: skip
    print(
        json.dumps(bench_report.to_json(results), indent=2)
        if args.json
        else bench_report.format_table(results)
    )
    failed = next((r for r in results if r.error is not None), None)
    if failed is None:
        return 0
    return _fail(ValueError(f"{failed.stage} stage: {failed.error}"), 1, debug=False)
