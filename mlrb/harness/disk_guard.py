"""The agent's disk: its folders (the workspace and its own state folder) may hold at most
`sandbox.disk_gb`, and the disk they are on keeps the harness's reserve free
(mlrb/core/disk.py), in either sandbox.

A thread of the harness looks at the disk's free space every half second and measures the
agent's folders every few seconds (the space their files take on disk, sparse files as
allocated). A write of the harness's own that finds the disk full asks it too, at once. Past
either limit the agent is stopped (its processes killed, its model calls refused: the budget's
limit `disk`), and what it wrote is removed, its largest files first and its submission last,
until its folders are within their limit and the disk has room for the rest of the run (the
harness's reserve, and a copy of what is left for each copy the run may still make: the final
snapshot's and the store's, the submission's and the scorer's); each file removed is named in
the run's notes. The run then ends as one that reached a limit of its
budget: `budget_exhausted`, its workspace scored as it is left. Going past its disk is the
agent's doing, and counts against it; the record, the trajectory and the store never share its fate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mlrb.core import disk

log = logging.getLogger(__name__)

LIMIT = "disk"  # the budget's limit the run ends at
POLL_S = 0.5  # how often the disk's free space is looked at
MEASURE_S = 5.0  # how often, at least, the agent's folders are measured (more seldom when measuring is slow)
COPIES = 4  # the copies the rest of a run may make of what the agent left (see `remove_past_limits`)


def gib(size: float) -> str:
    return f"{size / (1 << 30):.2f} GiB"


class DiskGuard:
    def __init__(
        self,
        folders: list[Path],
        limit_bytes: int,
        stop: Callable[[str, Callable[[], None]], None],
        keep: Path | None = None,
    ):
        """FOLDERS: the agent's (the first one's disk is watched); LIMIT_BYTES: what they may hold;
        STOP(why, meanwhile): ends the agent, running MEANWHILE while its processes stand still
        (the removal: nothing writes more); KEEP: the submission, removed last."""
        self.folders, self.limit, self.stop, self.keep = [Path(f) for f in folders], limit_bytes, stop, keep
        self.reserve = disk.reserve_of(self.folders[0])
        self.tripped: str | None = None  # why the agent was stopped, once it was
        self.notes: list[str] = []  # each file removed
        self.lock = threading.Lock()
        self.done = threading.Event()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Watch while the agent runs: the disk's free space and what its folders hold."""
        thread = threading.Thread(target=self.watch, name="disk-guard", daemon=True)
        self.done.clear()
        thread.start()
        try:
            yield
        finally:
            self.done.set()
            thread.join()

    def watch(self) -> None:
        next_measure = time.monotonic()
        while not self.done.wait(POLL_S):
            try:
                if disk.free_bytes(self.folders[0]) < self.reserve:
                    self.trip(
                        f"the disk holding its workspace is full ({gib(disk.free_bytes(self.folders[0]))} "
                        f"free; the harness keeps {gib(self.reserve)})"
                    )
                elif time.monotonic() >= next_measure:
                    started = time.monotonic()
                    used = self.used()
                    next_measure = time.monotonic() + max(MEASURE_S, 10 * (time.monotonic() - started))
                    if used > self.limit:
                        self.trip(
                            f"its workspace holds {gib(used)}, past its limit of {gib(self.limit)} (sandbox.disk_gb)"
                        )
            except OSError as e:  # a folder the agent made unreadable: measured again later
                log.debug("measuring the agent's disk: %s", e)
            if self.tripped:
                return

    def make_room(self) -> bool:
        """A write of the harness's found the disk full: the agent is stopped (if it was not) and
        what it wrote removed until the reserve is free again; whether the disk has room now."""
        self.trip("the disk holding its workspace filled up")
        with self.lock:
            self.remove_past_limits()
        return disk.free_bytes(self.folders[0]) > 0

    def trip(self, why: str) -> None:
        """Stop the agent, once, and make room."""
        with self.lock:
            if self.tripped is not None:
                return
            self.tripped = why
            log.warning("the agent is stopped: %s", why)
            self.stop(why, self.remove_past_limits)

    def remove_past_limits(self) -> None:
        """Remove the agent's files, largest first, the submission's last, until its folders hold
        at most the limit and the disk has room for the rest of the run; each removal is a note."""
        files = sorted(self.files(), key=lambda f: (self.is_kept(f[0]), -f[1]))
        left = sum(size for _, size in files)
        free = disk.free_bytes(
            self.folders[0]
        )  # and what is removed (a file still open is freed once its process dies)
        for path, size in files:
            # The room the run needs from here: its reserve, and a copy of what is left for each copy the
            # rest of the run may make (its final snapshot, the store's copy of that, the submission's
            # copy, the scorer's: a submission may be the whole workspace).
            if left <= self.limit and free >= self.reserve + COPIES * left:
                break
            try:
                path.unlink()
            except OSError:
                continue
            left, free = left - size, free + size
            self.notes.append(f"the disk: removed {self.shown(path)} ({gib(size)}), past the agent's disk limits")

    def is_kept(self, path: Path) -> bool:
        return self.keep is not None and (path == self.keep or self.keep in path.parents)

    def shown(self, path: Path) -> str:
        for folder in self.folders:
            if folder in path.parents:
                return str(path.relative_to(folder))
        return str(path)

    def used(self) -> int:
        return sum(size for _, size in self.files())

    def files(self) -> Iterator[tuple[Path, int]]:
        """Every file in the agent's folders, with the space it takes on disk (not following links)."""
        pending = [f for f in self.folders if f.is_dir()]
        while pending:
            folder = pending.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    pending.append(Path(entry.path))
                else:
                    yield Path(entry.path), info.st_blocks * 512
