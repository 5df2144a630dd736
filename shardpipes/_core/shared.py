"""A small table of int64 cells in shared memory, one row per DataLoader worker.

What the workers of one pipeline must see of each other lives here: the error counters of
an :class:`~shardpipes.ErrorPolicy`, the epoch each worker is in. The process that builds
the pipeline owns the segment; DataLoader workers started by ``fork`` inherit the mapping,
those started by ``spawn`` or ``forkserver`` attach to it by name when the pipe is
unpickled. A copy unpickled in the process that made it (``copy.deepcopy``, a pickle
round trip) gets a table of its own, with the same cells. Each worker writes only its
own row. Where shared memory is unavailable the table is private
to each process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any

ROWS = 1024  # DataLoader workers per process that a table can tell apart


class SharedTable:
    """``ROWS`` rows of ``width`` int64 cells, plus one header row, in shared memory.

    Args:
        width: Cells per row.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        size = (ROWS + 1) * width * 8
        try:
            shm = shared_memory.SharedMemory(create=True, size=size)
        except OSError:
            self._name, self._view = None, _private(size)
            return
        self._name = shm.name
        self._attach(shm, owner=True)

    def _attach(self, shm: shared_memory.SharedMemory, *, owner: bool) -> None:
        buf = shm.buf
        assert buf is not None  # an open segment
        self._view = buf.cast("q")
        weakref.finalize(self, _release, self._view, shm, owner)

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = {"width": self.width, "name": self._name, "pid": os.getpid()}
        if self._name is None:
            state["data"] = self._view.tobytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.width, self._name = state["width"], state["name"]
        size = (ROWS + 1) * self.width * 8
        if state["pid"] == os.getpid():  # a copy in the same process: a table of its own
            data = self._view_of(state).tobytes() if self._name is not None else state["data"]
            self.__init__(self.width)  # type: ignore[misc]
            self._view[:] = memoryview(data).cast("q")
            return
        if self._name is None:
            self._view = _private(size, state["data"])
            return
        try:
            shm = shared_memory.SharedMemory(name=self._name)
        except OSError:  # gone (its owner was collected): keep a private table
            self._name, self._view = None, _private(size)
            return
        self._attach(shm, owner=False)

    @staticmethod
    def _view_of(state: dict[str, Any]) -> memoryview:
        """The cells of the (live) table a state names, copied."""
        shm = shared_memory.SharedMemory(name=state["name"])
        if sys.version_info < (3, 13):  # attaching registered it for unlinking at exit
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        try:
            assert shm.buf is not None
            return memoryview(bytes(shm.buf))
        finally:
            shm.close()

    def get(self, row: int, column: int) -> int:
        """One cell; ``row`` ``ROWS`` is the header."""
        return int(self._view[row * self.width + column])

    def set(self, row: int, column: int, value: int) -> None:
        """Set one cell (a no-op once the table was released at exit)."""
        with contextlib.suppress(ValueError):
            self._view[row * self.width + column] = value

    def add(self, row: int, column: int, n: int = 1) -> None:
        """Add ``n`` to one cell (a no-op once the table was released at exit)."""
        with contextlib.suppress(ValueError):
            self._view[row * self.width + column] += n

    def clear(self, row: int) -> None:
        """Zero one row."""
        for column in range(self.width):
            self.set(row, column, 0)


def _private(size: int, data: bytes | None = None) -> memoryview:
    """A table in this process's memory only (no shared memory, or it is gone)."""
    return memoryview(bytearray(data if data is not None else bytes(size))).cast("q")


def _release(view: memoryview, shm: shared_memory.SharedMemory, owner: bool) -> None:
    view.release()
    shm.close()
    if owner:
        with contextlib.suppress(FileNotFoundError):
            shm.unlink()
