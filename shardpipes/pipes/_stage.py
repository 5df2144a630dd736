"""What every shardpipes pipe is: a :class:`~shardpipes._core.stage.Stage` and an ``IterDataPipe``.

:class:`Pipe` adds to the protocol what a user calls on a pipe: ``state_dict()`` /
``load_state_dict()`` (the state, in an envelope with its version), ``stats()``, and
the name to write for a webdataset or torchdata method (``pipe.header(n)`` names
``limit_samples``). Its ``__iter__`` is the protocol's, not hooked by torch: a chain of
shardpipes stages pays no torch hook per item.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe, functional_datapipe, get_worker_info

from shardpipes._core.policy import Stats
from shardpipes._core.stage import Stage, as_stage
from shardpipes.pipes import _torch  # noqa: F401 - installs the adapter of torch's pipes

VERSION = 2  #: of the state's envelope

#: pipes a live DataLoader of this process reads in worker processes: the loader and its
#: num_workers (set by the loader's wrapper, see shardpipes._patches)
READ_IN_WORKERS: weakref.WeakKeyDictionary[Any, tuple[weakref.ref[Any], int]] = (
    weakref.WeakKeyDictionary()
)

#: a method of webdataset or torchdata 0.9 → what to write here
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


def _keywords_only(shuffle: Callable[..., Any]) -> Callable[..., Any]:
    """Torch's ``shuffle``, which takes its buffer size by keyword: a number says what to write.

    webdataset's ``.shuffle(1000)`` is a sample buffer; torch's would fail with "takes 2
    positional arguments but 3 were given".
    """

    def form(*args: Any, **kwargs: Any) -> Any:
        if args:
            msg = (
                f".shuffle({args[0]!r}) is torch's shuffle, which holds samples a checkpoint "
                f"cannot describe and takes buffer_size= by keyword: use "
                f".shuffle_samples({args[0]!r}) right after .open_tar (a resumable buffer)"
            )
            raise TypeError(msg)
        return shuffle(**kwargs)

    return form


def stats_of(pipe: Any) -> Stats:
    """What the reading stages of a pipeline read and skipped in the last epoch.

    The counts of each :class:`~shardpipes.ErrorPolicy` (one given to several stages
    counts once), summed over the DataLoader workers.

    Example:
        >>> import shardpipes as sp
        >>> sp.pipe_stats(sp.list_shards(["a.tar"]).open_tar().batch(2)).read
        0
    """
    return sum((p.stats() for p in as_stage(pipe).policies().values()), Stats())


class Pipe(Stage, IterDataPipe[Any]):
    """A shardpipes stage as a DataPipe (see the module docstring)."""

    def __getattr__(self, name: str) -> Any:
        try:
            found = super().__getattr__(name)  # torch's functional forms
        except AttributeError:
            if name not in HINTS:
                raise
            msg = (
                f"'{type(self).__name__}' object has no attribute '{name}': with shardpipes, "
                f"use {HINTS[name]} (see docs/migrating.md)"
            )
            raise AttributeError(msg) from None
        return _keywords_only(found) if name == "shuffle" else found

    def begin(self) -> None:
        """Start an iteration (see :class:`~shardpipes._core.stage.Stage`)."""
        if get_worker_info() is None:  # read here: its own state is this process's
            READ_IN_WORKERS.pop(self, None)
        super().begin()

    def stats(self) -> Stats:
        """What the current (or last) epoch read and skipped, over all DataLoader workers.

        See :class:`~shardpipes.Stats`; counted by the reading stages'
        :class:`~shardpipes.ErrorPolicy` (their ``handler``).
        """
        return stats_of(self)

    def state_dict(self) -> dict[str, Any]:
        """Where the pipeline ending here is, between two items: plain data for a checkpoint.

        Raises:
            ValueError: Asked in the main process of a DataLoader that reads this pipe in
                worker processes (save the loader's state), or the pipeline holds a stage
                that cannot be resumed.
        """
        loader, workers = READ_IN_WORKERS.get(self, (None, 0))
        if loader is not None and loader() is not None and get_worker_info() is None:
            msg = (
                f"this pipe is read by a DataLoader's {workers} worker processes: its state in "
                "this process holds nothing they read, and resuming from it would repeat the "
                "epoch. Save the loader's state instead: loader.state_dict() of a "
                "torchdata StatefulDataLoader (it gathers the workers'); sp.resume_from and "
                "load_state_dict take it"
            )
            raise ValueError(msg)
        return envelope(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume, at the next iteration, from a :meth:`state_dict` of this pipeline.

        Raises:
            ValueError: If the state is not one of this version, or does not fit this
                pipeline (another shard list, seed, split or number of workers: when
                iteration starts, saying which).
        """
        self.reset(pipeline_state(state))


def envelope(stage: Any) -> dict[str, Any]:
    """A pipeline's state as a checkpoint holds it: with its version, worker and epoch.

    ``workers``/``worker``: its place among the workers × ranks that read the epoch (the
    canonical workers ``resume_from`` replays); ``skipped``: errors a handler skipped
    this epoch (a replay cannot foresee them).
    """
    root = as_stage(stage)
    total, worker = root.placement()
    return {
        "shardpipes": VERSION,
        "pipeline": root.state(),
        "workers": total,
        "worker": worker,
        "epoch": root.epoch,
        "skipped": stats_of(stage).errors,
    }


def pipeline_state(state: Any) -> Any:
    """The pipeline's state in a :meth:`Pipe.state_dict` envelope, checked.

    Raises:
        ValueError: Not a shardpipes state, or of another version.
    """
    if isinstance(state, Mapping) and state.get("shardpipes") == VERSION:
        if "pipeline" in state:
            return state["pipeline"]
        found = "a version 2 envelope with no 'pipeline'"
    else:
        found = repr(
            state.get("shardpipes") if isinstance(state, Mapping) else type(state).__name__
        )
    msg = (
        f"not a shardpipes state of version {VERSION} (got {found}): a state_dict() "
        "of this pipeline, or a StatefulDataLoader's state of it"
    )
    raise ValueError(msg)


C = TypeVar("C", bound=type)


def functional_form(name: str) -> Callable[[C], C]:
    """Register a stage as ``pipe.<name>(...)``, as torch's ``functional_datapipe`` does.

    torch's registered function takes the stage's class as a first parameter named
    ``cls`` (then ``enable_df_api_tracing``, ``source_dp``), so that ``pipe.map_fields(
    cls=int)`` or ``pipe.decode(cls=f)`` fails inside torch with "multiple values for
    argument 'cls'". The function registered here passes every keyword to the stage.
    """

    def register(stage: C) -> C:
        functional_datapipe(name)(stage)

        def form(source_dp: IterDataPipe[Any], /, *args: Any, **kwargs: Any) -> Any:
            return stage(source_dp, *args, **kwargs)

        form.__doc__ = stage.__doc__
        IterDataPipe.functions[name] = form
        return stage

    return register


class Functions:
    """A stage's functions by name (decoders, field functions), held out of torch's graph walk.

    torch's traversal (``apply_sharding``, ``apply_random_seed``, run by every
    ``DataLoader``) pickles a pipe's ``dict`` attributes, which fails on a lambda; this
    holder is not a collection, so the walk passes it by. It pickles as a dict does
    (``spawn`` workers need functions that pickle, as for any pipe).
    """

    __slots__ = ("items",)

    def __init__(self, items: dict[str, Any]) -> None:
        self.items = items

    def __getstate__(self) -> dict[str, Any]:
        return self.items

    def __setstate__(self, items: dict[str, Any]) -> None:
        self.items = items

    def __repr__(self) -> str:
        return repr(self.items)


def reads_ours(pipe: Any) -> bool:
    """Whether a shardpipes stage stands in the chain that ends at ``pipe``."""
    for _ in range(10_000):  # a chain, not a graph: each pipe's one source
        if isinstance(pipe, Pipe):
            return True
        pipe = getattr(pipe, "datapipe", getattr(pipe, "source_datapipe", None))
        if pipe is None:
            return False
    return False
