"""Ctrl-C stops a DuckDB query on the first SIGINT, whichever thread runs it and however many threads DuckDB uses.

Python runs a SIGINT handler only between bytecodes of the main thread, and DuckDB reads a SIGINT only between the
tasks its calling thread runs itself, not while that thread waits for its workers: a multi-threaded query on the
main thread can run on after a Ctrl-C. Here the C-level signal handler's wakeup byte (`signal.set_wakeup_fd`) wakes
a watcher thread, which calls `interrupt()` on every open featstore connection, again and again while the main
thread stays in the call it was in: the query cancels with DuckDB's InterruptException, and Python's
KeyboardInterrupt follows as usual (`featstore.errors.interrupted` reads both as Ctrl-C). Once the main thread has
moved on, nothing more is interrupted, so the rollback or cleanup its KeyboardInterrupt starts runs its queries
undisturbed.

Installed by the first connection opened on the main thread where SIGINT has Python's default handler and no other
wakeup fd is set (asyncio's wakeup fd, a caller's own handler and a probe's guarded write keep theirs: the watcher
then does nothing). A forked child drops it (its watcher thread does not exist there).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import weakref
from typing import Any

OPEN: weakref.WeakSet = weakref.WeakSet()  # every open featstore connection: what a Ctrl-C interrupts
RETRY_S = 0.02  # how often the watcher interrupts again while the main thread waits in the same call


class _Watch:
    """The watcher's pipe (None: not installed in this process)."""

    pipe: tuple[int, int] | None = None


def interrupt_open() -> None:
    """`interrupt()` every open connection: a running query cancels; an idle one is untouched (DuckDB clears the
    flag when a query begins)."""
    for con in list(OPEN):
        try:
            con.interrupt()
        except Exception:  # closed meanwhile
            pass


def _watch(read_fd: int) -> None:
    """The watcher thread: each SIGINT byte read from the wakeup pipe interrupts the open connections, again every
    RETRY_S while the main thread stays where it was (inside the call the signal found it in)."""
    while True:
        try:
            data = os.read(read_fd, 512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGINT not in data or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            continue  # another signal, or SIGINT handled by someone else's handler
        where = _main_position()
        while where is not None and _main_position() == where:  # stops once the main thread has moved on
            interrupt_open()
            time.sleep(RETRY_S)


def _main_position() -> tuple[int, int] | None:
    """Where the main thread's Python code stands: unchanged while it waits inside one call (a DuckDB query)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return None if frame is None else (id(frame), frame.f_lasti)


def interruptible(con: Any) -> Any:
    """`con`, registered so that a Ctrl-C interrupts its running query; installs the watcher (main thread only)."""
    OPEN.add(con)
    if threading.current_thread() is threading.main_thread():
        _install()
    return con


def _install() -> None:
    """The watcher and its wakeup fd, where SIGINT is Python's default and no one else's wakeup fd is set."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # the caller's own handler (or SIG_IGN): theirs to keep
    if _Watch.pipe is None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        _Watch.pipe = (read_fd, write_fd)
        threading.Thread(target=_watch, args=(read_fd,), name="featstore-ctrl-c", daemon=True).start()
    try:
        before = signal.set_wakeup_fd(_Watch.pipe[1], warn_on_full_buffer=False)
    except ValueError:  # not the main interpreter's main thread
        return
    if before not in (-1, _Watch.pipe[1]):  # someone else's (asyncio's): theirs to keep
        signal.set_wakeup_fd(before)


def _after_fork_in_child() -> None:
    """The watcher thread does not exist in a forked child: it starts afresh there if it opens a connection."""
    if _Watch.pipe is not None:
        try:
            before = signal.set_wakeup_fd(-1)
            if before != _Watch.pipe[1]:
                signal.set_wakeup_fd(before)  # not ours
        except ValueError:
            pass
        for fd in _Watch.pipe:
            try:
                os.close(fd)
            except OSError:
                pass
        _Watch.pipe = None
    OPEN.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
