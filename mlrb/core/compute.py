"""What a run's compute costs: the GPUs and CPU cores its agent's sandbox held, times how long it
held them, at the config's prices (`compute.price_per_gpu_hour`, `compute.price_per_cpu_hour`).

The hardware is what the run was given (mlrb/sandbox/base.py `held_hardware`): its GPUs and
the sandbox's CPU limit. The time is wall time from the sandbox's start to its close: the agent's
paused clock (mid-run scoring, writing the record) does not stop it, as the hardware stays held
meanwhile. The scorer's own sandbox is the harness's and is not counted. A resumed run adds each
attempt's hours (mlrb/run_files/resume.py); the time between attempts holds nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from mlrb.core.tags import Metric

HOUR_S = 3600.0


class HeldCompute:
    """The hours a run's agent holds its hardware: GPUS GPUs and CPUS cores, from `start` to `stop`,
    added to what earlier attempts held (`carry`)."""

    def __init__(
        self,
        gpus: int,
        cpus: float,
        price_per_gpu_hour: float | None = None,
        price_per_cpu_hour: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.gpus, self.cpus = gpus, cpus
        self.price_per_gpu_hour, self.price_per_cpu_hour = price_per_gpu_hour, price_per_cpu_hour
        self.clock = clock
        self.started: float | None = None
        self.stopped: float | None = None
        self.carried_gpu_hours = 0.0  # what earlier attempts of the run held
        self.carried_cpu_hours = 0.0
        self.lock = threading.Lock()

    def start(self) -> None:
        """The sandbox is about to start: from now the hardware is held."""
        with self.lock:
            if self.started is None:
                self.started = self.clock()

    def stop(self) -> None:
        """The sandbox is closed: the hardware is held no more (later calls change nothing)."""
        with self.lock:
            if self.started is not None and self.stopped is None:
                self.stopped = self.clock()

    def carry(self, gpu_hours: float, cpu_hours: float) -> None:
        """Go on from what earlier attempts of the run held."""
        self.carried_gpu_hours, self.carried_cpu_hours = float(gpu_hours), float(cpu_hours)

    def held_s(self) -> float:
        """This attempt's hold so far, in seconds."""
        started, stopped = self.started, self.stopped
        if started is None:
            return 0.0
        return max(0.0, (stopped if stopped is not None else self.clock()) - started)

    def hours(self) -> tuple[float, float]:
        """(GPU-hours, CPU-hours) so far, earlier attempts' included, from one reading of the clock."""
        held_h = self.held_s() / HOUR_S
        return self.carried_gpu_hours + self.gpus * held_h, self.carried_cpu_hours + self.cpus * held_h

    def gpu_hours(self) -> float:
        return self.hours()[0]

    def cpu_hours(self) -> float:
        return self.hours()[1]

    def gpu_time_left_s(self, max_gpu_hours: float | None) -> float:
        """Wall seconds until the GPU-hours reach MAX_GPU_HOURS (inf: no cap, or no GPU held and the
        cap not reached by earlier attempts); 0 once reached."""
        if max_gpu_hours is None:
            return math.inf
        left_h = max_gpu_hours - self.gpu_hours()
        if not left_h > 0:  # NaN too: stops rather than lifts the cap
            return 0.0
        return math.inf if self.gpus <= 0 else left_h * HOUR_S / self.gpus

    def usd(self) -> float | None:
        """The hours at the config's prices; None when neither is set. A price left null counts nothing."""
        return usd_of(*self.hours(), self.price_per_gpu_hour, self.price_per_cpu_hour)

    def summary(self) -> dict[str, float]:
        """The run's metrics: gpu_hours and cpu_hours, and compute_usd where a price is set."""
        gpu_hours, cpu_hours = self.hours()
        figures = {Metric.GPU_HOURS: round(gpu_hours, 6), Metric.CPU_HOURS: round(cpu_hours, 6)}
        usd = usd_of(gpu_hours, cpu_hours, self.price_per_gpu_hour, self.price_per_cpu_hour)
        if usd is not None:
            figures[Metric.COMPUTE_USD] = round(usd, 6)
        return figures


def usd_of(
    gpu_hours: float, cpu_hours: float, price_per_gpu_hour: float | None, price_per_cpu_hour: float | None
) -> float | None:
    """GPU-hours and CPU-hours at their prices; None when neither price is set."""
    if price_per_gpu_hour is None and price_per_cpu_hour is None:
        return None
    return gpu_hours * (price_per_gpu_hour or 0.0) + cpu_hours * (price_per_cpu_hour or 0.0)
