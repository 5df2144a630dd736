"""What the commands share: the usage error and counted nouns."""

from __future__ import annotations


class UsageError(Exception):
    """A command-line usage problem (exit status 2)."""


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 shard", "2 shards"."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"
