"""Memory, CPU and process limits for a bwrap sandbox: a cgroup of its own, made beside the
harness's, where this process may make one (as root, or in a delegated cgroup v2 subtree).

Where it may not (an ordinary user on a machine without delegation), `Cgroup.create`
returns None and the sandbox runs without limits of its own; on a cluster the job's own
cgroup (SLURM's) still bounds it. Both cgroup v1 (a hierarchy per controller) and v2 (one
unified tree) are handled.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from pathlib import Path

from mlrb.core import leftovers
from mlrb.sandbox.base import Limits

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
# Swap accounting is off on some kernels: then these files do not exist, and are skipped.
OPTIONAL_FILES = {"memory.memsw.limit_in_bytes", "memory.swap.max"}


def own_paths() -> dict[str, str]:
    """controller ("" for the v2 tree) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def settings(limits: Limits, pids_limit: int | None, unified: bool) -> dict[str, dict[str, str]]:
    """controller -> {file: value} for the limits asked (v2 file names when unified)."""
    wanted: dict[str, dict[str, str]] = {}
    if limits.memory_gb:
        memory = str(int(limits.memory_gb * 1024**3))
        # Swap is counted too, so a memory bomb cannot hide in it.
        wanted["memory"] = (
            {"memory.max": memory, "memory.swap.max": "0"}
            if unified
            else {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}
        )
    if pids_limit:
        wanted["pids"] = {"pids.max": str(pids_limit)}
    if limits.cpus:
        quota = int(limits.cpus * CPU_PERIOD_US)
        wanted["cpu"] = (
            {"cpu.max": f"{quota} {CPU_PERIOD_US}"}
            if unified
            else {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)}
        )
    return wanted


class Cgroup:
    def __init__(self, folders: list[Path]):
        self.folders = folders

    @property
    def procs_files(self) -> list[str]:
        return [str(folder / "cgroup.procs") for folder in self.folders]

    @classmethod
    def create(cls, name: str, limits: Limits, pids_limit: int | None) -> Cgroup | None:
        unified = (ROOT / "cgroup.controllers").exists()
        wanted = settings(limits, pids_limit, unified)
        if not wanted:
            return None
        paths = own_paths()
        made: list[Path] = []
        cleared: set[Path] = set()
        try:
            for controller, files in wanted.items():
                base = ROOT / paths[""].lstrip("/") if unified else ROOT / controller / paths[controller].lstrip("/")
                if base not in cleared:  # those of harnesses killed with SIGKILL; once per tree (v2 has one)
                    leftovers.remove_orphans(base, "mlrb-", Path.rmdir)
                    cleared.add(base)
                if unified:
                    (base / "cgroup.subtree_control").write_text(f"+{controller}")
                folder = base / name
                if folder not in made:
                    folder.mkdir(exist_ok=True)
                    made.append(folder)
                for file, value in files.items():
                    if file not in OPTIONAL_FILES or (folder / file).exists():
                        (folder / file).write_text(value)
        except (OSError, KeyError) as e:
            log.warning("no cgroup for the sandbox's memory/CPU/process limits here (%s); it runs without them", e)
            Cgroup(made).remove()
            return None
        return cls(made)

    def remove(self) -> None:
        """Kill whatever is left in the cgroup, then remove it."""
        for folder in self.folders:
            for _ in range(100):
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    folder.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def joined(argv: list[str], cgroup: Cgroup | None) -> list[str]:
    """`argv` started from a shell that first moves itself into the cgroup, so every process
    of the sandbox is in it from the start."""
    if cgroup is None:
        return argv
    join = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
    return [shutil.which("sh") or "/bin/sh", "-c", join, "sh", *cgroup.procs_files, "--", *argv]
