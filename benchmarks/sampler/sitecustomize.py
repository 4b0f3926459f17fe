"""benchmarks/suite_profile.py's sampler, which every Python process it starts loads as it starts
(this folder is on PYTHONPATH): every 5 ms of the process's CPU time (SIGPROF), the main thread's
stack is counted, and the counts are written to $MLRB_PROFILE_DIR when the process ends, forks or
execs. A fork counts its own from the fork on. Not for anything but measuring."""

from __future__ import annotations

import atexit
import collections
import os
import signal
import sys
import time

INTERVAL_S = 0.005
MAX_DEPTH = 80
OUT = os.environ.get("MLRB_PROFILE_DIR", "")
state: dict = {}


def sample(signum, frame) -> None:
    stack = []
    while frame is not None and len(stack) < MAX_DEPTH:
        code = frame.f_code
        stack.append(f"{code.co_filename}:{code.co_name}")
        frame = frame.f_back
    state["counts"][tuple(reversed(stack))] += 1


def write() -> None:
    """This process's counts since it started or forked, in a file of its own; then cleared."""
    counts = state.get("counts")
    if not counts or state.get("pid") != os.getpid():
        return
    # Taken whole and replaced in one step: a sample that lands while they are written (the timer is
    # still on before a fork) goes to the new counts instead of changing these mid-iteration.
    state["counts"] = collections.Counter()
    try:
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, f"{os.getpid()}-{time.time_ns()}.txt"), "w") as out:
            out.write("argv\t" + " ".join(sys.argv)[:300].replace("\n", " ") + "\n")
            out.write(f"forked\t{state['forked']}\n")
            for stack, n in counts.items():
                out.write(f"{n}\t{';'.join(stack)}\n")
    except OSError:  # a sandbox, where OUT is not writable: its processes go uncounted
        pass


def stop() -> None:
    """The timer off (it would outlive an exec, whose program dies of SIGPROF), then the counts out."""
    signal.setitimer(signal.ITIMER_PROF, 0, 0)
    write()


def arm(forked: bool) -> None:
    state.update(counts=collections.Counter(), pid=os.getpid(), forked=forked)
    signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)


def stopping_first(function):
    def wrapper(*args, **kwargs):
        stop()
        return function(*args, **kwargs)

    return wrapper


def off_before_exec(fork_exec):
    """subprocess's fork_exec, its preexec_fn (run after the fork handlers re-armed the timer)
    followed by the timer off."""

    def wrapper(*args):
        args = list(args)
        for i, arg in enumerate(args):
            if callable(arg):  # preexec_fn, the only callable it takes

                def preexec(function=arg):
                    try:
                        function()
                    finally:
                        signal.setitimer(signal.ITIMER_PROF, 0, 0)

                args[i] = preexec
        return fork_exec(*args)

    return wrapper


if OUT:
    import _posixsubprocess

    arm(forked=False)
    atexit.register(stop)
    os.register_at_fork(before=write, after_in_child=lambda: arm(forked=True))
    os._exit = stopping_first(os._exit)
    os.execv = stopping_first(os.execv)
    os.execve = stopping_first(os.execve)
    _posixsubprocess.fork_exec = off_before_exec(_posixsubprocess.fork_exec)
