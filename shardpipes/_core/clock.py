"""The epoch of a stage that plans one (``split_shards``, ``mix``): given, never inferred.

The epoch is ``set_epoch(e)`` or a loaded state's; a bare iteration after one that began
is the next (:meth:`~shardpipes._core.stage.Stage.begin`). :class:`EpochClock` is that
one counter, and its pass within the epoch.
"""

from __future__ import annotations

from typing import Any

from shardpipes._core.stage import Stage, checked_int


class EpochClock:
    """The epoch of a stage that plans one (``split_shards``, ``mix``), and its pass.

    ``pass_`` counts the passes over the source within the epoch (``cycle_epochs``, a
    ``mix`` with ``epoch_size``): each has its own order. ``begun``: the epoch has been
    handed to an iteration. ``given``: the user chose the epoch (``set_epoch``) since.
    """

    def __init__(self) -> None:
        self.epoch, self.pass_ = 0, 0
        self.begun = self.given = False
        self.loaded: int | None = None  # the epoch of a loaded state not yet begun

    def set(self, epoch: int, *, given: bool) -> None:
        """Make ``epoch`` the next iteration's, from its first pass."""
        checked_int(epoch, "epoch", 0)
        self.epoch, self.pass_, self.begun, self.given = epoch, 0, False, given

    def restart(self) -> None:
        """Back to the epoch's start (``reset()`` without a state)."""
        self.pass_, self.begun, self.loaded = 0, False, None

    def start(self) -> None:
        """The epoch is begun here (or handed out).

        Raises:
            ValueError: ``set_epoch`` chose another epoch than a state loaded before it.
        """
        if self.loaded is not None and self.given and self.loaded != self.epoch:
            self._refuse(self.loaded)
        self.begun, self.loaded = True, None

    def _refuse(self, saved: int) -> None:
        msg = (
            f"the state was saved in epoch {saved}; this pipe was set to epoch {self.epoch} "
            "(set_epoch): set the epoch the checkpoint was taken in"
        )
        raise ValueError(msg)

    def next_pass(self) -> None:
        """The next pass over the source, in the same epoch."""
        self.pass_, self.begun = self.pass_ + 1, False

    def state(self) -> dict[str, Any]:
        """The clock as plain data (a part of its stage's state)."""
        return {"epoch": self.epoch, "pass": self.pass_, "begun": self.begun}

    def load(self, state: Any, what: str) -> None:
        """Take a saved clock, after checking it against a ``set_epoch`` made since.

        Raises:
            ValueError: ``state`` holds no epoch, or not the one ``set_epoch`` chose.
        """
        if not isinstance(state, dict) or not isinstance(state.get("epoch"), int):
            msg = f"not a {what} state (it has no epoch): {str(state)[:200]}"
            raise ValueError(msg)
        if self.given and state["epoch"] != self.epoch:
            self._refuse(state["epoch"])
        self.epoch, self.pass_ = state["epoch"], int(state.get("pass", 0))
        self.begun, self.given = bool(state.get("begun", True)), False
        self.loaded = self.epoch


class Clocked(Stage):
    """A stage that plans epochs (``split_shards``, ``mix``): its epoch is its clock's."""

    clock: EpochClock
    takes_epoch = True

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) iteration."""
        return self.clock.epoch

    @property
    def pass_(self) -> int:
        """The pass within the epoch (``cycle_epochs``, a ``mix`` with ``epoch_size``)."""
        return self.clock.pass_

    def begun(self) -> bool:
        return self.clock.begun

    def hand_out(self) -> None:
        """The epoch is handed to loader workers: it begins (see ``EpochClock.start``)."""
        self.clock.start()
        super().hand_out()
