"""Stopping a run from outside: SIGINT (Ctrl-C), SIGTERM (`kill`, `timeout`, SLURM's
time limit and pre-emption without a launcher that requeues) and SIGHUP (a closed
terminal) all raise `Interrupted` in the harness, so the run's `finally` blocks
run: the sandbox is closed (every process of the agent killed), the workspace is
scored and the run recorded as killed.

A launcher that handles a signal itself keeps it: submitit installs its own
SIGTERM and SIGUSR2 handlers in its jobs (it requeues a pre-empted or timed-out
job on SIGUSR2 and ignores SIGTERM), and those are left as they are. The guard
still notes a SIGTERM such a launcher handles: SLURM sends one to every process of
a job it kills (a requeue, a lost node), and the run must know that the agent's
command died of it rather than of its own doing.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# What stops a run from outside without deciding its end: `kill`, `timeout`, a job's time limit
# without a launcher that requeues, a closed terminal. A run so stopped goes on where it was when
# the same command runs again (mlrb/resume.py); Ctrl-C (SIGINT) ends it, its workspace scored.
SUSPENDING = (signal.SIGTERM, signal.SIGHUP)


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
            log.warning("%s received while the run is being recorded; it stops once that is done",
                        signal.Signals(signum).name)  # fmt: skip
            return
        self.interrupt(signum)

    def launcher_signalled(self, signum: int, within_s: float = 0.0) -> bool:
        """Whether a launcher's handler got `signum`, waiting up to `within_s` for it: a
        job's processes are signalled one by one, the agent's maybe first."""
        deadline = time.monotonic() + within_s
        while signum not in self.seen_by_launcher and time.monotonic() < deadline:
            time.sleep(0.1)
        return signum in self.seen_by_launcher

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


def noted(guard: Guard, handler: Callable) -> Callable:
    """The launcher's own handler, the signal noted first."""

    def handle(signum: int, frame) -> None:
        guard.seen_by_launcher.append(signum)
        handler(signum, frame)

    return handle


@contextlib.contextmanager
def guarded() -> Iterator[Guard]:
    """Install the guard for the signals no launcher handles (main thread only: Python
    delivers signals there); restore the previous handlers afterwards."""
    guard = Guard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    for signum, handler in previous.items():
        if ours(signum):
            signal.signal(signum, guard.handle)
        elif signum == signal.SIGTERM and callable(handler):
            signal.signal(signum, noted(guard, handler))
    try:
        yield guard
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
