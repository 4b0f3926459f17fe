"""The harness's own files on a disk the agent may fill: each record line written whole or not at
all, and a write that finds the disk full asks for room before it gives up.

The agent's workspace shares a disk with the run's folder (its record, trajectory and progress)
and often with the tracking store. Whoever guards the agent's disk use (mlrb/harness/disk_guard.py)
registers a reclaimer here while the agent runs: a write of the harness's that finds the disk
full (ENOSPC, EDQUOT) calls it, and it stops the agent and removes what it wrote past its
limit; the write is then tried once more. A write that still fails raises, and leaves the file
as it was before it: a reader never meets half a line of the harness's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

# The room the harness keeps for itself on the run folder's disk (its record, the run's notes, the
# submission's copy): 1 GiB, or 5% of a small disk.
RESERVE_BYTES = 1 << 30
RESERVE_SHARE = 0.05
FULL = (errno.ENOSPC, errno.EDQUOT)

_reclaimers: list[Callable[[], bool]] = []
_lock = threading.Lock()


def reserve_of(path: Path) -> int:
    """The bytes the harness keeps free on PATH's disk."""
    disk = os.statvfs(path)
    return min(RESERVE_BYTES, int(disk.f_blocks * disk.f_frsize * RESERVE_SHARE))


def free_bytes(path: Path) -> int:
    """The bytes an unprivileged writer may still write on PATH's disk."""
    disk = os.statvfs(path)
    return disk.f_bavail * disk.f_frsize


def is_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in FULL


@contextlib.contextmanager
def reclaiming(reclaim: Callable[[], bool]) -> Iterator[None]:
    """While the block runs, a harness write that finds the disk full calls RECLAIM (which says
    whether it freed anything) before its one more try."""
    with _lock:
        _reclaimers.append(reclaim)
    try:
        yield
    finally:
        with _lock:
            _reclaimers.remove(reclaim)


def reclaim() -> bool:
    """Ask every reclaimer for room; whether any freed some."""
    with _lock:
        reclaimers = list(_reclaimers)
    freed = False
    for each in reclaimers:
        freed = each() or freed
    return freed


def with_room(write: Callable[[], object]) -> None:
    """WRITE(); when it finds the disk full, once more after the reclaimers have made room."""
    try:
        write()
    except OSError as e:
        if not is_full(e) or not reclaim():
            raise
        write()


def replace_whole(path: Path, part: Path, write: Callable[[Path], object]) -> None:
    """PATH made anew: WRITE(PART), then PART renamed over PATH; on a failure PART goes and PATH is
    as it was (a full disk leaves no half file)."""
    try:
        write(part)
        os.replace(part, path)
    except OSError:
        part.unlink(missing_ok=True)
        raise


def append_whole(path: Path, data: bytes) -> None:
    """Append DATA to PATH whole, or leave PATH as it was (a full disk cuts no line in two)."""
    with_room(lambda: _append(path, data))


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, size)  # what was written of it goes
            raise
    finally:
        os.close(fd)


def mend(path: Path) -> None:
    """Cut off a last line left without its newline (by a process killed as it wrote it, or an
    older mlrb on a full disk), so that the next line begins a line of its own."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        size = end = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        while end > 0:  # back to the last newline
            start = max(0, end - (1 << 20))
            chunk = os.pread(fd, end - start, start)
            if b"\n" in chunk:
                os.ftruncate(fd, start + chunk.rfind(b"\n") + 1)
                return
            end = start
        os.ftruncate(fd, 0)  # not one whole line
    finally:
        os.close(fd)
