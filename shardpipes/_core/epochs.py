"""The epoch counter: each new iteration of a pipeline is the next epoch.

A pipeline handed to a DataLoader is iterated in worker processes that, unless
``persistent_workers``, are new every epoch: a counter kept in the pipe object would start
again at 0 in each. :class:`EpochCounter` keeps it in a :class:`SharedTable` owned by the
process that built the pipe, so that

* every worker of an iteration is in the same epoch: an iteration is new when its key
  differs from the last one's — the DataLoader's shared seed, which is the same for the
  workers of one iteration and new for the next (torch's DataLoader draws one per
  ``iter()``, ``persistent_workers`` or not); the first worker to begin it counts it, the
  others find it counted. Without a key (iterated directly) every iteration is new;
* :meth:`set` (``set_epoch``) makes the next iteration exactly that epoch, wherever it
  is called — also for persistent workers, which never see the main process's copy of
  the pipe again.
"""

from __future__ import annotations

from shardpipes._core.shared import ROWS, SharedTable

__all__ = ["EpochCounter"]

# the header row's cells
_SET, _GENERATION, _APPLIED, _EPOCH, _KEYED, _KEY, _CHOSEN = range(7)


class EpochCounter:
    """Which epoch an iteration of a pipeline is in, over all its processes.

    Args:
        epoch: The first epoch.
    """

    def __init__(self, epoch: int = 0) -> None:
        self._table = SharedTable(7)
        self._set(epoch, chosen=False)

    def set(self, epoch: int) -> None:
        """Make ``epoch`` the next iteration's epoch (``set_epoch``: see :meth:`chosen`)."""
        self._set(epoch, chosen=True)

    def _set(self, epoch: int, *, chosen: bool) -> None:
        with self._table.locked():
            self._table.set(ROWS, _SET, epoch)
            self._table.set(ROWS, _CHOSEN, int(chosen))
            self._table.add(ROWS, _GENERATION)

    def begin(self, key: int | None) -> int:
        """An iteration begins (in some worker): its epoch.

        Args:
            key: The DataLoader's shared seed of this iteration, or ``None``.
        """
        table = self._table
        with table.locked():
            if table.get(ROWS, _APPLIED) != table.get(ROWS, _GENERATION):  # set() since
                table.set(ROWS, _APPLIED, table.get(ROWS, _GENERATION))
                table.set(ROWS, _EPOCH, table.get(ROWS, _SET))
            elif key is None or not table.get(ROWS, _KEYED) or table.get(ROWS, _KEY) != key:
                table.add(ROWS, _EPOCH)
            table.set(ROWS, _KEYED, key is not None)
            table.set(ROWS, _KEY, key if key is not None else 0)
            return table.get(ROWS, _EPOCH)

    def peek(self, key: int | None) -> int:
        """The epoch an iteration with ``key`` would be, were it to begin now.

        As :meth:`begin` says, counting nothing.
        """
        table = self._table
        with table.locked():
            if table.get(ROWS, _APPLIED) != table.get(ROWS, _GENERATION):
                return table.get(ROWS, _SET)
            if key is None or not table.get(ROWS, _KEYED) or table.get(ROWS, _KEY) != key:
                return table.get(ROWS, _EPOCH) + 1
            return table.get(ROWS, _EPOCH)

    def chosen(self) -> int | None:
        """The epoch :meth:`set` chose for the next iteration, if no iteration began since.

        ``None`` too for the first epoch given to the constructor: nobody chose it.
        """
        table = self._table
        with table.locked():
            pending = table.get(ROWS, _APPLIED) != table.get(ROWS, _GENERATION)
            return table.get(ROWS, _SET) if pending and table.get(ROWS, _CHOSEN) else None

    def resumed(self, epoch: int) -> None:
        """The current iteration is (or was) ``epoch``, resumed from a checkpoint."""
        table = self._table
        with table.locked():
            table.set(ROWS, _APPLIED, table.get(ROWS, _GENERATION))
            table.set(ROWS, _EPOCH, epoch)

    def current(self) -> int:
        """The epoch of the last iteration, or of the next one if none began since ``set``."""
        table = self._table
        if table.get(ROWS, _APPLIED) != table.get(ROWS, _GENERATION):
            return table.get(ROWS, _SET)
        return table.get(ROWS, _EPOCH)
