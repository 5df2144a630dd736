"""The error policy: one handler for every stage, an error budget, and counters.

The counters are summed over DataLoader workers (fork and spawn), readable after the epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import shardpipes as sp
from tests.hostile.corpus import DECODE_CASES, END, KEYS, TAR_CASES, samples

pytestmark = pytest.mark.timeout(120)

GOOD = 4  # good shards of 10 samples each


def bucket(
    tmp_path: Path, *, bad: tuple[str, ...] = ("random_bytes",), good: int = GOOD
) -> list[str]:
    """``good`` good shards and one shard per named corpus case, in that order."""
    urls = []
    for i in range(good):
        path = tmp_path / f"good-{i}.tar"
        path.write_bytes(samples(range(len(KEYS))) + END)
        urls.append(str(path))
    for name in bad:
        case = TAR_CASES.get(name)
        data = case.data() if case is not None else DECODE_CASES[name].data()
        path = tmp_path / f"bad-{name}.tar"
        path.write_bytes(data)
        urls.append(str(path))
    return urls


def drain(pipe: Any, workers: int = 0, context: str | None = None) -> int:
    loader = DataLoader(
        pipe, batch_size=None, num_workers=workers,
        multiprocessing_context=context if workers else None,
    )  # fmt: skip
    return sum(1 for _ in loader)


class TestStats:
    @pytest.mark.slow
    @pytest.mark.parametrize("context", ["fork", "spawn"])
    def test_summed_over_workers(self, tmp_path: Path, context: str) -> None:
        """Counts from 2 workers reach the parent: read, skipped by reason, shards failed."""
        urls = bucket(tmp_path, bad=("random_bytes", "bad_header_checksum", "jpeg_cut_in_the_scan"))
        pipe = sp.recipes.tar_shards(
            urls, fields=("txt", "jpg;txt", "__key__"), shuffle=False, handler="ignore"
        )
        got = drain(pipe, 2, context)
        stats = pipe.stats()
        # 4 x 10 good, 9 of the checksum shard, 10 of the jpeg shard of which 1 fails decoding
        assert got == stats.yielded == 40 + 9 + 9
        assert stats.read == 40 + 9 + 10
        assert stats.errors == 3
        assert stats.skipped == {"tar": 2, "decode": 1}
        assert stats.shards == 7
        assert stats.shards_failed == 1  # the random bytes: nothing to go on with

    def test_a_new_epoch_starts_from_zero(self, tmp_path: Path) -> None:
        """Each epoch counts afresh (the workers clear their rows when they begin)."""
        pipe = sp.list_shards(bucket(tmp_path)).open_tar(handler="ignore")
        first = (drain(pipe), pipe.stats())
        second = (drain(pipe), pipe.stats())
        assert first == second
        assert first[1].read == 40
        assert first[1].errors == 1

    def test_one_policy_counts_every_stage_of_a_chain(self, tmp_path: Path) -> None:
        """An ErrorPolicy given to each stage counts tar errors and decode errors together."""
        urls = bucket(tmp_path, bad=("bad_header_checksum", "json_that_is_not_json"))
        policy = sp.ErrorPolicy("ignore")
        pipe = sp.list_shards(urls).open_tar(handler=policy).decode(handler=policy)
        assert drain(pipe) == 40 + 9 + 9
        stats = policy.stats()
        assert stats == pipe.source_datapipe.stats()  # the opener reports its policy's counts
        assert stats.skipped == {"tar": 1, "decode": 1}
        assert (stats.read, stats.yielded) == (59, 58)

    @pytest.mark.slow
    def test_through_resumable_and_stateful_dataloader(self, tmp_path: Path) -> None:
        """Resumable.stats() and sp.pipe_stats() find the counts behind wrappers and stages."""
        from torchdata.stateful_dataloader import StatefulDataLoader

        urls = bucket(tmp_path, bad=("bad_header_checksum",))
        chain = sp.list_shards(urls).split_shards().open_tar(handler="ignore").batch(4)
        wrapped = sp.Resumable(chain)
        got = sum(len(b) for b in StatefulDataLoader(wrapped, batch_size=None, num_workers=2))
        assert got == wrapped.stats().yielded == sp.pipe_stats(chain).read == 49
        assert wrapped.stats().skipped == {"tar": 1}

    @pytest.mark.slow
    def test_a_shard_read_in_parts_counts_once(self, tmp_path: Path) -> None:
        """One shard split by sample between two workers is one shard (issue 24 §8)."""
        urls = bucket(tmp_path)[:1]
        pipe = sp.list_shards(urls).split_shards().open_tar()
        assert drain(pipe, 2) == 10
        stats = sp.pipe_stats(pipe)
        assert (stats.read, stats.shards) == (10, 1)
        assert str(stats).endswith("; 1 shard, 0 failed")

    def test_str(self) -> None:
        """Stats print on one line, reasons included."""
        stats = sp.Stats(read=10, yielded=8, errors=2, skipped={"tar": 2}, shards=3)
        assert str(stats) == "8 samples yielded of 10 read; 2 skipped (tar 2); 3 shards, 0 failed"


class TestBudget:
    def test_absolute_budget(self, tmp_path: Path) -> None:
        """max_errors=N allows N skipped errors in the epoch; the next one raises."""
        urls = bucket(tmp_path, bad=("random_bytes", "empty_file", "gzip_cut"))
        assert drain(
            sp.list_shards(urls).open_tar(handler="ignore", max_errors=3)
        ) == 40 + 0 + 0 + len(TAR_CASES["gzip_cut"].kept)
        pipe = sp.list_shards(urls).open_tar(handler="ignore", max_errors=2)
        with pytest.raises(
            sp.TooManyErrorsError, match="3 errors skipped this epoch, over max_errors=2"
        ):
            drain(pipe)

    @pytest.mark.slow
    def test_absolute_budget_counts_all_workers(self, tmp_path: Path) -> None:
        """The budget is for the epoch, not per worker: 2 workers with 2 bad shards each."""
        urls = bucket(tmp_path, bad=("random_bytes",) * 0, good=2)
        for i in range(4):
            (tmp_path / f"junk-{i}.tar").write_bytes(b"junk" * 300)
            urls.append(str(tmp_path / f"junk-{i}.tar"))
        pipe = sp.recipes.tar_shards(
            urls, fields=("txt",), shuffle=False, handler="ignore", max_errors=3
        )
        with pytest.raises(sp.TooManyErrorsError, match="max_errors=3"):
            drain(pipe, 2, "fork")

    def test_fraction_fails_a_bucket_of_garbage(self, tmp_path: Path) -> None:
        """A fraction fails an epoch of nothing but errors, at its end at the latest."""
        urls = bucket(tmp_path, bad=("random_bytes", "empty_file"), good=0)
        pipe = sp.recipes.tar_shards(urls, fields=("txt",), handler="ignore", max_errors=0.5)
        with pytest.raises(sp.TooManyErrorsError, match=r"2 errors .* of 2 items"):
            drain(pipe)

    def test_fraction_tolerates_a_few(self, tmp_path: Path) -> None:
        """One bad sample in 50: under a 5 % budget the epoch completes."""
        urls = bucket(tmp_path, bad=("json_that_is_not_json",))
        pipe = sp.recipes.tar_shards(
            urls, fields=("json;txt", "__key__"), shuffle=False, handler="ignore", max_errors=0.05
        )
        assert drain(pipe) == 49
        assert pipe.stats().errors == 1

    @pytest.mark.slow
    @pytest.mark.parametrize(("budget", "fails"), [(0.02, False), (0.005, True)])
    def test_fraction_has_one_outcome_for_any_number_of_workers(
        self, tmp_path: Path, budget: float, fails: bool
    ) -> None:
        """1 bad sample in 90, in one shard: the same outcome with 0, 2 and 3 workers.

        The worker that reads the bad shard sees 1 bad in 30 (over 2 %): a per-worker rule
        would fail with 3 workers where the epoch as a whole passes.
        """
        urls = bucket(tmp_path, bad=("json_that_is_not_json",), good=8)
        outcomes = []
        for workers in (0, 2, 3):
            pipe = sp.recipes.tar_shards(
                urls, fields=("json;txt",), shuffle=False, handler="ignore", max_errors=budget
            )
            try:
                drain(pipe, workers)
            except sp.TooManyErrorsError:
                outcomes.append(True)
            else:
                outcomes.append(False)
                assert pipe.stats().errors == 1
        assert outcomes == [fails] * 3

    @pytest.mark.parametrize(
        ("value", "error"),
        [
            (-1, ValueError),
            (1.5, ValueError),
            (0.0, ValueError),
            ("5", TypeError),
            (True, TypeError),
        ],
    )
    def test_bad_values(self, tmp_path: Path, value: object, error: type[Exception]) -> None:
        with pytest.raises(error, match="max_errors"):
            sp.list_shards(bucket(tmp_path, bad=())).open_tar(max_errors=value)  # type: ignore[arg-type]

    def test_budget_goes_with_the_policy(self) -> None:
        """An ErrorPolicy carries its own budget; a second one beside it is refused."""
        with pytest.raises(ValueError, match="give max_errors to the ErrorPolicy"):
            sp.list_shards("x.tar").open_tar(handler=sp.ErrorPolicy("warn"), max_errors=3)


def test_callable_handler_sees_every_stage(tmp_path: Path) -> None:
    """One callable given to a recipe receives tar and decode errors, with their context."""
    urls = bucket(tmp_path, bad=("bad_header_checksum", "json_that_is_not_json"))
    seen: list[tuple[str, str | None]] = []

    def handler(exc: BaseException, context: dict[str, Any]) -> bool:
        seen.append((context["stage"], context.get("member")))
        return True

    pipe = sp.recipes.tar_shards(
        urls, fields=("json;txt", "__key__"), shuffle=False, handler=handler
    )
    assert drain(pipe) == 40 + 9 + 9
    assert sorted(seen) == [("decode", "s0005.json"), ("open_tar", "s0005.txt")]
