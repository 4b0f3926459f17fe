"""Which processes a command's CPU time goes to, by kind: the tests' own code, the harness's warm
forks, the sandboxes' agents and scorers, new interpreters for recording and for commands, servers.

A test's CPU time (tests/conftest.py's cgroup figures) says which tests cost; this says what in
them does. Linux's process accounting (`accton`, Debian's acct package; root) records every
process as it ends: its CPU time, its parent, whether it was forked without an exec. A watcher
reads each new process's command line from /proc meanwhile (every 20 ms: a process that ends
sooner is classed by its name alone). It counts every process that ends on the machine meanwhile:
measure with nothing else running. benchmarks/suite_time.py uses it where it can:

    with ProcessCpu() as accounting:
        subprocess.run(command)
    accounting.kinds()  # {kind: {"processes": n, "cpu_s": s}}, or None, with accounting.why
    accounting.commands(kind)  # the command lines of a kind's processes that used the most

`python -m benchmarks.process_cpu -- COMMAND...` runs a command so and prints both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

WATCH_S = 0.02
TICKS_PER_S = 100  # acct version 3 counts CPU time in ticks of 1/100 s (AHZ)

# The kinds, in the order they are printed.
SCORERS = "scorers (mlrb.scoring.worker), in their sandboxes"
AGENTS = "in a sandbox: agents and what they ran"
TESTS = "pytest and its workers: the tests' own code"
WARM = "forked from a warm process: harness commands, their recording processes and sweep jobs"
RECORDING = "new interpreters: a run's recording process"
COMMANDS = "new interpreters: `python -m mlrb...` commands"
SERVERS = "servers: MLflow, uvicorn, the scripted model and hub servers"
BUILDS = "the tasks' builds ahead"
PYTHON = "other Python processes"
OTHER = "other programs (bwrap, git, shells...)"
KINDS = (SCORERS, AGENTS, TESTS, WARM, RECORDING, COMMANDS, SERVERS, BUILDS, PYTHON, OTHER)
SERVER_WORDS = (
    "mlflow server",
    "mlflow ui",
    "uvicorn",
    "gunicorn",
    "huey",
    "fake_llm_server",
    "hub_server",
    "_job_runner",
)


@dataclass
class Process:
    comm: str
    cpu_s: float
    parent: int
    forked: bool  # forked and never exec'd
    argv: str = ""  # as the watcher saw it ("" when it ended before it looked)


@dataclass
class ProcessCpu:
    """Process accounting around a `with` block; `kinds()` once it is left."""

    why: str = ""  # why nothing was counted ("" when it was)
    processes: dict[int, Process] = field(default_factory=dict)
    seen: dict[int, tuple[int, str]] = field(default_factory=dict)  # the watcher's: pid -> (parent, command line)

    def __enter__(self) -> ProcessCpu:
        if os.geteuid() != 0 or not shutil.which("accton") or not shutil.which("dump-acct"):
            self.why = "process accounting needs root and Debian's acct package (apt-get install acct)"
            return self
        self.folder = Path(tempfile.mkdtemp(prefix="mlrb-process-cpu-"))
        self.file = self.folder / "acct"
        self.file.touch()
        turned_on = subprocess.run(["accton", str(self.file)], capture_output=True, text=True)
        if turned_on.returncode:
            self.why = f"accton failed: {turned_on.stderr.strip()}"
            return self
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.why:
            return
        subprocess.run(["accton", "off"], capture_output=True)
        self.stop.set()
        self.watcher.join()
        dumped = subprocess.run(["dump-acct", str(self.file)], capture_output=True, text=True).stdout
        shutil.rmtree(self.folder, ignore_errors=True)
        for line in dumped.splitlines():
            fields = [part.strip() for part in line.split("|")]
            if len(fields) < 12 or fields[1] != "v3":
                continue
            pid = int(fields[9])
            parent, argv = self.seen.get(pid, (int(fields[10]), ""))
            self.processes[pid] = Process(comm=fields[0], cpu_s=(float(fields[2]) + float(fields[3])) / TICKS_PER_S,
                                          parent=parent, forked="F" in fields[11], argv=argv)  # fmt: skip
        self.processes.pop(os.getpid(), None)

    def watch(self) -> None:
        """Each new process's parent and command line, until stopped."""
        while not self.stop.wait(WATCH_S):
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) not in self.seen:
                    try:
                        stat = Path(f"/proc/{name}/stat").read_text()
                        argv = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    except OSError:
                        continue  # gone already
                    self.seen[int(name)] = (int(stat.rsplit(")", 1)[1].split()[1]), argv.strip())

    def kind(self, pid: int) -> str:
        process, ancestors = self.processes[pid], self.ancestors(pid)
        if any(self.builds(ancestor) for ancestor in [pid, *ancestors]):
            return BUILDS
        python = process.comm.startswith("python") or "jemalloc" in process.comm  # pyarrow's thread names the process
        if self.is_bwrap(pid):
            return OTHER
        if python and "mlrb.scoring.worker" in process.argv:
            return SCORERS
        if any(self.is_bwrap(ancestor) for ancestor in ancestors):
            return AGENTS
        if not python:
            return OTHER
        if process.forked:
            return TESTS if self.kind_of_parent(pid) == TESTS else WARM
        argv = process.argv
        if is_pytest(argv) or is_test_worker(argv):
            return TESTS
        if "warm_start.serve" in argv:
            return WARM
        if "mlrb.store.recording_process" in argv:
            return RECORDING
        if " -m mlrb" in argv:
            return COMMANDS
        if any(word in argv for word in SERVER_WORDS):
            return SERVERS
        return PYTHON

    def kind_of_parent(self, pid: int) -> str | None:
        parent = self.processes[pid].parent
        return self.kind(parent) if parent in self.processes and parent != pid else None

    def ancestors(self, pid: int) -> list[int]:
        """PID's parent, its parent's, and so on, as far as they are known."""
        found: list[int] = []
        while len(found) < 64:
            pid = self.processes[pid].parent if pid in self.processes else self.seen.get(pid, (0, ""))[0]
            if pid <= 1 or pid in found:
                return found
            found.append(pid)
        return found

    def named(self, pid: int) -> str:
        """PID's command line where the watcher saw it, else its name."""
        argv = self.seen.get(pid, (0, ""))[1] or (self.processes[pid].argv if pid in self.processes else "")
        return argv or (self.processes[pid].comm if pid in self.processes else "")

    def is_bwrap(self, pid: int) -> bool:
        """Whether PID is a bwrap process (named so, or started as /usr/bin/bwrap or any bwrap)."""
        process = self.processes.get(pid)
        program = self.named(pid).split(" ", 1)[0]
        return bool(process and process.comm.startswith("bwrap")) or os.path.basename(program) == "bwrap"

    def builds(self, pid: int) -> bool:
        """Whether PID is one of the builds ahead: pytest's own process forks them (tests/build_ahead.py);
        the test workers it starts are new interpreters."""
        process = self.processes.get(pid)
        parent = self.named(process.parent) if process else ""
        return bool(process and process.forked and is_pytest(parent) and not is_test_worker(parent))

    def kinds(self) -> dict[str, dict[str, float]] | None:
        """CPU seconds and processes per kind (KINDS' order), or None where nothing was counted."""
        if self.why:
            return None
        totals = {kind: {"processes": 0, "cpu_s": 0.0} for kind in KINDS}
        for pid, process in self.processes.items():
            kind = totals[self.kind(pid)]
            kind["processes"] += 1
            kind["cpu_s"] += process.cpu_s
        return {kind: {"processes": t["processes"], "cpu_s": round(t["cpu_s"], 1)} for kind, t in totals.items()}

    def commands(self, kind: str, top: int = 10) -> list[tuple[float, int, str]]:
        """The command lines of KIND's processes that used the most CPU: (CPU s, processes, command
        line), the lines cut to 160 characters with their temporary paths folded (/tmp/…) so that
        the runs of one command are counted together; a fork without an exec is marked [forked]."""
        totals: dict[str, list[float]] = {}
        for pid, process in self.processes.items():
            if self.kind(pid) == kind:
                line = re.sub(r"/tmp/\S+", "/tmp/…", self.named(pid))[:160] + (" [forked]" if process.forked else "")
                total = totals.setdefault(line, [0.0, 0])
                total[0], total[1] = total[0] + process.cpu_s, total[1] + 1
        ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
        return [(round(cpu_s, 1), int(count), line) for line, (cpu_s, count) in ranked]


def is_pytest(argv: str) -> bool:
    return " -m pytest" in argv


def is_test_worker(argv: str) -> bool:
    """pytest-xdist's worker, which execnet starts as `python -c` reading its code from standard input."""
    return "exec(eval(sys.stdin.readline()))" in argv


def main(argv: list[str]) -> int:
    """`python -m benchmarks.process_cpu [--top N] -- COMMAND...`: run COMMAND, then print its CPU by
    kind of process and, under each kind, the command lines that used the most. Counts every process
    that ends on the machine meanwhile: run it with nothing else running."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.process_cpu", usage="%(prog)s [--top N] -- COMMAND...")
    parser.add_argument("--top", type=int, default=10, help="command lines shown per kind (default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    if args.command[:1] != ["--"] or len(args.command) < 2:
        parser.error("give the command to run after --")
    with ProcessCpu() as accounting:
        status = subprocess.run(args.command[1:]).returncode
    kinds = accounting.kinds()
    if kinds is None:
        print(f"nothing counted: {accounting.why}", file=sys.stderr)
        return 1
    for kind, total in kinds.items():
        if not total["processes"]:
            continue
        print(f"\n{total['cpu_s']:8.1f} CPU s  {total['processes']:5d} processes  {kind}")
        for cpu_s, count, line in accounting.commands(kind, args.top):
            print(f"    {cpu_s:8.1f} {count:5d}  {line}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
