"""``to_node``: a shardpipes pipeline as a ``torchdata.nodes`` node, resumable exactly.

torchdata ≥ 0.10 builds loaders from ``torchdata.nodes`` (``Loader``, ``ParallelMapper``,
``Batcher``, ``Prefetcher``, ``MultiNodeWeightedSampler``…), the DataPipes' maintained
successor. :func:`to_node` puts any recipe or chain at the root of such a graph; its
``get_state()`` is the pipeline's own state (where each shard is read to, the shuffle
buffer as byte ranges), not a count of items to replay.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from torch.utils.data import IterDataPipe
from torchdata.nodes import BaseNode  # type: ignore[import-untyped]

from shardpipes.pipes._torch import require_pipeline
from shardpipes.pipes.resumable import Resumable

__all__ = ["PipeNode", "to_node"]

T = TypeVar("T")


class PipeNode(BaseNode, Generic[T]):  # type: ignore[misc]
    """A ``torchdata.nodes.BaseNode`` over a shardpipes pipeline (see :func:`to_node`).

    Each ``reset()`` without a state begins the pipeline's next epoch; ``reset(state)``
    resumes where ``get_state()`` was taken. It reads in the process that iterates it:
    for parallel decoding, put ``torchdata.nodes.ParallelMapper`` after it.
    """

    STATE_KEY = "pipeline"

    def __init__(self, pipe: IterDataPipe[T]) -> None:
        super().__init__()
        self.root = Resumable.of(pipe)  # checked
        if not self.root.policies():
            msg = (
                f"to_node: this pipeline ({type(pipe).__name__}) reads no shard, so its "
                "state could not say which of its items were used: put the reading inside "
                "the pipe (open_tar, or a recipe such as sp.recipes.tar_shards) and map "
                "after it (torchdata.nodes.ParallelMapper)"
            )
            raise ValueError(msg)
        self._it: Iterator[T] | None = None

    def reset(self, initial_state: Mapping[str, Any] | None = None) -> None:
        """Begin the next epoch, or resume from ``initial_state`` (a ``get_state()``)."""
        super().reset(initial_state)
        self._close()
        if initial_state is not None:
            if self.STATE_KEY not in initial_state:
                msg = f"not a state of to_node(...): {str(initial_state)[:200]}"
                raise ValueError(msg)
            self.root.load_state_dict(initial_state[self.STATE_KEY])
        else:
            self.root.advance()
            self.root.reset()
        self._it = iter(self.root)

    def next(self) -> T:
        """The pipeline's next item (``StopIteration`` at the epoch's end)."""
        assert self._it is not None  # BaseNode resets before the first next()
        return next(self._it)

    def get_state(self) -> dict[str, Any]:
        """The pipeline's state between two items.

        Between ``reset()`` and the first item: the state of the epoch that begins.
        """
        return {self.STATE_KEY: self.root.state_dict()}

    def _close(self) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()  # its reading ahead stops


def to_node(pipe: IterDataPipe[T]) -> PipeNode[T]:
    """A ``torchdata.nodes`` node over a recipe or chain, resumable exactly.

    Raises:
        ValueError: If a stage of the pipeline cannot be resumed (torch's ``shuffle``…).

    Example:
        >>> import shardpipes as sp
        >>> from torchdata.nodes import Loader
        >>> node = sp.to_node(sp.recipes.tar_shards("data/train-*.tar", seed=0))
        >>> loader = Loader(node)  # state_dict() / load_state_dict() resume exactly
    """
    return PipeNode(require_pipeline(pipe, "to_node"))
