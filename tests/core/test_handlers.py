"""Error handlers: checking them, and what each one does with an error."""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import pytest

from shardpipes._core.handlers import ShardpipesWarning, check_handler, handle


class FakePolicy:
    """The two methods of an ErrorPolicy that handlers use; records what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[BaseException, dict[str, Any]]] = []

    def handle(self, exc: BaseException, **context: Any) -> None:
        self.calls.append((exc, context))

    def stats(self) -> None:
        return None


def skip_all(exc: BaseException, context: dict[str, Any]) -> bool:
    return True


class TestCheckHandler:
    @pytest.mark.parametrize("handler", ["raise", "warn", "ignore", skip_all, FakePolicy()])
    def test_valid_handlers_come_back_unchanged(self, handler: Any) -> None:
        """Names, callables and policies are returned as they are."""
        assert check_handler(handler) is handler

    @pytest.mark.parametrize(
        ("handler", "error", "match"),
        [
            ("skip", ValueError, r"handler must be one of \('raise', 'warn', 'ignore'\) .*'skip'"),
            ("", ValueError, r"or a callable \(got ''\)"),
            (3, TypeError, r"handler must be one of .* or a callable \(got int\)"),
            (None, TypeError, r"\(got NoneType\)"),
        ],
    )
    def test_bad_handlers(self, handler: Any, error: type[Exception], match: str) -> None:
        """An unknown name is a ValueError, anything not callable a TypeError, quoting it."""
        with pytest.raises(error, match=match):
            check_handler(handler)


def stage(handler: Any, exc: BaseException, **context: Any) -> None:
    """A stage that hands its error to the handler, as the pipes do."""
    try:
        raise exc
    except type(exc) as caught:
        handle(handler, caught, **context)


class TestHandle:
    def test_raise_reraises_the_same_error(self) -> None:
        """'raise' raises the error object it was given."""
        exc = ValueError("bad member")
        with pytest.raises(ValueError, match="bad member") as info:
            stage("raise", exc)
        assert info.value is exc

    def test_warn_skips_with_a_warning_at_the_stages_caller(self) -> None:
        """'warn' returns, warning 'skipped: <error>' at the line that called the stage."""
        line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
        with pytest.warns(ShardpipesWarning, match=r"^skipped: bad member$") as record:
            stage("warn", ValueError("bad member"))
        assert len(record) == 1
        if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut's trampolines add stack frames
            assert (record[0].filename, record[0].lineno) == (__file__, line)

    def test_ignore_skips_silently(self) -> None:
        """'ignore' returns and warns nothing."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert stage("ignore", ValueError("bad")) is None

    @pytest.mark.parametrize("skip", [True, False])
    def test_callable_decides_and_gets_the_context(self, skip: bool) -> None:
        """A callable gets (error, context): True skips, False re-raises."""
        seen: list[tuple[BaseException, dict[str, Any]]] = []

        def decide(exc: BaseException, context: dict[str, Any]) -> bool:
            seen.append((exc, context))
            return skip

        exc = ValueError("bad")
        if skip:
            stage(decide, exc, stage="decode", url="u", key="k")
        else:
            with pytest.raises(ValueError, match="bad"):
                stage(decide, exc, stage="decode", url="u", key="k")
        assert seen == [(exc, {"stage": "decode", "url": "u", "key": "k"})]

    def test_policy_gets_the_error_and_the_context(self) -> None:
        """A policy is handed the error and context, and decides itself (here: skips)."""
        policy, exc = FakePolicy(), ValueError("bad")
        stage(policy, exc, stage="open_tar", member="a.jpg")
        assert policy.calls == [(exc, {"stage": "open_tar", "member": "a.jpg"})]


def test_one_argument_callables_are_called_with_the_error_alone() -> None:
    """WebDataset's kind, (exc) -> bool: wrapped; (exc, context) and *args: as they are."""

    def one(exc: BaseException) -> bool:
        return True

    def two(exc: BaseException, context: dict[str, Any] | None = None) -> bool:
        return True

    def star(*args: Any) -> bool:
        return True

    def none() -> bool:
        return True

    seen: list[BaseException] = []
    wrapped = check_handler(lambda exc: seen.append(exc) is None)
    error = ValueError("x")
    assert wrapped(error, {}) is True  # type: ignore[operator]
    assert seen == [error]  # called with the error itself
    assert check_handler(one) is not one
    assert check_handler(none) is none  # takes neither: left as it is (it fails when called)
    assert check_handler(two) is two
    assert check_handler(star) is star
    assert check_handler(dict) is dict  # no signature to read: as (exc, context)
    refuse = check_handler(lambda e: 0)
    with pytest.raises(ValueError, match="bad"):
        handle(refuse, ValueError("bad"))


def test_a_two_argument_wrapper_of_a_one_argument_function_stays_two() -> None:
    """functools.wraps points the signature at the inner function: the wrapper's counts."""
    import functools

    def one(exc: BaseException) -> bool:
        return True

    @functools.wraps(one)
    def wrapper(exc: BaseException, context: dict[str, Any]) -> bool:
        return one(exc)

    assert check_handler(wrapper) is wrapper
