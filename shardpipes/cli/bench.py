"""The logic of ``shardpipes bench``: where the time goes between storage and batches.

Each stage is its own pass over the same shards, through a real ``DataLoader`` with
``batch_size=None`` and the given number of workers, so the numbers include start-up and
worker parallelism. Each pass runs the pipeline up to one more stage than the last:

* ``read``: the raw bytes of each shard through :func:`shardpipes.fs.open_input`, in 1 MiB
  reads, split across workers by ``split_shards`` (parts of a shard by byte range);
* ``tar``: ``split_shards().open_tar()``; MB/s counts the bytes of the members;
* ``decode``: then ``decode(image)``;
* ``batch``: then ``batch(batch_size).collate(...)`` with :func:`collate_ragged`, so images
  of different sizes stay a list instead of failing the stage.

Workers of the first three stages send the main process one small ``(samples, bytes,
span)`` tally per ``batch_size`` samples (and one for the first sample, which times it), so
no stage pays for moving samples between processes that a real pipeline would not; the
``batch`` stage sends the real batches, as a training loop gets them.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from torch.utils.data import DataLoader, IterDataPipe
from torch.utils.data.datapipes.iter import Batcher, Collator, IterableWrapper

from shardpipes import fs
from shardpipes._core.handlers import check_handler
from shardpipes._core.images import check_image_mode
from shardpipes._core.policy import ErrorPolicy
from shardpipes._core.split import ShardPart
from shardpipes.cli.bench_report import StageResult
from shardpipes.errors import NoShardsError
from shardpipes.pipes.collate import collate_samples
from shardpipes.pipes.decode import SampleDecoder
from shardpipes.pipes.shards import ShardLister
from shardpipes.pipes.split import ShardSplitter
from shardpipes.pipes.tar import TarOpener

STAGES = ("read", "tar", "decode", "batch")
_CHUNK = 1 << 20
_BLOCK = 512
_WRAPPED = re.compile(r"Caught (\w+) in DataLoader worker process \d+\.\nOriginal Traceback")
_SUFFIX = "\nThis exception is thrown by __iter__ of"  # torch's, with the pipe's arguments


class CollateError(ValueError):
    """A batch that :func:`collate_ragged` cannot collate; fails the ``batch`` stage only."""


class _ShardByteCounter(IterDataPipe[tuple[int, int, int]]):
    """Read shards (or byte-range parts of them) raw; yield ``(0, bytes, bytes)`` per read."""

    def __init__(
        self, source_datapipe: IterDataPipe[ShardPart], *, storage_options: Mapping[str, Any]
    ) -> None:
        self.source_datapipe = source_datapipe
        self._options = dict(storage_options)  # not `storage_options`: torch prints those

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        for url, part, parts, *_ in self.source_datapipe:
            start, left = 0, sys.maxsize  # the whole shard, in 1 MiB reads
            if parts > 1:
                size = fs.size(url, self._options)
                start = size * part // parts
                left = size * (part + 1) // parts - start
            with fs.open_input(url, self._options) as f:
                if start:
                    f.seek(start)
                while left > 0:
                    n = len(f.read(min(_CHUNK, left)))
                    if not n:
                        break
                    left -= n
                    yield 0, n, n


class _SampleCounter(IterDataPipe[tuple[int, int, int]]):
    """Count samples: yield ``(samples, member bytes, span)`` after the first and every ``every``.

    ``span`` estimates the shard bytes the samples take: each member padded to 512-byte
    blocks, plus its header.
    """

    def __init__(self, source_datapipe: IterDataPipe[dict[str, Any]], *, every: int) -> None:
        self.source_datapipe = source_datapipe
        self.every = every

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        samples = nbytes = span = 0
        first = True
        for sample in self.source_datapipe:
            sizes = [
                len(v) for k, v in sample.items() if not k.startswith("__") and isinstance(v, bytes)
            ]
            samples, nbytes = samples + 1, nbytes + sum(sizes)
            span += sum(_BLOCK + -(-n // _BLOCK) * _BLOCK for n in sizes)
            if first or samples >= self.every:
                yield samples, nbytes, span
                samples = nbytes = span = 0
                first = False
        if samples:
            yield samples, nbytes, span


def _shape(value: Any) -> Any:
    if hasattr(value, "shape"):
        return tuple(value.shape)
    if hasattr(value, "size") and hasattr(value, "mode"):  # a PIL image
        return value.mode, value.size
    return None


def collate_ragged(batch: Sequence[dict[str, Any]]) -> Any:
    """Collate dict samples as ``collate_samples`` does, leaving ragged fields as lists.

    A field whose values (images, arrays, tensors) differ in shape within the batch is
    kept as the list of its values instead of failing to stack; only the fields every
    sample has are kept (a mix of ``jpg`` and ``png`` samples keeps ``cls``).

    Raises:
        CollateError: The batch cannot be collated otherwise.
    """
    try:
        common = set(batch[0]).intersection(*batch[1:])
        batch = [{k: v for k, v in s.items() if k in common} for s in batch]
        ragged = {k for k in batch[0] if len({_shape(s[k]) for s in batch}) > 1}
        out = collate_samples([{k: v for k, v in s.items() if k not in ragged} for s in batch])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        msg = f"cannot collate a batch: {exc or type(exc).__name__}"
        raise CollateError(msg) from exc
    out.update({k: [s[k] for s in batch] for k in ragged})
    return out


def run_bench(
    urls: str | Sequence[str],
    *,
    workers: int = 2,
    batch_size: int = 64,
    image: str = "torch",
    storage_options: Mapping[str, Any] | None = None,
    max_samples: int | None = None,
    progress: bool | None = None,
    handler: str = "raise",
) -> list[StageResult]:
    """Run the four stages over the shards at ``urls``; return what each did, in order.

    Args:
        urls: Shard URLs, brace patterns or globs, as for ``list_shards``; listed once,
            here (``.idx`` sidecars that a glob matches are left out).
        workers: ``DataLoader`` worker processes (0 runs each stage in this process).
        batch_size: Samples per batch in the ``batch`` stage; the other stages report
            their counts to the main process once per as many samples.
        image: How ``decode`` decodes images: ``"pil"``, ``"numpy"``, ``"torch"``, ``"bytes"``.
        storage_options: Passed to the fsspec filesystem; never printed.
        max_samples: Stop each stage once this many samples have arrived (it may overrun
            by up to a batch); the ``read`` stage then runs after ``tar`` and stops after
            about as many shard bytes as those samples took.
        progress: Show a progress bar per stage on stderr: ``None`` when it is a terminal.
        handler: What the stages do with bad members and samples: ``"raise"``, ``"warn"``
            or ``"ignore"`` (each result's ``stats`` counts what was skipped).

    Returns:
        One :class:`StageResult` per stage of :data:`STAGES`. A batch that cannot be
        collated fails the ``batch`` stage only (its ``error``); other errors raise.

    Raises:
        ValueError: For a bad argument.
        NoShardsError: If the pattern matches no shard.
        ShardNotFoundError: If a shard is missing (and other data errors).

    Example:
        >>> import io, tarfile, fsspec
        >>> with fsspec.open("memory://bench/s-0.tar", "wb") as f:
        ...     with tarfile.open(fileobj=f, mode="w") as tar:
        ...         for i in range(3):
        ...             info = tarfile.TarInfo(f"k{i}.cls"); info.size = 1
        ...             tar.addfile(info, io.BytesIO(b"1"))
        >>> results = run_bench("memory://bench/s-0.tar", workers=0, progress=False)
        >>> [(r.stage, r.samples) for r in results]
        [('read', None), ('tar', 3), ('decode', 3), ('batch', 3)]
    """
    _check("workers", workers, 0)
    _check("batch_size", batch_size, 1)
    if max_samples is not None:
        _check("max_samples", max_samples, 1)
    image = check_image_mode(image)
    check_handler(handler)
    options = dict(storage_options or {})
    shards = _guard(partial(_list, urls, options))
    results: dict[str, StageResult] = {}
    span: int | None = None  # shard bytes the tar stage read, when max_samples stopped it
    for stage in ("tar", "read", "decode", "batch") if max_samples else STAGES:
        tar = results.get("tar")
        total = tar.samples if stage in ("decode", "batch") and tar else None
        meter = _Meter(stage, cap=span if stage == "read" else max_samples)
        policy = ErrorPolicy(handler)
        pipe = _pipe(stage, shards, options, image=image, batch_size=batch_size, policy=policy)
        result = _guard(partial(_measure, pipe, meter, workers, total, progress))
        if stage != "read" and result.error is None:
            result = replace(result, stats=asdict(policy.stats()))
        results[stage] = result
        if stage == "tar" and result.capped:
            span = meter.span
    return [results[stage] for stage in STAGES]


def _check(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive" if minimum else "a non-negative"
        msg = f"{name} must be {kind} integer (got {value!r})"
        raise ValueError(msg)


def _list(urls: str | Sequence[str], options: Mapping[str, Any]) -> list[str]:
    shards = [u for u in ShardLister(urls, storage_options=options) if not u.endswith(".idx")]
    if not shards:
        msg = "no shard matches the pattern"
        raise NoShardsError(msg, url=urls if isinstance(urls, str) else ", ".join(urls))
    return shards


def _pipe(
    stage: str,
    shards: list[str],
    options: dict[str, Any],
    *,
    image: str,
    batch_size: int,
    policy: ErrorPolicy,
) -> IterDataPipe[Any]:
    """The pipeline up to ``stage``, ending in a counter (or in the batches)."""
    parts = ShardSplitter(IterableWrapper(shards))
    if stage == "read":
        return _ShardByteCounter(parts, storage_options=options)
    samples: IterDataPipe[dict[str, Any]] = TarOpener(
        parts, storage_options=options, handler=policy
    )
    if stage != "tar":
        samples = SampleDecoder(samples, image, handler=policy)
    if stage != "batch":
        return _SampleCounter(samples, every=batch_size)
    return Collator(Batcher(samples, batch_size), collate_fn=collate_ragged)


@dataclass
class _Meter:
    """Counts of one stage as items arrive; ``full`` once ``cap`` (samples or bytes) is met."""

    stage: str
    cap: int | None = None
    samples: int = 0
    nbytes: int = 0
    span: int = 0
    ragged: bool = False

    def add(self, item: Any) -> int:
        """Count one item from the DataLoader; return what the progress bar advances by."""
        if self.stage == "batch":
            self.samples += len(item["__key__"])
            self.ragged = self.ragged or any(_is_list_of_arrays(v) for v in item.values())
            return len(item["__key__"])
        samples, nbytes, span = item
        self.samples, self.nbytes, self.span = (
            self.samples + samples, self.nbytes + nbytes, self.span + span
        )  # fmt: skip
        return int(nbytes if self.stage == "read" else samples)

    @property
    def full(self) -> bool:
        """Whether the stage has counted ``cap`` samples (bytes for ``read``)."""
        done = self.nbytes if self.stage == "read" else self.samples
        return self.cap is not None and done >= self.cap


def _is_list_of_arrays(value: object) -> bool:
    return isinstance(value, list) and bool(value) and _shape(value[0]) is not None


def _measure(
    pipe: IterDataPipe[Any], meter: _Meter, workers: int, total: int | None, progress: bool | None
) -> StageResult:
    """Run one stage through a DataLoader, feeding ``meter`` and a progress bar."""
    from tqdm import tqdm

    unit = {"unit": "B", "unit_divisor": 1024} if meter.stage == "read" else {"unit": "sample"}
    disable = None if progress is None else not progress  # None: off unless a terminal
    bar = tqdm(total=meter.cap or total, desc=f"{meter.stage:<6}", file=sys.stderr,
               unit_scale=True, disable=disable, **unit)  # fmt: skip
    first = None
    with bar:
        start = time.perf_counter()
        it = iter(DataLoader(pipe, batch_size=None, num_workers=workers))
        try:
            for item in it:
                first = time.perf_counter() - start if first is None else first
                bar.update(meter.add(item))
                if meter.full:
                    break
            seconds = time.perf_counter() - start
        finally:
            del it  # shuts the workers down, also when stopping early
    read = meter.stage == "read"
    return StageResult(meter.stage, seconds, None if read else meter.samples,
                       meter.nbytes if meter.stage in ("read", "tar") else None,
                       first, meter.full, meter.ragged)  # fmt: skip


def _guard(run: Callable[[], Any]) -> Any:
    """Call ``run``; turn a collate failure into a failed result, and unwrap worker errors."""
    try:
        return run()
    except CollateError as exc:
        return StageResult("batch", 0.0, error=_message(exc))
    except Exception as exc:
        message = _message(exc)
        if message == str(exc):
            raise
        try:
            clean = type(exc)(message)
        except Exception:
            clean = RuntimeError(message)
        raise clean from exc


def _message(exc: BaseException) -> str:
    """The message of ``exc`` without torch's additions: the worker's traceback, the pipe."""
    text = str(exc)
    found = _WRAPPED.match(text)
    if found:
        lines = text.splitlines()
        for i in range(len(lines) - 1, -1, -1):
            head, sep, rest = lines[i].partition(": ")
            if sep and head.rsplit(".", 1)[-1] == found.group(1):
                text = "\n".join([rest, *lines[i + 1 :]])
                break
    return text.split(_SUFFIX, 1)[0].strip()
