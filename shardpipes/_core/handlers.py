"""Error handlers: what a stage does with a bad shard, member or sample.

A handler is one of

* ``"raise"`` (default): re-raise the error;
* ``"warn"``: skip the bad item and emit a :class:`ShardpipesWarning` naming it;
* ``"ignore"``: skip the bad item silently;
* a callable ``(exc, context) -> bool``: return ``True`` to skip and go on, ``False`` to
  re-raise. ``context`` is a dict with the ``stage`` and whatever is known of ``url``,
  ``member`` and ``key``. A callable of one argument, ``(exc) -> bool``, is taken as
  WebDataset's handlers are (``warn_and_continue``, ``ignore_and_continue``,
  ``reraise_exception``): ``True`` skips; ``False`` (its ``*_and_stop``) re-raises here,
  rather than ending the epoch early without a word;
* an :class:`~shardpipes.ErrorPolicy`: one of the above with an error budget and
  counters, shared by the stages it is given to.

Unlike WebDataset's ``warn_and_continue``, nothing here sleeps.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

HandlerFn = Callable[[BaseException, dict[str, Any]], bool]


@runtime_checkable
class PolicyLike(Protocol):
    """What :func:`handle` needs of an :class:`~shardpipes.ErrorPolicy`."""

    def handle(self, exc: BaseException, **context: Any) -> None: ...

    def stats(self) -> Any: ...


Handler = str | HandlerFn | PolicyLike

_NAMES = ("raise", "warn", "ignore")


class ShardpipesWarning(UserWarning):
    """A bad shard, member or sample was skipped because the handler said so."""


def check_handler(handler: Handler) -> Handler:
    """Validate a handler argument at construction time.

    Args:
        handler: ``"raise"``, ``"warn"``, ``"ignore"``, a callable ``(exc, context) -> bool``
            or an ``ErrorPolicy``.

    Returns:
        The handler, unchanged.

    Raises:
        ValueError: For an unknown handler name.
        TypeError: For something that is neither a name nor callable.
    """
    if isinstance(handler, PolicyLike):
        return handler
    if isinstance(handler, str):
        if handler not in _NAMES:
            msg = f"handler must be one of {_NAMES} or a callable (got {handler!r})"
            raise ValueError(msg)
    elif not callable(handler):
        msg = f"handler must be one of {_NAMES} or a callable (got {type(handler).__name__})"
        raise TypeError(msg)
    elif _takes_one(handler):
        return OneArgument(handler)
    return handler


def _takes_one(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes one positional argument and not two (WebDataset's handlers)."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)  # a wrapper's own
    except (TypeError, ValueError):  # no signature to read: taken as (exc, context)
        return False
    try:
        signature.bind(None, None)
    except TypeError:
        try:
            signature.bind(None)
        except TypeError:
            return False
        return True
    return False


class OneArgument:
    """A handler of one argument, ``(exc) -> bool``, called as one of two (picklable)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, exc: BaseException, context: dict[str, Any]) -> bool:
        return bool(self.fn(exc))

    def __repr__(self) -> str:
        return f"OneArgument({self.fn!r})"


def handle(handler: Handler, exc: BaseException, **context: Any) -> None:
    """Apply ``handler`` to ``exc``: return to skip, or raise.

    Call it from inside an ``except`` block; a bare ``raise`` in the caller is not needed.

    Args:
        handler: A handler accepted by :func:`check_handler`.
        exc: The error caught.
        **context: ``stage``, ``url``, ``member``, ``key``: passed to a callable handler.

    Raises:
        BaseException: ``exc`` itself, when the handler says not to skip.
    """
    if isinstance(handler, PolicyLike):
        handler.handle(exc, **context)
        return
    if handler == "raise":
        raise exc
    if handler == "warn":
        warnings.warn(f"skipped: {exc}", ShardpipesWarning, stacklevel=3)
        return
    if handler == "ignore":
        return
    if not handler(exc, context):  # type: ignore[operator]
        raise exc
