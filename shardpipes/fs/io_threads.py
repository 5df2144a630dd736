"""One pool of daemon I/O threads per process, started anew in a forked child."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Task", "io_threads"]

Task = Callable[[], None]
_pool: dict[str, Any] = {"pid": -1, "threads": 0, "tasks": None}
_pool_lock = threading.Lock()


def io_threads(n: int) -> queue.SimpleQueue[Task]:
    """The process's task queue, served by at least ``n`` daemon threads."""
    with _pool_lock:
        if _pool["pid"] != os.getpid():  # first use, or a forked child: threads anew
            _pool.update(pid=os.getpid(), threads=0, tasks=queue.SimpleQueue())
        tasks: queue.SimpleQueue[Task] = _pool["tasks"]
        while _pool["threads"] < n:
            thread = threading.Thread(target=_serve, args=(tasks,), name="shardpipes-io")
            thread.daemon = True
            thread.start()
            _pool["threads"] += 1
        return tasks


def _serve(tasks: queue.SimpleQueue[Task]) -> None:
    while True:
        tasks.get()()
