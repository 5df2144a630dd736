"""The epoch counter and the shared table under it, in one process and across processes."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import pytest

from shardpipes._core.epochs import EpochCounter
from shardpipes._core.shared import ROWS, SharedTable
from shardpipes._core.steps import batches


class TestEpochCounter:
    def test_every_keyless_iteration_is_the_next_epoch(self) -> None:
        """Iterated directly (no key), each begin is a new epoch, from the one set."""
        counter = EpochCounter(3)
        assert counter.current() == 3
        assert [counter.begin(None) for _ in range(3)] == [3, 4, 5]
        assert counter.current() == 5

    def test_one_key_is_one_iteration(self) -> None:
        """The workers of one iteration share its key: counted once; a new key is the next."""
        counter = EpochCounter()
        assert [counter.begin(7), counter.begin(7), counter.begin(7)] == [0, 0, 0]
        assert counter.begin(8) == 1
        assert counter.begin(8) == 1
        assert counter.begin(None) == 2

    def test_set_makes_the_next_iteration_that_epoch(self) -> None:
        """set(e) after some epochs: the next iteration is exactly e, then e + 1."""
        counter = EpochCounter()
        counter.begin(1)
        counter.begin(2)
        counter.set(10)
        assert counter.current() == 10
        assert counter.begin(2) == 10  # even under the last iteration's key
        assert counter.begin(3) == 11

    def test_resumed_epoch_counts_on(self) -> None:
        """An iteration that resumes epoch 6 is followed by epoch 7."""
        counter = EpochCounter()
        counter.begin(1)
        counter.resumed(6)
        assert counter.current() == 6
        assert counter.begin(2) == 7

    @pytest.mark.parametrize(
        "steps",
        [
            [],  # the first epoch: the one set at construction
            [("begin", 7)],
            [("begin", 7), ("begin", 8)],
            [("begin", None)],
            [("begin", 7), ("set", 10)],
            [("begin", 7), ("resumed", 6)],
        ],
    )
    @pytest.mark.parametrize("key", [None, 7, 8, 9])
    def test_peek_is_what_begin_would_give_and_counts_nothing(
        self, steps: list[tuple[str, int | None]], key: int | None
    ) -> None:
        counter = EpochCounter(2)
        for method, value in steps:
            getattr(counter, method)(value)
        before = counter.current()
        peeked = [counter.peek(key), counter.peek(key)]
        assert counter.current() == before  # nothing counted
        assert peeked == [counter.begin(key)] * 2

    def test_chosen_is_a_set_epoch_no_iteration_took_yet(self) -> None:
        counter = EpochCounter(3)
        assert counter.chosen() is None  # the constructor's first epoch: nobody chose it
        counter.set(5)
        assert counter.chosen() == 5
        assert counter.peek(1) == 5
        assert counter.chosen() == 5  # peek takes nothing
        assert counter.begin(1) == 5
        assert counter.chosen() is None
        counter.set(7)
        counter.resumed(6)  # a loaded state's epoch took the place of the choice
        assert counter.chosen() is None

    def test_a_copy_in_the_same_process_counts_alone(self) -> None:
        """A pickled copy (deepcopy, round trip) starts from the same cells, then diverges."""
        counter = EpochCounter(4)
        counter.begin(None)
        copy = pickle.loads(pickle.dumps(counter))
        assert copy.begin(None) == 5
        assert counter.begin(None) == 5


def _begin_after(counter: EpochCounter, key: int, barrier: Any, out: Any) -> None:
    barrier.wait()
    out.put(counter.begin(key))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_of_one_iteration_agree(method: str) -> None:
    """4 processes begin one iteration at once: one epoch for all, counted once, also in the parent."""
    ctx = multiprocessing.get_context(method)
    counter = EpochCounter(2)
    counter.begin(None)  # epoch 2 in the parent
    for key, expected in ((11, 3), (12, 4)):
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [
            ctx.Process(target=_begin_after, args=(counter, key, barrier, out)) for _ in range(4)
        ]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        assert got == [expected] * 4
        assert counter.current() == expected


class TestSharedTable:
    def test_cells_and_header(self) -> None:
        """Rows and the header row hold int64 cells; clear zeroes one row only."""
        table = SharedTable(3)
        table.set(0, 1, 2**62)
        table.add(5, 2, -4)
        table.set(ROWS, 0, 9)
        table.clear(0)
        assert (table.get(0, 1), table.get(5, 2), table.get(ROWS, 0)) == (0, -4, 9)

    def test_same_process_copy_is_independent(self) -> None:
        """A copy unpickled by its maker has the same cells in a segment of its own."""
        table = SharedTable(2)
        table.set(1, 1, 5)
        copy = pickle.loads(pickle.dumps(table))
        copy.set(1, 1, 6)
        assert (table.get(1, 1), copy.get(1, 1)) == (5, 6)


def test_batches_keep_order_and_the_short_last_one() -> None:
    """batches: size-n lists in order, the last shorter unless drop_last."""
    assert list(batches(range(7), 3, list)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batches(range(7), 3, tuple, drop_last=True)) == [(0, 1, 2), (3, 4, 5)]
    assert list(batches([], 3, list)) == []
