"""What a saved split state must agree on with the pipe that loads it."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any


def digest(urls: Sequence[str]) -> str:
    """A short digest of a shard list (a state names the list it was saved for by it)."""
    return hashlib.sha1("\n".join(urls).encode(), usedforsecurity=False).hexdigest()[:16]


def check_split_state(
    saved: Mapping[str, Any], now: Mapping[str, Any], *, fixed_seed: int | None
) -> None:
    """Raise ``ValueError`` naming the first way a saved split state differs from now."""
    if "digest" in saved and (saved["shards"], saved["digest"]) != (now["shards"], now["digest"]):
        msg = (
            f"the state was saved for another shard list ({saved['shards']} shards, digest "
            f"{saved['digest']}; now {now['shards']} shards, digest {now['digest']})"
        )
        raise ValueError(msg)
    if "workers" in saved and (saved["workers"], saved["worker"]) != (
        now["workers"],
        now["worker"],
    ):
        msg = (
            f"the state was saved by worker {saved['worker']} of {saved['workers']} (DataLoader "
            f"workers × ranks); this is worker {now['worker']} of {now['workers']}. To resume "
            "on another number of workers or ranks: pipe = sp.resume_from(pipe, state)"
        )
        raise ValueError(msg)
    if fixed_seed is None and saved.get("seeded"):
        msg = (
            f"the state was saved with seed={saved['seed']}: give the pipe that saved it, "
            f"with the same seed (split_shards(seed={saved['seed']}), a recipe's seed=)"
        )
        raise ValueError(msg)
    if fixed_seed is not None and saved["seed"] != fixed_seed:
        msg = f"the state was saved with seed {saved['seed']}; this pipe has seed={fixed_seed}"
        raise ValueError(msg)
    if saved.get("blocks") != now.get("blocks") and "workers" in saved:
        msg = (
            f"the state was saved with block_shuffle={saved.get('blocks')}; this pipe reads "
            f"with block_shuffle={now.get('blocks')}"
        )
        raise ValueError(msg)
    if saved.get("even", now["even"]) != now["even"]:
        msg = f"the state was saved with even={saved['even']}; this pipe has even={now['even']}"
        raise ValueError(msg)
