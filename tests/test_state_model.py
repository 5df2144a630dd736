"""Model-based randomized tests of resumption (issue 21 §6): pipelines drawn from the grammar.

Hypothesis draws a pipeline from the stages a user chains — ``split_shards`` (shuffled or
not, ``even``), ``open_tar``, ``shuffle_samples``, ``decode``, ``rename_fields`` /
``map_fields``, ``limit_samples``, ``cycle_epochs``, ``prefetch_items``, ``sp.mix`` (with
or without ``epoch_size``), torch's ``map``, ``batch`` and ``collate`` — a topology (1–3
ranks × 0–3 workers, played in one process with ``apply_sharding``, the numbering a
DataLoader gives ranks × workers) and stop points, and checks what the user is promised:

- an epoch delivers every sample once per pass (fewer than ranks × workers left out per
  pass with ``even``, whose ranks deliver as many items each);
- before + after a resume on the same topology = the uninterrupted epoch, item for item,
  also resumed twice in a row and in a later epoch;
- before + after ``sp.resume_from`` on another topology: nothing twice, at most old + new
  readers' worth left out with ``even``, nothing without.
- the same through the call users write, a ``StatefulDataLoader`` with 0–2 worker
  processes, its ``state_dict()`` loaded into a new one.

``make test`` runs a bounded number of examples; ``make fuzz-state`` runs
``SHARDPIPES_FUZZ_EXAMPLES`` of them (2,000 by default).
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import graph_settings
from torchdata.stateful_dataloader import StatefulDataLoader

import shardpipes as sp
from tests.conftest import sample_members, write_tar

SIZES = {"a": [7, 13, 5, 11], "b": [9, 4, 6]}  # uneven shards, 36 + 19 samples
EXAMPLES = int(os.environ.get("SHARDPIPES_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize="SHARDPIPES_FUZZ_EXAMPLES" not in os.environ,  # `make test`: the same draws
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Two sources of uneven shards; keys name their source (``a/s01/00004``)."""
    root = tmp_path_factory.mktemp("state-model")
    urls: dict[str, list[str]] = {}
    for name, sizes in SIZES.items():
        urls[name] = []
        for s, count in enumerate(sizes):
            members = [
                m
                for i in range(count)
                for m in sample_members(f"{name}/s{s:02d}/{i:05d}", i % 3, i, images=False)
            ]
            url = str(root / f"{name}-{s:06d}.tar")
            write_tar(url, members)
            urls[name].append(url)
    return urls


@dataclass(frozen=True)
class Spec:
    """One pipeline of the grammar (its repr is what hypothesis prints on a failure)."""

    shuffle: bool
    even: bool
    seed: int
    buffer: int  # 0: no shuffle_samples
    buffer_after_decode: bool
    decode: bool
    fields: str  # "none", "rename" or "map"
    mix: bool
    epoch_size: int | None  # the mix's
    limit: int | None
    cycle: bool  # cycle_epochs(2)
    limit_first: bool  # limit_samples before cycle_epochs (a limit per pass)
    prefetch: bool
    batch: int | None

    @property
    def passes(self) -> int:
        return 2 if self.cycle else 1


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    mix = draw(st.booleans())
    return Spec(
        shuffle=draw(st.booleans()),
        even=draw(st.booleans()),
        seed=draw(st.integers(0, 3)),
        buffer=draw(st.sampled_from([0, 0, 3, 10])),
        buffer_after_decode=draw(st.booleans()),
        decode=draw(st.booleans()),
        fields=draw(st.sampled_from(["none", "rename", "map"])),
        mix=mix,
        epoch_size=draw(st.sampled_from([None, 30, 70])) if mix else None,
        limit=draw(st.sampled_from([None, None, 12, 25])),
        cycle=draw(st.booleans()),
        limit_first=draw(st.booleans()),
        prefetch=draw(st.booleans()),
        batch=draw(st.sampled_from([None, 1, 4])),
    )


def key_of(sample: dict[str, Any]) -> str:
    return str(sample["__key__"])


def upper(text: Any) -> Any:
    return text.upper() if isinstance(text, str) else bytes(text).upper()


def source(urls: list[str], spec: Spec, seed: int) -> Any:
    pipe = sp.list_shards(urls).split_shards(shuffle=spec.shuffle, seed=seed, even=spec.even)
    pipe = pipe.open_tar()
    if spec.buffer and not spec.buffer_after_decode:
        pipe = pipe.shuffle_samples(buffer_size=spec.buffer, seed=seed)
    if spec.decode:
        pipe = pipe.decode()
    if spec.buffer and spec.buffer_after_decode:
        pipe = pipe.shuffle_samples(buffer_size=spec.buffer, seed=seed)
    return pipe


def build(spec: Spec, shards: dict[str, list[str]]) -> Any:
    """The pipeline of ``spec``: items are keys (strings) or lists of keys."""
    if spec.mix:
        sources = {
            name: source(urls, spec, spec.seed + i) for i, (name, urls) in enumerate(shards.items())
        }
        pipe = sp.mix(sources, weights={"a": 2, "b": 1}, seed=spec.seed, epoch_size=spec.epoch_size)
    else:
        pipe = source(shards["a"], spec, spec.seed)
    if spec.fields == "rename":
        pipe = pipe.rename_fields(text="txt")
    elif spec.fields == "map":
        pipe = pipe.map_fields(txt=upper)
    stages = ["limit", "cycle"] if spec.limit_first else ["cycle", "limit"]
    for stage in stages:
        if stage == "limit" and spec.limit is not None:
            pipe = pipe.limit_samples(spec.limit)
        if stage == "cycle" and spec.cycle:
            pipe = pipe.cycle_epochs(2)
    if spec.prefetch:
        pipe = pipe.prefetch_items(2)
    pipe = pipe.map(key_of)
    if spec.batch:
        pipe = pipe.batch(spec.batch).collate()
    return pipe


def flatten(items: list[Any]) -> list[str]:
    return [key for item in items for key in (item if isinstance(item, list) else [item])]


class Job:
    """``ranks`` × ``workers`` readers of one pipeline, each a pipe of its own."""

    def __init__(self, spec: Spec, shards: dict[str, list[str]], ranks: int, workers: int) -> None:
        self.spec, self.shards = spec, shards
        self.ranks, self.per_rank = ranks, max(workers, 1)
        self.total = ranks * self.per_rank

    def reader(self, index: int, *, epoch: int = 0, state: Any = None, elastic: Any = None) -> Any:
        chain = build(self.spec, self.shards)
        pipe = sp.Resumable(chain) if elastic is None else sp.resume_from(chain, elastic)
        graph_settings.apply_sharding(pipe, self.total, index)
        if elastic is None:  # the rest of the state's epoch
            pipe.set_epoch(epoch)
        if state is not None:
            pipe.load_state_dict(state)
        return pipe

    def epoch(self, epoch: int = 0) -> list[list[Any]]:
        """Every reader's items of one uninterrupted epoch."""
        return [list(self.reader(i, epoch=epoch)) for i in range(self.total)]


def take(pipe: Any, count: int) -> tuple[list[Any], Any]:
    """The first ``count`` items of a new iteration of ``pipe``, and the state after them."""
    it: Iterator[Any] = iter(pipe)
    items = list(itertools.islice(it, count))
    state = pipe.state_dict()
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return items, state


def every_key(spec: Spec, shards: dict[str, list[str]]) -> list[str]:
    names = ["a", "b"] if spec.mix else ["a"]
    return [
        f"{name}/s{s:02d}/{i:05d}"
        for name in names
        for s, count in enumerate(SIZES[name])
        for i in range(count)
    ]


def quota(n: int, spec: Spec, job: Job, reader: int) -> int:
    """A reader's share of ``n`` (a limit, an epoch size): ``n // T`` with even."""
    return n // job.total if spec.even else n // job.total + (reader < n % job.total)


def check_epoch(
    spec: Spec, job: Job, readers: list[list[Any]], keys: list[str], epoch: int
) -> None:
    """What one uninterrupted epoch promises, whatever the stages."""
    got = Counter(flatten([item for items in readers for item in items]))
    counts = [len(flatten(items)) for items in readers]
    assert set(got) <= set(keys)
    if spec.even:  # DDP: every reader delivers as many samples
        assert len(set(counts)) == 1, counts
    if spec.epoch_size is None:  # a set of samples, once per pass
        assert max(got.values(), default=0) <= spec.passes
    if spec.limit is None:
        if spec.epoch_size is not None:
            drawn = [quota(spec.epoch_size, spec, job, r) * spec.passes for r in range(job.total)]
            assert counts == drawn
        elif spec.even:  # fewer than T samples left out per pass
            assert len(keys) - len(set(got)) < job.total
            assert (len(keys) - job.total) * spec.passes < sum(counts) <= len(keys) * spec.passes
        else:
            assert sorted(got.elements()) == sorted(keys * spec.passes)
        return
    if spec.limit_first and spec.cycle:  # a limit per pass: at most a share of it each pass
        assert all(c <= 2 * quota(spec.limit, spec, job, r) for r, c in enumerate(counts))
        return
    # the limit cuts each reader's stream at its share, or the stream runs out first
    whole = Job(replace(spec, limit=None), job.shards, job.ranks, job.per_rank).epoch(epoch)
    wanted = [
        min(quota(spec.limit, spec, job, r), len(flatten(items))) for r, items in enumerate(whole)
    ]
    assert counts == wanted
    for items, full in zip(readers, whole, strict=True):  # the first items of the unlimited stream
        assert flatten(items) == flatten(full)[: len(flatten(items))]


@given(spec=specs(), ranks=st.integers(1, 3), workers=st.integers(0, 3), data=st.data())
@FUZZ
def test_resume_on_the_same_topology(
    shards: dict[str, list[str]], spec: Spec, ranks: int, workers: int, data: st.DataObject
) -> None:
    """Each reader stopped anywhere, saved, resumed (twice, in epoch 0 or 1) = the epoch."""
    job = Job(spec, shards, ranks, workers)
    epoch = data.draw(st.integers(0, 1), label="epoch")
    full = job.epoch(epoch)
    check_epoch(spec, job, full, every_key(spec, shards), epoch)
    for index, items in enumerate(full):
        first = data.draw(st.integers(0, len(items)), label=f"stop of reader {index}")
        head, state = take(job.reader(index, epoch=epoch), first)
        second = data.draw(st.integers(0, len(items) - first), label="second stop")
        mid, state = take(job.reader(index, epoch=epoch, state=state), second)
        rest = list(job.reader(index, epoch=epoch, state=state))
        assert head + mid + rest == items


topologies = st.tuples(st.integers(1, 3), st.integers(0, 3))


@given(spec=specs(), topologies=st.lists(topologies, min_size=2, max_size=3), data=st.data())
@FUZZ
def test_resume_on_other_topologies(
    shards: dict[str, list[str]],
    spec: Spec,
    topologies: list[tuple[int, int]],
    data: st.DataObject,
) -> None:
    """Stopped, resumed with ``sp.resume_from`` elsewhere (and again): nothing twice.

    Every reader's state is given (with ``even``, sometimes one rank's alone, as DDP
    saves); with ``even`` at most old + new readers' worth per pass is left out, and each
    new reader delivers as many; without it, nothing is.
    """
    epoch = data.draw(st.integers(0, 1), label="epoch")
    jobs = [Job(spec, shards, ranks, workers) for ranks, workers in topologies]
    full = jobs[0].epoch(epoch)
    seen: list[str] = []
    states: Any = None
    readers = 0
    for n, job in enumerate(jobs):
        last = n == len(jobs) - 1
        runs, saved = [], []
        if not last and spec.even and job.per_rank == 1:  # ranks step together (DDP)
            runs = [data.draw(st.integers(0, min(map(len, full)) + 2), label="stop")] * job.total
        for index in range(job.total):
            pipe = job.reader(index, epoch=epoch, elastic=states)
            if last:
                items = list(pipe)
                runs.append(len(flatten(items)))
            else:
                stop = (
                    runs[index]
                    if index < len(runs)
                    else data.draw(st.integers(0, 60), label="stop")
                )
                items, state = take(pipe, stop)
                saved.append(state)
            seen += flatten(items)
        states = saved
        if not last and spec.even and job.per_rank == 1 and data.draw(st.booleans(), label="one"):
            states = saved[data.draw(st.integers(0, job.total - 1), label="rank")]
        readers += job.total
    got = Counter(seen)
    keys = every_key(spec, shards)
    assert set(got) <= set(keys)
    if spec.epoch_size is None:
        assert max(got.values()) <= spec.passes, [k for k, c in got.items() if c > spec.passes]
    if spec.even:
        assert len(set(runs)) == 1, runs  # the last topology's readers
    if spec.limit is None and spec.epoch_size is None:
        lost = len(keys) * spec.passes - len(seen)
        assert 0 <= lost <= (readers if spec.even else 0) * spec.passes


def loader_items(loader: Any) -> list[Any]:
    return [item if isinstance(item, str) else list(item) for item in loader]


@pytest.mark.slow
@given(spec=specs(), workers=st.integers(0, 2), data=st.data())
@settings(FUZZ, max_examples=max(EXAMPLES // 4, 3))
def test_resume_with_the_plain_stateful_dataloader(
    shards: dict[str, list[str]], spec: Spec, workers: int, data: st.DataObject
) -> None:
    """``StatefulDataLoader(pipe)``, the call users write, stopped anywhere: the same epoch.

    With worker processes; ``state_dict()`` into a new loader's ``load_state_dict()``.
    """

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(build(spec, shards), batch_size=None, num_workers=workers)

    whole = loader_items(loader())
    readers = Job(spec, shards, 1, workers).epoch(0)  # the loader deals items round-robin
    assert sorted(flatten(whole)) == sorted(flatten([i for items in readers for i in items]))
    stop = data.draw(st.integers(0, len(whole)), label="stop")
    first = loader()
    head = loader_items(itertools.islice(first, stop)) if stop else []
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert head + loader_items(second) == whole


# --- what the draws found, pinned ---------------------------------------------------------

PLAIN = Spec(
    shuffle=False,
    even=False,
    seed=0,
    buffer=0,
    buffer_after_decode=False,
    decode=False,
    fields="none",
    mix=False,
    epoch_size=None,
    limit=None,
    cycle=False,
    limit_first=False,
    prefetch=False,
    batch=None,
)


def test_a_state_saved_again_in_the_next_pass_resumes_that_pass(
    shards: dict[str, list[str]],
) -> None:
    """Saved at the end of epoch 1's first pass, resumed, saved one item into the second.

    A split's loaded state is of the pass it was saved in: the second pass starts fresh
    (it resumed in the first pass's order).
    """
    job = Job(replace(PLAIN, buffer=3, mix=True, cycle=True), shards, 1, 0)
    (items,) = job.epoch(1)
    head, state = take(job.reader(0, epoch=1), len(items) // 2)
    mid, state = take(job.reader(0, epoch=1, state=state), 1)
    assert head + mid + list(job.reader(0, epoch=1, state=state)) == items


@pytest.mark.parametrize("stops", [[1, 1], [2, 3], [3, 1]])
def test_resume_from_a_resumed_rest_counts_batches_as_batches(
    shards: dict[str, list[str]], stops: list[int]
) -> None:
    """``resume_from`` a state saved in an earlier ``resume_from``'s rest, with ``batch``.

    The rest's ``done`` counts batches: it was taken for samples, and samples came twice.
    """
    job = Job(replace(PLAIN, batch=4), shards, 1, 0)
    seen: list[str] = []
    states = None
    for stop in stops:
        items, state = take(job.reader(0, elastic=states), stop)
        seen += flatten(items)
        states = [state]
    seen += flatten(list(job.reader(0, elastic=states)))
    assert sorted(seen) == sorted(every_key(PLAIN, shards))
