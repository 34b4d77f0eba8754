"""Advisory locks between processes writing one store: flock(2) on a directory of the store itself.

A lock on a directory needs no lock file (so Zarr sees nothing foreign in the store) and the kernel drops it
when its holder exits, however it exits (kill -9 included): a crashed build never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from featstore.errors import FeatstoreError, Name, Part

UNKNOWN_HOLDER = "another process"
LOOKS = 3  # attempts at a lock whose holder /proc/locks does not show (it may have just let go)


def lock_holder(path: Path) -> str:
    """'pid N on host H' of the process holding a lock on `path`, from /proc/locks when it can say."""
    try:
        st = path.stat()
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if inode in fields and "FLOCK" in fields:
                return f"pid {fields[fields.index(inode) - 1]} on host {socket.gethostname()}"
    except (OSError, ValueError, IndexError):
        pass
    return UNKNOWN_HOLDER


@contextmanager
def locked(path: Path, wait: bool, what: str, instead: tuple[Part, ...] = ("or use another ", Name("store"))
           ) -> Iterator[None]:
    """Hold an exclusive lock on directory `path`: wait for it, or refuse at once naming its holder (`instead`:
    what else the refusal suggests)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for attempt in range(LOOKS):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                break
            except BlockingIOError as e:
                holder = lock_holder(path)
                # nobody in /proc/locks: the holder let go between our attempt and the look; try again
                if holder == UNKNOWN_HOLDER and attempt + 1 < LOOKS:
                    continue
                raise FeatstoreError(f"{what} is being written by {holder}; wait for that featstore command to "
                                     f"finish (a rerun then resumes), ", *instead) from e
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
