"""``Resumable``: a pipe handed to torchdata's ``StatefulDataLoader`` with its state visible."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch.utils.data import IterableDataset, IterDataPipe, get_worker_info, graph_settings
from torch.utils.data.graph import traverse_dps

from shardpipes.pipes.shards import ShardSplitter, distributed, set_epoch, worker_placement

__all__ = ["Resumable"]

T = TypeVar("T")


class Resumable(IterableDataset[T]):
    """Wrap a stateful pipe (a recipe, a ``ShardStream``) for ``StatefulDataLoader``.

    torch's ``DataLoader``, and torchdata's ``StatefulDataLoader`` after it, wrap every
    ``IterDataPipe`` in a serialization wrapper that hides its ``state_dict``: handed a
    pipe directly, ``StatefulDataLoader`` falls back to re-reading the epoch up to where it
    stopped. This wrapper is a plain ``IterableDataset`` that forwards ``state_dict`` and
    ``load_state_dict`` to the pipe, and does when iterated what the DataLoader does for a
    pipe: shards it over DataLoader workers × ``torch.distributed`` ranks and seeds its
    shuffle buffers (from the worker's seed). The shard order is a function of the
    pipe's ``seed`` (0 when not given) and epoch, never of the loader's seed, so ranks
    agree without talking: call :meth:`set_epoch` every epoch.

    Args:
        pipe: The pipe; its state is resumable when it is a ``ShardStream`` (every
            streaming recipe is one).

    Example:
        >>> from torchdata.stateful_dataloader import StatefulDataLoader
        >>> import shardpipes as sp
        >>> pipe = sp.recipes.tar_shards("data/train-*.tar", seed=17, batch_size=64)
        >>> loader = StatefulDataLoader(sp.Resumable(pipe), batch_size=None, num_workers=4)
    """

    def __init__(self, pipe: IterDataPipe[T]) -> None:
        if not isinstance(pipe, IterDataPipe):
            msg = f"Resumable wraps an IterDataPipe (got {type(pipe).__name__})"
            raise TypeError(msg)
        self.pipe = pipe
        self._ranks: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # pickled in the main process for the DataLoader's workers: take the rank along,
        # since a worker started by "spawn" has no process group to ask
        state = self.__dict__.copy()
        world_size, rank = distributed()
        if world_size > 1:
            state["_ranks"] = (world_size, rank)
        return state

    def __iter__(self) -> Iterator[T]:
        total, worker = worker_placement(self._ranks)
        graph_settings.apply_sharding(self.pipe, total, worker)
        info = get_worker_info()
        seed = info.seed if info is not None else int(torch.empty((), dtype=torch.int64).random_())
        rng = torch.Generator().manual_seed(seed)
        seen: set[int] = set()
        for stage in graph_settings.get_all_graph_pipes(traverse_dps(self.pipe)):
            set_seed = getattr(stage, "set_seed", None)
            if id(stage) in seen or isinstance(stage, ShardSplitter) or not callable(set_seed):
                continue  # the shard order is the splitter's own (seed, epoch)
            seen.add(id(stage))
            set_seed(int(torch.empty((), dtype=torch.int64).random_(generator=rng)))
        return iter(self.pipe)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of every ``split_shards`` stage of the pipe."""
        set_epoch(self.pipe, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The pipe's state (see ``ShardStream.state_dict``)."""
        return self._stateful().state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the pipe from a saved state at the next iteration."""
        self._stateful().load_state_dict(state)

    def _stateful(self) -> Any:
        if not callable(getattr(self.pipe, "state_dict", None)):
            msg = f"{type(self.pipe).__name__} keeps no state; build the pipeline as a ShardStream"
            raise TypeError(msg)
        return self.pipe
