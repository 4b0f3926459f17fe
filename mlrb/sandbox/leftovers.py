"""What a sandbox leaves on the host when the harness that made it is killed with SIGKILL (the OOM
killer, `kill -9`, a cluster's hard kill): its cgroups (one folder per controller, at the root of
the hierarchy on a machine whose harness runs there) and its scratch folder in the temp folder.
Nothing can remove them at that moment, and they pile up: a few per killed run, until reboot.

So their names carry their owner, the harness process (its pid and its start time, which a reused
pid does not share), and each new sandbox removes those whose owner is gone. A folder whose name
carries no owner, or whose owner lives, is left alone; a cgroup that still holds a process cannot be
removed (the kernel refuses), so nothing a live sandbox uses is touched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

# -ownerPID.START-: the start time is /proc/PID/stat's field 22, in clock ticks since boot.
OWNER = re.compile(r"-owner(\d+)\.(\d+)-")


def start_ticks(pid: int) -> str | None:
    """PID's start time (clock ticks since boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name, in parentheses, may hold spaces


def owner_tag() -> str:
    """This process as the owner a leftover's name carries: `-ownerPID.START-`."""
    return f"-owner{os.getpid()}.{start_ticks(os.getpid())}-"


def owner_gone(name: str) -> bool:
    """Whether NAME carries an owner that no longer runs (a process of that pid and start time)."""
    found = OWNER.search(name)
    return found is not None and start_ticks(int(found.group(1))) != found.group(2)


def remove_orphans(folder: Path, prefix: str, remove: Callable[[Path], None]) -> None:
    """REMOVE each entry of FOLDER named PREFIX... whose owner is gone; errors are ignored (another
    harness may be removing the same one, or it belongs to another user)."""
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name.startswith(prefix) and owner_gone(entry.name)]
    except OSError:
        return
    for entry in entries:
        try:
            remove(Path(entry.path))
        except OSError:
            pass
