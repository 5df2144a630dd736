"""Chained sample stages that run as one generator: one torch hook per item, not one per stage.

Every torch ``IterDataPipe`` stage pays its iterator hook (validity check, counter) on
every item it passes on: about 1.3 µs per stage per sample with torch 2.13, more than the
tar reader spends parsing a small member. A :class:`SampleStage` chained after another
(``open_tar().shuffle_samples().decode().to_tuple()``) composes its step with the
upstream stage's plain generator instead of iterating that stage's hooked iterator: the
chain runs exactly the steps it names, in one generator under the last stage's hook. A
downstream stage also tells the upstream ones which fields it keeps (``to_tuple`` after
``decode``: only those are decoded).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch.utils.data import IterDataPipe, functional_datapipe
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

__all__ = ["ChainState", "Functions", "SampleStage", "functional_form", "graph_pipes", "upstream"]

# torch's traverse_dps sets a class-wide pickling hook while it runs: two threads of one
# process traversing at once (a prefetch_items thread taking a snapshot, the worker taking
# the loader's state) fail with "Attempt to override existing reduce_ex_hook"
_TRAVERSING = threading.RLock()


def graph_pipes(pipe: IterDataPipe[Any]) -> list[Any]:
    """Every pipe of ``pipe``'s graph, itself included, in a stable order (thread-safe)."""
    with _TRAVERSING:
        return list(get_all_graph_pipes(traverse_dps(pipe)))


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


class ChainState:
    """``state_dict`` / ``load_state_dict`` of the whole pipeline that ends at this stage.

    For stages with a count of their own (``mix``, ``limit_samples``, ``cycle_epochs``,
    ``prefetch_items``), which often end a chain, where a user asks for its state: their
    count alone would resume the reading from the epoch's start. The count is
    ``own_state`` / ``load_own``, held in the pipeline's state.
    """

    def state_dict(self) -> dict[str, Any]:
        """The state of the pipeline that ends here (reading positions, buffers, counts).

        What ``sp.Resumable(pipe).state_dict()`` gives.

        Raises:
            ValueError: Asked in the main process of a DataLoader that reads this pipe in
                worker processes (save the loader's state).
        """
        from shardpipes.pipes._loader import check_read_here
        from shardpipes.pipes.resumable import pipeline_state

        check_read_here(self)  # type: ignore[arg-type]
        return pipeline_state(self)  # type: ignore[arg-type]

    def load_state_dict(self, state: Any) -> None:
        """Resume the pipeline that ends here from a :meth:`state_dict`, at its next iteration.

        Raises:
            ValueError: If the state is not one of this pipeline's shape.
        """
        from shardpipes.pipes.resumable import load_pipeline_state

        load_pipeline_state(self, state)  # type: ignore[arg-type]


class SampleStage(IterDataPipe[Any]):
    """A shardpipes stage over samples; see the module docstring."""

    source_datapipe: IterDataPipe[Any]

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Any]:
        """This stage's items, composed with the upstream stages' generators.

        Args:
            wanted: The only fields a downstream stage keeps (``None``: all).
        """
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        # a generator: torch's hook names this stage in the errors raised in it
        yield from self._stream(None)


def upstream(source: IterDataPipe[Any], wanted: frozenset[str] | None = None) -> Iterator[Any]:
    """``source``'s items: its plain generator if it is a sample stage, else ``iter(source)``."""
    if isinstance(source, SampleStage):
        return source._stream(wanted)
    return iter(source)


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
