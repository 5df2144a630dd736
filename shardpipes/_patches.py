"""What shardpipes changes in torch and torchdata, in one place, each change gated by version.

- **The DataLoader's wrapper of a pipe.** torch's ``DataLoader``, and torchdata's
  ``StatefulDataLoader`` after it, put every ``IterDataPipe`` in a
  ``_IterDataPipeSerializationWrapper`` that hides its ``state_dict``: the
  ``StatefulDataLoader`` would then "naively fast-forward", losing and repeating samples.
  A pipeline with a shardpipes stage gets :class:`LoaderPipe` instead: the same wrapper,
  over a :class:`~shardpipes.Resumable` root, with the pipeline's state, its ``len()``
  for the loader's ``num_workers`` (told by the loaders' ``__init__``, wrapped here), and
  the epoch handed out by the loaders' ``__iter__`` (wrapped here), in the main process
  that the workers start from: a bare ``iter(loader)`` after one that began is the next
  epoch, as for the pipe itself. Persistent workers keep their copies between epochs:
  they read the epoch handed out from one shared integer (a tensor in shared memory).
- **A StatefulDataLoader's state under PyTorch Lightning**: Lightning fetches a batch
  ahead of a loader without ``len()``, and the state it saves counts that batch as
  delivered. The first ``state_dict()`` of a loader with no length, Lightning imported,
  warns naming the way out (``.idx`` sidecars).
- **A state loaded into a StatefulDataLoader** is checked for its ``num_workers``
  (torchdata asserts it later without a message), and its epoch told to the main
  process's pipe, from which the workers of the next epoch start.
- **torchdata.nodes' Loader**, resumed from a state taken at an epoch's end, kept
  reporting that stale state through the next epoch (torchdata 0.11; its pull request
  1552 is the same fix): a reset drops its cached state.
- torchdata 0.11's ``StatefulDataLoader`` calls ``torch.set_vital``, which torch ≥ 2.9
  deprecates: every loader warned ``'set_vital' is deprecated``. Silenced, for that call.
"""

from __future__ import annotations

import itertools
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

import torch
from torch.utils.data import get_worker_info
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper

from shardpipes.pipes._stage import envelope, pipeline_state, reads_ours
from shardpipes.pipes._torch import distributed
from shardpipes.pipes.resumable import Resumable


def version(package: str) -> tuple[int, ...]:
    """The installed version of ``package`` as numbers (``(0, 11, 0)``); ``()`` if unknown."""
    try:
        text = metadata.version(package)
    except metadata.PackageNotFoundError:
        return ()
    return tuple(map(int, itertools.takewhile(str.isdigit, text.split("+")[0].split("."))))


class LoaderPipe(_IterDataPipeSerializationWrapper):
    """torch's wrapper of a pipe in a DataLoader, over a root with the pipeline's state."""

    num_workers: int | None = None  # the loader's (its __init__ says)

    def __init__(self, datapipe: Any) -> None:
        root = Resumable.of(datapipe, check=False)
        super().__init__(root)  # type: ignore[no-untyped-call]
        self.pipe = datapipe  # the user's
        # the epoch the last iter(loader) handed out: persistent workers read it here
        self.handed = torch.zeros(1, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __getstate__(self) -> Any:  # torch's pickles the pipe alone; the integer stays shared
        return {"wrapped": super().__getstate__(), "handed": self.handed}  # type: ignore[no-untyped-call]

    def __setstate__(self, state: Any) -> None:
        super().__setstate__(state["wrapped"])  # type: ignore[no-untyped-call]
        self.handed = state["handed"]

    def hand_out(self) -> None:
        """A new ``iter(loader)``, in the main process: the epoch its workers start from.

        Called by the loaders' ``__iter__`` (wrapped here), once per iteration. Not from
        ``set_seed``: torch seeds the graph twice per ``iter()`` of a loader with workers,
        once before they start and once after.
        """
        root = self._datapipe
        root.advance()
        root.reset()
        root.hand_out()
        self.handed[0] = root.epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the pipeline's next iteration (``accelerate`` calls this)."""
        self._datapipe.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The pipeline's state, taken between two items."""
        return envelope(self._datapipe)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume the pipeline from ``state``, in the iteration that begins here."""
        self._datapipe.reset(pipeline_state(state))
        self._datapipe_iter = iter(self._datapipe)

    def loaded(self, epoch: int) -> None:
        """A state of ``epoch`` was loaded into the loader: its next iteration's epoch.

        Set now, so that a ``set_epoch`` after the load still chooses.
        """
        self._datapipe.set_epoch(epoch, given=False)


def _iter(self: LoaderPipe) -> LoaderPipe:
    root = self._datapipe
    if get_worker_info() is not None and not root._fresh:  # a persistent worker, again
        root.set_epoch(int(self.handed[0]), given=False)
        root.reset()
    self._datapipe_iter = iter(root)
    return self


def _next(self: LoaderPipe) -> Any:
    return next(self._datapipe_iter)


def _len(self: LoaderPipe) -> int:
    """Items the loader yields in an epoch on this rank: each worker batches its own."""
    root = self._datapipe
    if self.num_workers is None:
        return len(root)
    world, rank = distributed()
    workers = max(1, self.num_workers)
    if world == 1:  # every worker of the split: a sum that no shard order changes
        return int(root.length(workers, None))
    return sum(root.length(workers * world, w * world + rank) for w in range(workers))


# set after the class is made: IterDataPipe's metaclass would hook an __iter__ defined
# in the class body a second time (torch's wrapper's own are hooked already)
LoaderPipe.__iter__ = _iter  # type: ignore[method-assign,assignment]
LoaderPipe.__next__ = _next  # type: ignore[attr-defined]
LoaderPipe.__len__ = _len  # type: ignore[method-assign,assignment]


def _wrap(datapipe: Any) -> Any:
    """What a DataLoader wraps a pipe in: a :class:`LoaderPipe` if shardpipes reads in it."""
    if reads_ours(datapipe):
        return LoaderPipe(datapipe)
    return _IterDataPipeSerializationWrapper(datapipe)  # type: ignore[no-untyped-call]


def _wrapper_of(loader: Any) -> LoaderPipe | None:
    """The :class:`LoaderPipe` a loader wraps its dataset in, if shardpipes reads in it."""
    wrapper = loader.__dict__.get("dataset")
    return wrapper if isinstance(wrapper, LoaderPipe) else None


def _refuse_redealt(loader: Any) -> None:
    """Refuse a loader over another loader's pipe: accelerate's ``prepare()`` makes one.

    It deals an iterable dataset's items out over the processes again (every ``k``-th
    batch, ``IterableDatasetShard``), or reads them on process 0 alone and sends them out
    (``dispatch_batches``). shardpipes splits the shards by rank itself: the first drops
    half of each rank's samples, the second reads one rank's share only.
    """
    dataset = loader.__dict__.get("dataset")
    if isinstance(dataset, _IterDataPipeSerializationWrapper):  # torch's, or ours
        inner = dataset._datapipe
    else:  # accelerate's IterableDatasetShard holds it as .dataset
        inner = getattr(dataset, "dataset", None)
    if isinstance(inner, LoaderPipe):
        msg = (
            "this DataLoader deals out the items of a DataLoader over a shardpipes pipe "
            "again (accelerate's prepare() of the loader does), but shardpipes already "
            "splits the shards by rank: samples would be dropped or read by one rank only. "
            "Prepare the model and optimizer, not the loader: iterate the StatefulDataLoader "
            "itself and save its state per process (README: 'Under accelerate')."
        )
        raise TypeError(msg)


def _told(init: Callable[..., None]) -> Callable[..., None]:
    """A loader's ``__init__`` that tells its :class:`LoaderPipe` its ``num_workers``."""
    from shardpipes.pipes._stage import READ_IN_WORKERS

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method
        init(self, *args, **kwargs)
        _refuse_redealt(self)
        wrapper = _wrapper_of(self)
        if wrapper is not None:
            wrapper.num_workers = self.num_workers
            if self.num_workers > 0:
                READ_IN_WORKERS[wrapper.pipe] = (weakref.ref(self), self.num_workers)
            else:  # the newest loader reads it here
                READ_IN_WORKERS.pop(wrapper.pipe, None)

    return __init__


def _handing(iterate: Callable[..., Any]) -> Callable[..., Any]:
    """A loader's ``__iter__`` that hands the next epoch to its :class:`LoaderPipe` first."""

    def __iter__(self: Any) -> Any:  # noqa: N807 - the method
        wrapper = _wrapper_of(self)
        # a StatefulDataLoader whose state_dict() made the iterator reuses it: handed then
        if wrapper is not None and not self.__dict__.get(_MADE_FOR_STATE):
            wrapper.hand_out()
        return iterate(self)

    return __iter__


_MADE_FOR_STATE = "_initial_iter_for_state_dict"  # torchdata's flag


_LENGTH_TOLD = "_shardpipes_length_told"
_FETCHING_AHEAD = ("lightning", "pytorch_lightning")  # fetch a batch ahead without len()


def _warn_fetched_ahead(loader: Any) -> None:
    """Warn if a trainer that fetches ahead of a loader without ``len()`` is imported."""
    if not any(name in sys.modules for name in _FETCHING_AHEAD):
        return
    try:
        len(loader)
    except TypeError as exc:
        msg = (
            f"this loader has no len() ({exc}). PyTorch Lightning fetches a batch ahead of "
            "a loader without len(), and the state it saves then counts that batch as "
            "delivered: a run resumed from it skips one batch. Give the shards .idx "
            "sidecars (`shardpipes index URL`; ShardWriter and `shardpipes write` write "
            "them) and the resumption is exact."
        )
        warnings.warn(msg, UserWarning, stacklevel=3)


def _handing_for_state(state_dict: Callable[..., Any]) -> Callable[..., Any]:
    """``StatefulDataLoader.state_dict``: an iterator it makes is handed the epoch first.

    Before the first ``iter()``, torchdata makes the iteration there (and the next
    ``iter()`` takes it): the epoch is handed out as ``iter()`` would.
    """

    def wrapped(self: Any) -> Any:
        wrapper = _wrapper_of(self)
        if wrapper is not None and self.__dict__.get("_iterator") is None:
            wrapper.hand_out()
        if wrapper is not None and not self.__dict__.get(_LENGTH_TOLD):
            self.__dict__[_LENGTH_TOLD] = True
            _warn_fetched_ahead(self)
        return state_dict(self)

    wrapped.__name__ = wrapped.__qualname__ = "state_dict"
    return wrapped


def _checked(load: Callable[..., None]) -> Callable[..., None]:
    """``StatefulDataLoader.load_state_dict``: its ``num_workers`` checked, its epoch told."""

    def load_state_dict(self: Any, state_dict: Any) -> None:
        wrapper = _wrapper_of(self)
        if wrapper is not None and isinstance(state_dict, Mapping) and state_dict:
            saved = _saved_workers(state_dict)
            if saved is not None and saved != self.num_workers:
                msg = (
                    f"the loader state was saved with num_workers={saved}; this loader has "
                    f"num_workers={self.num_workers}. Resume with the same num_workers (and "
                    "world size), or on another topology with pipe = sp.resume_from(pipe, "
                    "state) and a new loader"
                )
                raise ValueError(msg)
            epoch = _saved_epoch(state_dict)
            if epoch is not None and state_dict.get("_iterator_finished"):
                # the epoch had ended: torchdata would make the iteration of its states and
                # drop it; the next epoch starts afresh from this pipe (set_epoch may choose)
                wrapper.loaded(epoch + 1)
                state_dict = {}
            elif epoch is not None:
                wrapper.loaded(epoch)
        load(self, state_dict)

    return load_state_dict


def _worker_states(state: Mapping[str, Any]) -> list[Any]:
    """The pipe states in a ``StatefulDataLoader`` state (torchdata 0.11's layout)."""
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, Mapping):
        workers = snapshot.get("_worker_snapshots") or {}
        found = [(w.get("fetcher_state") or {}).get("dataset_iter_state") for w in workers.values()]
    else:
        found = [(state.get("fetcher_state") or {}).get("dataset_iter_state")]
    return [one for one in found if isinstance(one, Mapping)]


def _saved_epoch(state: Mapping[str, Any]) -> int | None:
    epochs = [one.get("epoch") for one in _worker_states(state)]
    return max((e for e in epochs if isinstance(e, int)), default=None)


def _saved_workers(state: Mapping[str, Any]) -> int | None:
    """The ``num_workers`` a ``StatefulDataLoader`` state was saved with, if it says."""
    snapshot = state.get("_snapshot")
    if snapshot is None:  # a single-process loader's state
        return 0 if "_index_sampler_state" in state or "fetcher_state" in state else None
    workers = (snapshot.get("_main_snapshot") or {}).get("_num_workers")
    return workers if isinstance(workers, int) else None


def _drops_cached_state(original: Callable[..., None]) -> Callable[..., None]:
    """``torchdata.nodes``' ``LoaderIterator.reset``, which forgets the state it cached."""

    def reset(self: Any, initial_state: Mapping[str, Any] | None = None) -> None:
        original(self, initial_state)
        self._cached_state_dict = None

    return reset


def _patch(owner: Any, name: str, wrap: Callable[[Any], Any]) -> None:
    """Replace ``owner.name`` by ``wrap`` of it, once (a second install finds it marked)."""
    original = getattr(owner, name)
    if not getattr(original, "_shardpipes", False):
        patched = wrap(original)
        patched._shardpipes = True
        setattr(owner, name, patched)


def install() -> None:
    """Apply the changes that the installed versions need (once; idempotent)."""
    from torch.utils.data import DataLoader, dataloader
    from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
        StatefulDataLoader,
        stateful_dataloader,
    )

    stateful_dataloader._IterDataPipeSerializationWrapper = _wrap
    dataloader._IterDataPipeSerializationWrapper = _wrap  # type: ignore[attr-defined,assignment]
    for loader_class in (DataLoader, StatefulDataLoader):
        _patch(loader_class, "__init__", _told)
        _patch(loader_class, "__iter__", _handing)
    _patch(StatefulDataLoader, "state_dict", _handing_for_state)
    _patch(StatefulDataLoader, "load_state_dict", _checked)
    if version("torchdata")[:2] <= (0, 11):
        from torchdata.nodes import loader  # type: ignore[import-untyped]

        _patch(loader.LoaderIterator, "reset", _drops_cached_state)
    if version("torchdata")[:2] == (0, 11):
        warnings.filterwarnings(
            "ignore",
            message="'set_vital' is deprecated",
            category=UserWarning,
            module=r"torchdata\.stateful_dataloader\.",
        )
