"""Forked DataLoader workers must not unhook the parent's fsspec sockets.

A DataLoader forks its workers from a process that has often read a bucket already (listing
shards, counting samples): the child inherits fsspec's I/O event loop object, its selector
and the pooled keep-alive connections of every cached filesystem. fsspec resets its loop and
drops its instance cache in the child; when the child's garbage collector then finalizes a
dropped HTTP or S3 filesystem, its connector closes the inherited transports, and each close
removes the socket from the loop's selector. That selector's epoll set is the *parent's*
(an epoll instance is shared across ``fork``, and the child's socket descriptors name the
same open files), so the parent's loop stops hearing from those sockets: its next request
on a pooled connection waits for the client timeout, 300 s with aiohttp's default.

:func:`install` registers fork hooks that give the inherited loop a private selector in the
child and mark it not running, so whatever the child closes touches only its own copies.
It is installed when :mod:`shardpipes.fs` is imported.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import sys

__all__ = ["install"]

_inherited: list[asyncio.AbstractEventLoop | None] = [None]
_installed = [False]


def _before_fork() -> None:
    asyn = sys.modules.get("fsspec.asyn")
    _inherited[0] = asyn.loop[0] if asyn is not None else None


def _after_fork_in_parent() -> None:
    _inherited[0] = None


def _after_fork_in_child() -> None:
    loop, _inherited[0] = _inherited[0], None
    if loop is None or not hasattr(loop, "_selector"):
        return  # no loop yet, or not a selector loop (uvloop): nothing known to detach
    # The old selector object goes with its epoll descriptor: closing the child's copy of
    # that descriptor leaves the parent's epoll set as it was.
    loop._selector = selectors.DefaultSelector()
    # The loop's thread stayed in the parent: finalizers must not wait on it (fsspec's
    # close_session would wait 0.1 s per filesystem and poke the parent's self-pipe).
    loop._thread_id = None  # type: ignore[attr-defined]


def install() -> None:
    """Register the fork hooks once per process (a no-op where ``fork`` does not exist)."""
    if _installed[0] or not hasattr(os, "register_at_fork"):
        return
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
    _installed[0] = True
