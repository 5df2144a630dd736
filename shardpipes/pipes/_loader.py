"""The plain ``StatefulDataLoader(pipe)`` resumes shardpipes pipelines exactly.

torch's ``DataLoader``, and torchdata's ``StatefulDataLoader`` after it, put every
``IterDataPipe`` in a ``_IterDataPipeSerializationWrapper`` (so that it pickles for
``spawn`` workers) and then look for ``state_dict``/``load_state_dict`` on that wrapper:
finding none, ``StatefulDataLoader`` would "naively fast-forward" — replay the epoch up to
where it stopped, which with shuffling or several workers loses and repeats samples.

Importing shardpipes makes ``StatefulDataLoader`` wrap a pipeline that reads shards (a
recipe, or a chain with ``open_tar``) in :class:`StatefulPipeWrapper` instead: the same
wrapper, plus the pipeline's state (:func:`~shardpipes.pipes.resumable.pipeline_state`).
Other pipelines get torch's wrapper as before. The DataLoader still shards the pipeline
over workers × ranks and seeds it, as for any pipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterDataPipe
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper

from shardpipes.pipes.resumable import load_pipeline_state, pipeline_state, reads_shards

__all__ = ["StatefulPipeWrapper", "install"]


class StatefulPipeWrapper(_IterDataPipeSerializationWrapper):
    """torch's wrapper of a pipe in a DataLoader, with the pipeline's state."""

    def state_dict(self) -> dict[str, Any]:
        """The pipeline's state, taken between two items (see ``pipeline_state``).

        Raises:
            ValueError: If a stage cannot be resumed (torch's ``shuffle``…), naming it.
        """
        return pipeline_state(self._datapipe)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the pipeline from ``state``, also when it is already being iterated."""
        load_pipeline_state(self._datapipe, state)
        if getattr(self, "_datapipe_iter", None) is not None:  # iter() came first: start anew
            self._datapipe_iter = iter(self._datapipe)


def _wrap(datapipe: IterDataPipe[Any]) -> _IterDataPipeSerializationWrapper:
    """What ``StatefulDataLoader`` wraps a pipe in: stateful if the pipe reads shards."""
    if reads_shards(datapipe):
        return StatefulPipeWrapper(datapipe)  # type: ignore[no-untyped-call]
    return _IterDataPipeSerializationWrapper(datapipe)  # type: ignore[no-untyped-call]


def install() -> None:
    """Make torchdata's ``StatefulDataLoader`` wrap shard-reading pipes statefully."""
    from torchdata.stateful_dataloader import stateful_dataloader  # type: ignore[import-untyped]

    stateful_dataloader._IterDataPipeSerializationWrapper = _wrap
