"""``__len__`` helpers shared by the pipes."""

from __future__ import annotations

import contextlib
from collections.abc import Sized
from typing import Any, NoReturn

__all__ = ["no_length", "source_length"]


def no_length(pipe: Any) -> NoReturn:
    """Raise torch's standard error for a pipe whose length is not known."""
    msg = f"{type(pipe).__name__} instance doesn't have valid length"
    raise TypeError(msg)


def source_length(pipe: Any) -> int:
    """The length of a 1:1 pipe: its source's, or torch's standard ``TypeError``."""
    if isinstance(pipe.source_datapipe, Sized):
        with contextlib.suppress(TypeError):
            return len(pipe.source_datapipe)
    no_length(pipe)
