"""The one protocol every stage follows: torchdata.nodes' contract, torch-free.

A stage answers for itself and asks only its source (``source_datapipe``; a ``mix`` asks
each of its ``sources``), never another stage's type, and nothing walks the graph:

* ``state()`` is its own position plus ``{"source": source.state()}``; a stage that holds
  nothing between two items gives its source's as it is.
* ``reset(state=None)`` applies a state at once (``None``: the start of the current
  epoch), so ``state()`` right after it describes where the next iteration starts; the
  next iteration starts there instead of moving on.
* The epoch is given: ``set_epoch(e)`` chooses it, a loaded state carries it. A bare
  iteration after one that began is the next epoch (:meth:`Stage.begin`): the one
  counter, held by the stages that plan an epoch (``split_shards``, ``mix``).
* ``length(total, worker)``: the items it yields in an epoch for global worker ``worker``
  of ``total`` (``None``: all of them together), or torch's ``TypeError``.
* ``references()`` iterates on sample references alone (no byte read), and
  ``fetch(refs)`` gives the items those references make (``regroup(refs)``: their shape,
  on references): what ``resume_from`` and the restoring of a shuffle buffer are made of.

Stages of other libraries (torch's ``map``, ``filter``, ``batch``, ``collate``) are
adapted in one place: :func:`as_stage` hands them to the adapter the torch layer
installs (``shardpipes.pipes._torch``), which refuses the ones it cannot describe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn

#: the torch layer's adapter: a foreign pipe -> a Stage view of it (or an error)
_ADAPTER: Callable[[Any], Stage] | None = None


def install_adapter(adapter: Callable[[Any], Stage]) -> None:
    """Set how pipes that are not stages (torch's ``map``, ``batch``…) are seen as stages."""
    global _ADAPTER
    _ADAPTER = adapter


def as_stage(pipe: Any) -> Stage:
    """``pipe`` itself if it is a stage, else the adapter's view of it.

    Raises:
        ValueError: The adapter cannot describe it (torch's ``shuffle``…), naming it.
    """
    if isinstance(pipe, Stage):
        return pipe
    if _ADAPTER is None:
        msg = f"a {type(pipe).__name__} is not a shardpipes stage"
        raise ValueError(msg)
    return _ADAPTER(pipe)


def no_length(pipe: Any, why: str) -> NoReturn:
    """Raise torch's standard error for a pipe whose length is not known, and why."""
    msg = f"{type(pipe).__name__} instance doesn't have valid length: {why}"
    raise TypeError(msg)


def checked_int(value: Any, name: str, minimum: int = 1, *, optional: bool = False) -> Any:
    """``value`` if it is an int of at least ``minimum`` (or ``None``, when ``optional``)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else "a non-negative int"
        msg = f"{name} must be {kind}{' or None' if optional else ''} (got {value!r})"
        raise ValueError(msg)
    return value


def is_rest(state: Any) -> bool:
    """Whether a pipeline state is the rest of an epoch ``sp.resume_from`` began (its root's)."""
    return isinstance(state, Mapping) and "rest" in state and "done" in state


def loaded_state(state: Any, what: str, key: str, **same: Any) -> Any:
    """A state given to ``what``'s ``reset``, checked: ``None``, or a mapping with ``key``.

    ``same``: settings the state was saved with that this stage must have too (a count
    that cut the saved epoch: ``n=5``), refused naming both.

    Raises:
        ValueError: Not ``what``'s state, or saved with another setting.
    """
    if state is None:
        return None
    if is_rest(state):
        msg = (
            f"this is the state of the rest of an epoch that sp.resume_from began, not a "
            f"{what} state: load it into sp.Resumable(pipe) (which the DataLoader and the "
            "recipes use), or give it to sp.resume_from(pipe, state) on any topology"
        )
        raise ValueError(msg)
    if not isinstance(state, Mapping) or key not in state:
        msg = f"not a {what} state (it has no {key!r}): {str(state)[:200]}"
        raise ValueError(msg)
    for name, mine in same.items():
        if state.get(name) != mine:
            msg = (
                f"the state was saved with {what}({name}={state.get(name)!r}); this pipe has "
                f"{what}({name}={mine!r}): resume with the same {name}"
            )
            raise ValueError(msg)
    return state


def on_items(stage: Stage, what: str) -> None:
    """Refuse a state of a counting stage that stands where shards flow, not items.

    Raises:
        ValueError: ``what`` stands before ``open_tar`` (it would count shards, which a
            reading stage's position does not describe), saying where it goes.
    """
    if stage.sources()[0].yields == "shards":
        msg = (
            f"{what} stands before open_tar, where it counts shard URLs: a checkpoint "
            f"cannot describe that. Put {what} after open_tar (on samples or batches)"
        )
        raise ValueError(msg)


class Stage:
    """The protocol, with the defaults of a stage that holds nothing between two items.

    One source, ``source_datapipe``; a stage with several overrides :meth:`sources`. Its
    iteration is :meth:`_iterate` (a generator over ``iter(source)``), its iteration on
    references :meth:`_references`.
    """

    source_datapipe: Any
    _fresh = False  # reset() has set up the next iteration, which has not begun

    # -- the graph, as the stage sees it ----------------------------------------------------

    def sources(self) -> list[Stage]:
        """The stages this one reads (its source, as a stage)."""
        return [as_stage(self.source_datapipe)]

    # -- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        self.begin()
        return self._iterate()

    def begin(self) -> None:
        """Start an iteration: the one :meth:`reset` set up, else the next epoch's."""
        if not self._fresh:
            self.advance()
            self.reset()
        self._fresh = False

    def advance(self) -> None:
        """Move on to the next epoch if the current one has begun (else stay in it).

        What a bare iteration does before it starts: a pipe only built, set to an epoch, or
        reset and not yet read starts where it is; one that has read moves on by one.
        """
        if self.begun():
            self.set_epoch(self.epoch + 1, given=False)

    def _iterate(self) -> Iterator[Any]:
        return iter(self.source_datapipe)

    def references(self) -> Iterator[Any]:
        """This stage's items made of sample references (no byte read): see ``resume_from``."""
        self.begin()
        return self._references()

    def _references(self) -> Iterator[Any]:
        return self.sources()[0].references()

    def fetch(self, refs: Iterable[Any]) -> Iterator[Any]:
        """The items that sample references ``refs`` make here, in their order."""
        return self.sources()[0].fetch(refs)

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> Any:
        """Where the pipeline ending here is, between two items it yields: plain data."""
        return self.sources()[0].state()

    def reset(self, state: Any = None) -> None:
        """Set up the next iteration at ``state`` (``None``: the current epoch's start), now."""
        self._fresh = True
        for source in self.sources():
            source.reset(state)

    def next_pass(self) -> None:
        """Set up another pass over the source in this epoch (a new order: see ``pass``)."""
        self._fresh = True
        for source in self.sources():
            source.next_pass()

    # -- epochs, placement, seeds --------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) iteration."""
        return self.sources()[0].epoch

    @property
    def pass_(self) -> int:
        """The pass over the source within the epoch (see :meth:`next_pass`)."""
        return self.sources()[0].pass_

    def set_epoch(self, epoch: int, *, given: bool = True) -> None:
        """Make ``epoch`` the next iteration's (as ``DistributedSampler.set_epoch``).

        Args:
            epoch: The epoch.
            given: Chosen by the user (a state of another epoch loaded after it is then
                refused); ``False`` when a bare iteration moves on by itself.
        """
        for source in self.sources():
            source.set_epoch(epoch, given=given)

    def begun(self) -> bool:
        """Whether the current epoch has begun (a bare iteration then moves to the next)."""
        return any(source.begun() for source in self.sources())

    def hand_out(self) -> None:
        """The current epoch is given to an iteration that runs elsewhere (loader workers)."""
        for source in self.sources():
            source.hand_out()

    def placement(self) -> tuple[int, int]:
        """``(total workers, this worker's global index)`` of the current iteration."""
        return self.sources()[0].placement()

    def place(self, placed: tuple[int, int] | None) -> None:
        """Read as global worker ``placed[1]`` of ``placed[0]`` (``None``: as found)."""
        for source in self.sources():
            source.place(placed)

    def split_seed(self) -> int | None:
        """The fixed seed of the shard order (``split_shards(seed=)``), if one was given."""
        return self.sources()[0].split_seed()

    @property
    def even(self) -> bool:
        """Whether every worker reads as many samples (``split_shards(even=True)``)."""
        return all(source.even for source in self.sources())

    @property
    def endless(self) -> bool:
        """Whether an epoch never ends (``resample=True``, ``cycle_epochs()``)."""
        return any(source.endless for source in self.sources())

    @property
    def exact(self) -> bool:
        """Whether items can be counted on references (no ``filter`` upstream decides)."""
        return all(source.exact for source in self.sources())

    @property
    def seeded(self) -> bool:
        """Whether the order is a function of fixed seeds (not of a DataLoader's, or random)."""
        return all(source.seeded for source in self.sources())

    @property
    def split(self) -> bool:
        """Whether something upstream splits the shards between workers."""
        return all(source.split for source in self.sources())

    @property
    def yields(self) -> str | None:
        """What its items are: ``"shards"``, ``"samples"``, ``"tuples"``, ``"batches"``.

        ``None``: not known (a function of the user's).
        """
        return self.sources()[0].yields

    @property
    def takes_epoch(self) -> bool:
        """Whether a stage upstream plans epochs (``set_epoch`` reaches something)."""
        return any(source.takes_epoch for source in self.sources())

    def listed_options(self) -> dict[str, Any]:
        """The ``storage_options`` given where the shards are listed (``list_shards``)."""
        return self.sources()[0].listed_options()

    def parts(self, total: int, worker: int, *, any_order: bool = False) -> Any:
        """Global worker ``worker`` of ``total``'s shard parts this epoch, with sample counts.

        ``(parts, {url: samples})``, from the shards' ``.idx`` sidecars. ``any_order``: the
        order may be any (a sum over every worker does not depend on it).

        Raises:
            TypeError: The counts are not known, or depend on a seed not known yet.
        """
        return self.sources()[0].parts(total, worker, any_order=any_order)

    def want(self, fields: frozenset[str] | None) -> None:
        """Only ``fields`` of each sample are kept downstream (a decoder decodes only those)."""
        for source in self.sources():
            source.want(fields)

    def check_loaded(self) -> None:
        """Check a loaded state against the pipe now: this epoch will not read it here.

        A stage whose epoch is over when it starts (a limit at its count) leaves its source
        unread, and so unchecked: it calls this instead.
        """
        for source in self.sources():
            source.check_loaded()

    def defer_check(self) -> None:
        """Let the shard list's existence check run while the first shard is read."""
        for source in self.sources():
            source.defer_check()

    def checked(self, *, first: bool = False) -> None:
        """Wait for a check begun by :meth:`defer_check`; raise what it found.

        ``first``: before the epoch's first sample, where a long check may go on.
        """
        for source in self.sources():
            source.checked(first=first)

    def policies(self) -> dict[int, Any]:
        """The error policies of the reading stages upstream, by ``id``."""
        found: dict[int, Any] = {}
        for source in self.sources():
            found.update(source.policies())
        return found

    # -- length ----------------------------------------------------------------------------------

    def length(self, total: int, worker: int | None) -> int:
        """Items yielded in an epoch by global worker ``worker`` of ``total`` (``None``: all).

        Raises:
            TypeError: The length is not known (the message says why).
        """
        return self.sources()[0].length(total, worker)

    def regroup(self, refs: Iterable[Any]) -> Iterator[Any]:
        """The items :meth:`fetch` would make of ``refs``, made of the references themselves."""
        return self.sources()[0].regroup(refs)

    def __len__(self) -> int:
        return self.length(*self.placement())


class Leaf(Stage):
    """A stage with no source (a list of shards): nothing to set up, no epoch of its own.

    What :class:`Stage` does over every source is nothing here; the rest is answered below.
    """

    def sources(self) -> list[Stage]:
        return []

    def state(self) -> Any:
        return {}

    epoch = pass_ = 0

    def split_seed(self) -> int | None:
        return None

    even = split = False
    yields: str | None = "shards"

    def listed_options(self) -> dict[str, Any]:
        return {}

    def parts(self, total: int, worker: int, *, any_order: bool = False) -> Any:
        no_length(self, "its shards are not split by split_shards")
