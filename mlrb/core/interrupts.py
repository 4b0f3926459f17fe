"""Stopping a run from outside: SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, SLURM's
time limit and pre-emption without a launcher that requeues) and SIGHUP (a closed
terminal) all raise `Interrupted` in the harness, so the run's `finally` blocks
run: the sandbox is closed (every process of the agent killed), the workspace is
scored and the run recorded as killed.

A launcher that handles a signal itself keeps it: submitit installs its own
SIGTERM and SIGUSR2 handlers in its jobs (it requeues a pre-empted or timed-out
job on SIGUSR2 and ignores SIGTERM), and those are left as they are. The guard
still notes the signals such a launcher handles: SLURM sends them to every process
of a job it stops (a requeue, a lost node, a time limit), and the run must know
that the agent's command died of one rather than of its own doing.

The helper processes of a run (its recording process, a sweep's recording server)
ignore all of these: the harness decides what a signal does, and records it
through them.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# What stops a run from outside without deciding its end: `kill`, `timeout`, a job's time limit
# without a launcher that requeues, a closed terminal. A run so stopped goes on where it was when
# the same command runs again (mlrb/run_files/resume.py); Ctrl-C (SIGINT) ends it, its workspace scored.
SUSPENDING = (signal.SIGTERM, signal.SIGHUP)
# What SLURM sends every process of a job it stops: SIGTERM (a requeue, a cancel, a lost node), and
# SIGUSR2 ahead of a time limit or a pre-emption (submitit asks for it, to requeue the job).
JOB_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal. A KeyboardInterrupt, so that no `except
    Exception` on the way (an agent's, a library's) swallows it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by this signal


class Guard:
    """While active, the signals above raise `Interrupted` (after running the cleanup
    callbacks, say closing the sandbox, so the agent's processes stop at once).
    `hold()` defers them instead, while the run's outcome is being recorded."""

    def __init__(self) -> None:
        self.cleanups: list[Callable[[], None]] = []
        self.received: list[int] = []
        self.seen_by_launcher: list[int] = []  # signals a launcher handled (it is told them too)
        self.holding = False
        self.pending: int | None = None

    def on_interrupt(self, cleanup: Callable[[], None]) -> None:
        self.cleanups.append(cleanup)

    def handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self.holding:
            self.pending = signum
            log.warning(
                "%s received while the run is being recorded; it stops once that is done", signal.Signals(signum).name
            )
            return
        self.interrupt(signum)

    def launcher_signalled(self, within_s: float = 0.0) -> bool:
        """Whether a launcher's handler got one of the job's signals, waiting up to `within_s`
        for it: a job's processes are signalled one by one, the agent's maybe first."""
        deadline = time.monotonic() + within_s
        while not self.seen_by_launcher and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(self.seen_by_launcher)

    def interrupt(self, signum: int) -> None:
        for cleanup in self.cleanups:
            try:
                cleanup()
            except Exception as e:  # the finally blocks try again
                log.warning("cleanup on %s failed: %s", signal.Signals(signum).name, e)
        raise Interrupted(signum)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Defer the signals while the block runs (say while a run's outcome is being
        recorded, so it is recorded whole); `release` acts on one that came."""
        held, self.holding = self.holding, True
        try:
            yield
        finally:
            self.holding = held

    def release(self) -> None:
        """Raise now for a signal that came while held."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            self.interrupt(signum)


def ours(signum: int) -> bool:
    """Whether no one else handles this signal already: a launcher's handler, or an
    ignored SIGHUP (`nohup`), stays."""
    return signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)


def ignore_job_signals() -> None:
    """For a run's helper processes: no signal from a terminal or a job ends them."""
    for signum in (*SIGNALS, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_IGN)


def noted(guard: Guard, handler: Callable) -> Callable:
    """The launcher's own handler, the signal noted first.

    submitit requeues a job from its SIGUSR2 handler with `scontrol requeue`, and SLURM
    answers that by sending SIGTERM to every process of the job, that `scontrol` too: it
    can die of it before it exits, and submitit's handler then fails where it would have
    exited. The job is ending either way, so the handler exits as it would have."""

    def handle(signum: int, frame) -> None:
        guard.seen_by_launcher.append(signum)
        try:
            handler(signum, frame)
        except subprocess.CalledProcessError as e:
            if e.returncode != -signal.SIGTERM:
                raise
            command = e.cmd if isinstance(e.cmd, str) else shlex.join(map(str, e.cmd))
            log.warning(
                "%s: `%s` died of the job's own SIGTERM, so SLURM is ending the job; exiting as "
                "the launcher would have",
                signal.Signals(signum).name,
                command,
            )
            raise SystemExit(-1) from e

    return handle


@contextlib.contextmanager
def guarded() -> Iterator[Guard]:
    """Install the guard for the signals no launcher handles, and note the job's signals a
    launcher handles (main thread only: Python delivers signals there); restore the previous
    handlers afterwards."""
    guard = Guard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {s: signal.getsignal(s) for s in (*SIGNALS, signal.SIGUSR2)}
    for signum, handler in previous.items():
        if signum in SIGNALS and ours(signum):
            signal.signal(signum, guard.handle)
        elif signum in JOB_SIGNALS and callable(handler):
            signal.signal(signum, noted(guard, handler))
    try:
        yield guard
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
