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

import sys
import weakref
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterDataPipe, get_worker_info
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper

from shardpipes.pipes._length import loader_length
from shardpipes.pipes.flow import lone_limit
from shardpipes.pipes.resumable import Positions, reads_shards

__all__ = ["StatefulPipeWrapper", "check_read_here", "install"]

#: pipes that a live DataLoader of this process reads in worker processes: (the loader,
#: its num_workers). A pipe's own state here says nothing of what the workers read
_IN_WORKERS: weakref.WeakKeyDictionary[IterDataPipe[Any], tuple[weakref.ref[Any], int]] = (
    weakref.WeakKeyDictionary()
)


def check_read_here(pipe: IterDataPipe[Any]) -> None:
    """Refuse a pipe's own state in a process whose DataLoader reads it in workers.

    Raises:
        ValueError: ``pipe`` was given to a DataLoader with workers, this process is not
            one of them, and has not read it itself.
    """
    from shardpipes.pipes._epoch import readings

    loader, workers = _IN_WORKERS.get(pipe, (None, 0))
    if loader is None or loader() is None or get_worker_info() is not None:
        return  # no live loader reads it in workers, or this is one of them
    if any(reading.run is not None for reading in readings(pipe)):
        return  # iterated here too (without the loader): its state is this process's
    msg = (
        f"this pipe is read by a DataLoader's {workers} worker processes: its state in "
        "this process holds nothing they read, and resuming from it would repeat the "
        "epoch. Save the loader's state instead: loader.state_dict() of a "
        "torchdata StatefulDataLoader (it gathers the workers'); sp.resume_from and "
        "load_state_dict take it"
    )
    raise ValueError(msg)


class StatefulPipeWrapper(_IterDataPipeSerializationWrapper):
    """torch's wrapper of a pipe in a DataLoader, with the pipeline's state.

    ``StatefulDataLoader`` loads a saved state into it before ``iter()`` (as the
    dataset's state) and, on Python < 3.12, once more just after (as the iterator's: torch
    wraps the iterator in an object that forwards attributes): the second load of the
    same state is one load. A state loaded for an iteration that then reads nothing (the
    loader knew the epoch had ended) is dropped at the next ``iter()``, its epoch counted.
    """

    _claimed: Mapping[str, Any] | None = None  # loaded for the current iteration
    _workers: int | None = None  # the loader's num_workers, for len()
    _awaiting: Mapping[str, Any] | None = None  # loaded for the next one
    _upcoming = False  # iter() was called, next() not yet
    _found: Positions | None = None  # the pipeline's stages with a position

    def positions(self) -> Positions:
        """The pipeline's stages with a position (found once per process).

        Raises:
            ValueError: If a stage cannot be resumed (torch's ``shuffle``…), naming it.
        """
        if self._found is None:
            self._found = Positions(self._datapipe)
        return self._found

    def state_dict(self) -> dict[str, Any]:
        """The pipeline's state, taken between two items (see ``pipeline_state``).

        Before the first item of an iteration (a worker's state, taken when its iterator
        is made), the state of that iteration's start: not of the last one, which a
        persistent worker (or the main process) still holds, nor of an epoch not yet
        counted.

        Raises:
            ValueError: If a stage cannot be resumed (torch's ``shuffle``…), naming it.
        """
        return self.positions().pipeline_state(upcoming=self._upcoming)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the pipeline from ``state`` at the iteration that begins next."""
        if self._claimed is not None and self.positions().pending():
            if state == self._claimed:  # the iterator's copy of this iteration's state
                return
            self.positions().drop_loaded()
        self._claimed = None
        self.positions().load(state)
        self._awaiting = state


def _iter(self: StatefulPipeWrapper) -> Any:
    if self._claimed is not None and self.positions().pending():
        self.positions().drop_loaded()  # the last iteration never read: its state is spent
    self._claimed, self._awaiting = self._awaiting, None
    self._upcoming = True
    return _IterDataPipeSerializationWrapper.__iter__(self)  # type: ignore[no-untyped-call]


def _next(self: StatefulPipeWrapper) -> Any:
    self._upcoming = False  # the iteration begins: its stages hold their own states
    return _IterDataPipeSerializationWrapper.__next__(self)  # type: ignore[attr-defined]


# set after the class is made: IterDataPipe's metaclass would hook an __iter__ or __next__
# defined in the class body a second time (torch's wrapper's own are hooked already)
StatefulPipeWrapper.__iter__ = _iter  # type: ignore[method-assign,assignment]
StatefulPipeWrapper.__next__ = _next  # type: ignore[attr-defined]


def _len(self: StatefulPipeWrapper) -> int:
    """Items the loader yields in an epoch on this rank (see :mod:`shardpipes.pipes._length`).

    Counted for the loader's ``num_workers``, each worker's batches on its own samples.
    """
    if self._workers is None:
        return len(self._datapipe)
    return loader_length(self._datapipe, self._workers)


StatefulPipeWrapper.__len__ = _len  # type: ignore[method-assign,assignment]


def _wrap(datapipe: IterDataPipe[Any]) -> _IterDataPipeSerializationWrapper:
    """What a DataLoader wraps a pipe in: stateful, and sized by its workers, if it reads shards.

    Called by ``DataLoader.__init__`` (torch's and ``StatefulDataLoader``'s) once its
    ``num_workers`` is set: the loader is the caller's ``self``.
    """
    if reads_shards(datapipe):
        wrapper = StatefulPipeWrapper(datapipe)  # type: ignore[no-untyped-call]
        loader = sys._getframe(1).f_locals.get("self")
        workers = getattr(loader, "num_workers", None)
        if isinstance(workers, int):
            wrapper._workers = workers
            if workers > 0 and loader is not None:
                _IN_WORKERS[datapipe] = (weakref.ref(loader), workers)
            else:  # the newest loader reads it here
                _IN_WORKERS.pop(datapipe, None)
        return wrapper
    return _IterDataPipeSerializationWrapper(datapipe)  # type: ignore[no-untyped-call]


def install() -> None:
    """Make both DataLoaders wrap shard-reading pipes in :class:`StatefulPipeWrapper`.

    torch's ``DataLoader`` (for ``len()``) and torchdata's ``StatefulDataLoader`` (for the
    state, and ``len()``).
    """
    from torch.utils.data import dataloader
    from torchdata.stateful_dataloader import stateful_dataloader  # type: ignore[import-untyped]

    stateful_dataloader._IterDataPipeSerializationWrapper = _wrap
    dataloader._IterDataPipeSerializationWrapper = _wrap  # type: ignore[attr-defined,assignment]
    loader_class = stateful_dataloader.StatefulDataLoader
    if not getattr(loader_class.load_state_dict, "_shardpipes", False):
        loader_class.load_state_dict = _checked(loader_class.load_state_dict)


def _checked(load: Any) -> Any:
    """``StatefulDataLoader.load_state_dict``, refusing a state of another ``num_workers``.

    torchdata asserts it when iteration starts, with no message (or "State doesn't contain
    key '_snapshot'"); for a shardpipes pipeline this says what differs, at the load.
    """

    def load_state_dict(self: Any, state_dict: Any) -> None:
        if isinstance(self.dataset, StatefulPipeWrapper) and isinstance(state_dict, Mapping):
            saved = _saved_workers(state_dict)
            if saved is not None and saved != self.num_workers:
                msg = (
                    f"the loader state was saved with num_workers={saved}; this loader has "
                    f"num_workers={self.num_workers}. Resume with the same num_workers (and "
                    "world size)"
                )
                found = self.dataset.positions()
                taken = None if found.mixes else lone_limit(found.held)  # as resume_from
                held = [s for s in found.held if s is not taken]
                if held:  # resume_from refuses them
                    names = sorted({type(stage).__name__ for stage in held})
                    msg += f": a pipeline with {', '.join(names)} resumes on no other"
                else:
                    msg += (
                        ", or on another topology with pipe = sp.resume_from(pipe, state) and "
                        "a new loader"
                    )
                raise ValueError(msg)
        load(self, state_dict)

    load_state_dict._shardpipes = True  # type: ignore[attr-defined]
    return load_state_dict


def _saved_workers(state: Mapping[str, Any]) -> int | None:
    """The ``num_workers`` a ``StatefulDataLoader`` state was saved with, if it says."""
    if not state:
        return None
    snapshot = state.get("_snapshot")
    if snapshot is None:  # a single-process loader's state
        return 0 if "_index_sampler_state" in state or "fetcher_state" in state else None
    workers = (snapshot.get("_main_snapshot") or {}).get("_num_workers")
    return workers if isinstance(workers, int) else None
