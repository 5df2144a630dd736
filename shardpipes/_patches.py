"""What shardpipes changes in torch and torchdata, in one place, each change gated by version.

- torchdata 0.11's ``StatefulDataLoader`` calls ``torch.set_vital``, which torch ≥ 2.9
  deprecates: every loader built warned ``'set_vital' is deprecated``, a warning about
  torchdata's code that its users cannot act on. It is silenced, for that call only.
"""

from __future__ import annotations

import warnings
from importlib import metadata

__all__ = ["install", "version"]


def version(package: str) -> tuple[int, ...]:
    """The installed version of ``package`` as numbers (``(0, 11, 0)``); ``()`` if unknown."""
    try:
        text = metadata.version(package)
    except metadata.PackageNotFoundError:
        return ()
    numbers = []
    for part in text.split("+")[0].split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def install() -> None:
    """Apply the changes that the installed versions need (once; idempotent)."""
    if version("torchdata")[:2] == (0, 11):
        warnings.filterwarnings(
            "ignore",
            message="'set_vital' is deprecated",
            category=UserWarning,
            module=r"torchdata\.stateful_dataloader\.",
        )
