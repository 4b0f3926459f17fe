"""Where a run's time goes: seconds per stage, recorded as the metrics `stage_time_s.<stage>`.

Stages: `compose` (from the process's start to the run's checks: the interpreter,
imports, reading the command line, composing and validating the config), `assets`
(finding and verifying the task's cached assets, building them if missing),
`sandbox_start` (the scorer's sandbox, whose imports then run beside the agent, the
workspace and the agent's sandbox), `agent` (the agent's run, its model SDK's import
included), `collect` (the final snapshot, and choosing the step to score: an MLRC-Bench
folder's dev scores), `scoring` (copying out the submission, handing it to the scorer,
its work) and `recording` (MLflow: importing it, checking the store, creating the run
and writing to it; the last metrics and the run's end are after these figures are
taken). In a single run, MLflow works in a process of its own
(mlrb/store/recording_process.py): `recording` is then the time the run waits for it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from mlrb.core.tags import Metric


class StageClock:
    """Seconds per stage, from the run's own thread. A stage timed inside another (the record
    written during the agent's start) counts as its own, not as the outer one's too."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.inner: list[float] = []  # for each stage being timed: the seconds of the stages timed inside it

    def add(self, stage: str, seconds: float) -> None:
        self.times[stage] = self.times.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        self.inner.append(0.0)
        try:
            yield
        finally:
            elapsed = time.monotonic() - started
            self.add(name, elapsed - self.inner.pop())
            if self.inner:
                self.inner[-1] += elapsed

    def metrics(self) -> dict[str, float]:
        return {Metric.STAGE_TIME_S + stage: round(seconds, 4) for stage, seconds in self.times.items()}


def since_process_start() -> float:
    """Seconds since this process started (Linux: from /proc; elsewhere since mlrb was imported)."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, in clock ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - IMPORTED


IMPORTED = time.monotonic()
