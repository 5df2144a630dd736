"""webdataset's and torchdata 0.9's method names, answered with shardpipes' own.

Our functional forms take other names than theirs (both may be imported in one process),
so ``pipe.header(10)`` is torch's bare ``AttributeError`` — unless torchdata 0.9 is
imported, whose forms then work as they always did. :func:`install` adds the shardpipes
name to that error, and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe

__all__ = ["HINTS", "install"]

#: the name a user arriving from webdataset or torchdata tries → what to write here
HINTS = {
    "header": ".limit_samples(n) (n over all workers and ranks; torchdata's is per worker)",
    "slice": ".limit_samples(n) (n over all workers and ranks)",
    "cycle": ".cycle_epochs() (count= for a number of passes)",
    "repeat": ".cycle_epochs(count)",
    "prefetch": ".prefetch_items(n)",
    "with_epoch": "sp.recipes.tar_shards(urls, epoch_size=n), or .cycle_epochs().limit_samples(n)",
    "batched": ".batch(n).collate(sp.collate_samples), or a recipe's batch_size=n",
    "rename": ".rename_fields(new='old;alternative')",
    "map_dict": ".map_fields(field=function)",
    "select": ".filter(predicate) (torch core)",
    "load_from_tar": ".open_tar() (reads by byte range, resumes)",
    "map_tuple": ".map(lambda t: (f(t[0]), g(t[1]))) after .to_tuple(...)",
    "with_length": "len(pipe): exact from .idx sidecars (shardpipes index)",
    "ddp_equalize": ".split_shards(even=True) (every rank the same number of samples)",
    "to_dict": "the sample dicts as they come, before .to_tuple(...)",
}


def install() -> None:
    """Make ``IterDataPipe``'s missing-attribute error name the shardpipes form (once)."""
    original = IterDataPipe.__getattr__
    if getattr(original, "_shardpipes", False):
        return

    def __getattr__(self: IterDataPipe[Any], name: str) -> Any:  # noqa: N807 - the hook
        try:
            found = original(self, name)
            return _keyword_shuffle(found) if name == "shuffle" else found
        except AttributeError:
            hint = HINTS.get(name)
            if name in ("state_dict", "load_state_dict") and _reads_shards(self):
                msg = (
                    f"'{type(self).__name__}' object has no attribute '{name}': with "
                    "shardpipes, save the loader's state (a StatefulDataLoader's, or "
                    "torchdata.nodes.Loader over sp.to_node(pipe)): with workers, only it "
                    f"holds what they read; iterating the pipe yourself, sp.Resumable(pipe)."
                    f"{name}(...)"
                )
                raise AttributeError(msg) from None
            if hint is None:
                raise
            msg = (
                f"'{type(self).__name__}' object has no attribute '{name}': with shardpipes, "
                f"use {hint} (see docs/migrating.md)"
            )
            raise AttributeError(msg) from None

    __getattr__._shardpipes = True  # type: ignore[attr-defined]
    IterDataPipe.__getattr__ = __getattr__  # type: ignore[method-assign]


def _keyword_shuffle(shuffle: Callable[..., Any]) -> Callable[..., Any]:
    """Torch's ``pipe.shuffle``, saying what to write when given webdataset's ``(1000)``.

    torch's takes ``buffer_size`` by keyword only: ``.shuffle(1000)`` is a ``TypeError``
    from inside its ``__init__`` that names neither.
    """

    def shuffle_(*args: Any, **kwargs: Any) -> Any:
        if args:
            msg = (
                f"torch's .shuffle takes buffer_size= by keyword (got .shuffle({args[0]!r})), "
                "and a pipeline with it cannot be resumed: with shardpipes, use "
                f".shuffle_samples({args[0]!r}) right after .open_tar() (a checkpoint holds "
                "its buffer)"
            )
            raise TypeError(msg)
        return shuffle(**kwargs)

    return shuffle_


def _reads_shards(pipe: IterDataPipe[Any]) -> bool:
    from shardpipes.pipes.resumable import reads_shards

    try:
        return reads_shards(pipe)
    except Exception:  # a hint only: never an error of its own
        return False
