"""What a run leaves on the host when its harness is killed with SIGKILL (the OOM killer, `kill -9`,
a cluster's hard kill): its sandboxes' cgroups (a folder per controller, at the root of the hierarchy
on a machine whose harness runs there) and its folders in the temp folder (a bwrap sandbox's own
files, the metering proxy's socket). Nothing can remove them at that moment, and they pile up: a few
per killed run, until reboot.

So their names carry their owner, the harness process: the machine's boot, its pid and its start
time (which a reused pid does not share). Each new one made removes those of its kind whose owner
is gone. A name that carries no owner, whose owner runs, or that another machine (a temp folder
shared between a cluster's nodes) or an earlier boot made, is left alone; a cgroup that still holds
a process cannot be removed (the kernel refuses). So nothing a live run uses is touched.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# -ownerBOOT.PID.START-: BOOT, this boot of this machine (the kernel's boot id, shortened); START,
# /proc/PID/stat's field 22, in clock ticks since boot.
OWNER = re.compile(r"-owner([0-9a-f]+)\.(\d+)\.(\d+)-")


@functools.cache
def this_boot() -> str:
    """This boot of this machine, as a leftover's owner names it (read once: it does not change)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    except OSError:
        return "0"


def process_start(pid: int) -> str:
    """PID's start time in clock ticks since boot ("" when there is no such process): with its pid,
    what tells a process from a later one given the same pid (a run's claim on its folder, too:
    mlrb/run_files/resume.py)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command's name (which may hold spaces)


def owner_tag() -> str:
    """This process as the owner a leftover's name carries: `-ownerBOOT.PID.START-`."""
    return f"-owner{this_boot()}.{os.getpid()}.{process_start(os.getpid())}-"


def owner_gone(name: str) -> bool:
    """Whether NAME carries an owner of this machine's boot that no longer runs (no process of its pid
    and start time)."""
    found = OWNER.search(name)
    return found is not None and found.group(1) == this_boot() and process_start(int(found.group(2))) != found.group(3)


def new_temp_folder(prefix: str) -> Path:
    """A new folder in the temp folder, named PREFIX, its owner (this process), then mkdtemp's letters;
    first, the folders named PREFIX... whose owner is gone are removed."""
    temp = Path(tempfile.gettempdir())
    remove_orphans(temp, prefix, shutil.rmtree)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}", dir=temp))


def remove_orphans(folder: Path, prefix: str, remove: Callable[[Path], None]) -> None:
    """REMOVE each folder in FOLDER named PREFIX... whose owner is gone. Only this user's own folders,
    not links: the temp folder is everyone's. Errors are ignored (another harness may be removing the
    same one)."""
    try:
        entries = [entry for entry in os.scandir(folder) if entry.name.startswith(prefix) and owner_gone(entry.name)
                   and entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()]  # fmt: skip
    except OSError:
        return
    for entry in entries:
        try:
            remove(Path(entry.path))
        except OSError:
            pass
