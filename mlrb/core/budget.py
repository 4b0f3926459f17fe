"""The harness's account of what a run has spent, checked against its budget."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import astuple, dataclass

from mlrb.core.compute import HeldCompute
from mlrb.core.config import BudgetConfig
from mlrb.core.messages import time_left
from mlrb.core.tags import Metric


@dataclass(frozen=True)
class Spend:
    """Tokens and dollars: what a model call used, or what is held for one in flight. The input
    tokens are every token of the prompts; the cache's are parts of them, counted apart too."""

    input_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    web_searches: int = 0  # what the provider billed beside tokens, and its dollars (within `usd`)
    fee_usd: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: Spend) -> Spend:
        return Spend(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


class Budget:
    def __init__(
        self, cfg: BudgetConfig, clock: Callable[[], float] = time.monotonic, compute: HeldCompute | None = None
    ):
        self.cfg = cfg
        # The hardware the agent's sandbox holds, on a clock of its own (wall time: pauses do not stop
        # it); None: none is counted (a run always has one).
        self.compute = compute
        self.clock = clock
        self.started = clock()
        self.steps = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.usd = 0.0
        self.cache_read_tokens = 0  # of the input tokens: read from the prompt cache, and written to it
        self.cache_write_tokens = 0
        self.web_searches = 0  # billed beside tokens, and what they cost (within `usd`)
        self.fee_usd = 0.0
        # What the model calls in flight hold (the metering proxy reserves each call's estimate
        # before it goes upstream), and how many there are.
        self.held = Spend()
        self.in_flight = 0
        self.lock = threading.Lock()  # the metering proxy charges calls from its own threads
        self._pauses = 0  # pauses under way (`paused`)
        self._paused_at: float | None = None  # when the clock stopped, while it stands still
        # Told True when the clock stops and False when it goes on (the run holds the agent's
        # processes still meanwhile); one pause's calls in order, never interleaved with another's.
        self.on_pause: Callable[[bool], None] | None = None
        self._pausing = threading.RLock()
        # Called (outside the lock) after each step and each call charged: a resumable run saves its progress.
        self.on_change: Callable[[], None] | None = None
        self.notice: str | None = None  # the last-minutes notice, once given (mlrb/harness/agent_clock.py)
        self.stopped_by: str | None = None  # a limit the harness enforced from outside the budget (`stop`)

    def carry(self, spent: Mapping[str, float]) -> None:
        """Go on from what an earlier attempt of the run spent, as `summary` gives it (Metric.SPENT's
        keys; one an older attempt did not keep is 0): its steps, tokens, fees, dollars, time and the
        hours its hardware was held."""

        def of(key: str) -> float:
            return spent.get(key) or 0

        with self.lock:
            if self.compute is not None:
                self.compute.carry(of(Metric.GPU_HOURS), of(Metric.CPU_HOURS))
            self.steps = int(of(Metric.STEPS))
            self.input_tokens, self.output_tokens = int(of(Metric.INPUT_TOKENS)), int(of(Metric.OUTPUT_TOKENS))
            self.cache_read_tokens = int(of(Metric.CACHE_READ_TOKENS))
            self.cache_write_tokens = int(of(Metric.CACHE_WRITE_TOKENS))
            self.web_searches, self.fee_usd = int(of(Metric.WEB_SEARCHES)), float(of(Metric.FEE_USD))
            self.usd = float(of(Metric.COST_USD))
            self.started -= of(Metric.AGENT_TIME_S)

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def elapsed_s(self) -> float:
        # Without the lock (`reserve` calls this under it): read once, as a pause may end meanwhile.
        paused_at = self._paused_at
        return (paused_at if paused_at is not None else self.clock()) - self.started

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The wall-time clock stands still inside: time the harness takes for itself (scoring the
        workspace mid-run, scoring.every_steps; writing the run's record, which waits on a store
        that is away) is not the agent's. Pauses may nest and overlap across threads (the metering
        proxy records calls from its own): the clock stands still from the first one's start to
        the last one's end, and `on_pause` is told so at each."""
        with self._pausing:
            with self.lock:
                first = self._pauses == 0
                if first:
                    self._paused_at = self.clock()
                self._pauses += 1
            try:
                if first and self.on_pause is not None:
                    self.on_pause(True)
            except BaseException:
                self._end_pause()
                raise
        try:
            yield
        finally:
            with self._pausing:
                if self._end_pause() and self.on_pause is not None:
                    self.on_pause(False)

    def _end_pause(self) -> bool:
        """One pause over; whether it was the last (the clock goes on)."""
        with self.lock:
            self._pauses -= 1
            if self._pauses == 0 and self._paused_at is not None:
                self.started += self.clock() - self._paused_at
                self._paused_at = None
            return self._pauses == 0

    def wall_time_left_s(self) -> float:
        return max(0.0, self.cfg.wall_time_s - self.elapsed_s())

    def gpu_time_left_s(self) -> float:
        """Wall seconds until the GPU-hours reach budget.max_gpu_hours (inf: no cap)."""
        return math.inf if self.compute is None else self.compute.gpu_time_left_s(self.cfg.max_gpu_hours)

    def remaining_s(self) -> float:
        """The agent's time left: its wall time, or less where its GPU-hours reach their cap first
        (they run on while the clock stands still, so this may come sooner than it says)."""
        return max(0.0, min(self.wall_time_left_s(), self.gpu_time_left_s()))

    def record_step(self) -> None:
        self.steps += 1
        self.changed()

    def record_usage(self, input_tokens: int, output_tokens: int, usd: float) -> None:
        with self.lock:
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            self.usd += usd
        self.changed()

    def reserve(self, hold: Spend) -> str | None:
        """Admit a model call about to go upstream (the metering proxy asks): None, and HOLD is
        held until `settle`, while what is spent and held by the calls in flight is under every
        limit; else the first limit it reaches. A call's own hold does not count against it, so
        calls one after another go on as long as `spent()` allows, and calls at once overspend
        by at most one call's hold (when holds are at least what calls use)."""
        with self.lock:
            held = self.held
            limit = self.limit_reached(
                self.input_tokens + held.input_tokens, self.output_tokens + held.output_tokens, self.usd + held.usd
            )
            if limit is None:
                self.held, self.in_flight = held + hold, self.in_flight + 1
            return limit

    def settle(self, hold: Spend, used: Spend) -> None:
        """A call admitted by `reserve` is over: its HOLD is released and what it USED is charged."""
        with self.lock:
            self.in_flight -= 1
            self.held = self.held - hold if self.in_flight else Spend()  # none in flight: exactly nothing held
            self.input_tokens += used.input_tokens
            self.output_tokens += used.output_tokens
            self.usd += used.usd
            self.cache_read_tokens += used.cache_read_tokens
            self.cache_write_tokens += used.cache_write_tokens
            self.web_searches += used.web_searches
            self.fee_usd += used.fee_usd
        self.changed()

    def exhausted(self) -> str | None:
        """The name of the first limit reached, or None while there is budget left."""
        # "not spent < limit" rather than "spent >= limit": a NaN on either side (a price
        # or usage a server got wrong) stops the run instead of lifting the limit.
        if self.stopped_by is not None:
            return self.stopped_by
        if not self.wall_time_left_s() > 0:
            return "wall_time"
        if not self.gpu_time_left_s() > 0:
            return "gpu_hours"
        if not self.steps < self.cfg.max_steps:
            return "steps"
        return self.spent()

    def spent(self) -> str | None:
        """The first limit a model call may not go past (wall time, tokens, dollars), or None:
        what the metering proxy asks before each call. Steps are not among them: the step
        that is under way makes its call."""
        return self.limit_reached(self.input_tokens, self.output_tokens, self.usd)

    def stop(self, limit: str) -> None:
        """A limit of the run's that the harness enforces from outside (the workspace's disk, say)
        is reached: from now on it is the first one reached, and no model call is allowed."""
        self.stopped_by = self.stopped_by or limit

    def limit_reached(self, input_tokens: int, output_tokens: int, usd: float) -> str | None:
        """The first limit (wall time, GPU-hours, tokens, dollars) that these figures reach, or None."""
        cfg = self.cfg
        if self.stopped_by is not None:
            return self.stopped_by
        if not self.wall_time_left_s() > 0:
            return "wall_time"
        if not self.gpu_time_left_s() > 0:
            return "gpu_hours"
        if cfg.max_input_tokens is not None and not input_tokens < cfg.max_input_tokens:
            return "input_tokens"
        if cfg.max_output_tokens is not None and not output_tokens < cfg.max_output_tokens:
            return "output_tokens"
        if cfg.max_usd is not None and not usd < cfg.max_usd:
            return "usd"
        return None

    def note(self) -> str:
        """What is left of every limit, as an agent is shown it after each step."""
        cfg = self.cfg
        parts = [
            f"{time_left(self.wall_time_left_s())} of wall time",
            f"{max(0, cfg.max_steps - self.steps)} of {cfg.max_steps} steps",
        ]
        if cfg.max_gpu_hours is not None and self.compute is not None:
            parts.append(
                f"{max(0.0, cfg.max_gpu_hours - self.compute.gpu_hours()):.3f} of {cfg.max_gpu_hours:g} GPU-hours"
            )
        if cfg.max_usd is not None:
            parts.append(f"${max(0.0, cfg.max_usd - self.usd):.4f} of ${cfg.max_usd:g}")
        if cfg.max_input_tokens is not None:
            parts.append(f"{max(0, cfg.max_input_tokens - self.input_tokens):,} input tokens")
        if cfg.max_output_tokens is not None:
            parts.append(f"{max(0, cfg.max_output_tokens - self.output_tokens):,} output tokens")
        note = "[Budget left: " + ", ".join(parts) + "]"
        return f"{note}\n[{self.notice}]" if self.notice else note

    def summary(self) -> dict:
        return {
            Metric.STEPS: self.steps,
            Metric.INPUT_TOKENS: self.input_tokens,
            Metric.OUTPUT_TOKENS: self.output_tokens,
            Metric.CACHE_READ_TOKENS: self.cache_read_tokens,
            Metric.CACHE_WRITE_TOKENS: self.cache_write_tokens,
            Metric.WEB_SEARCHES: self.web_searches,
            Metric.FEE_USD: round(self.fee_usd, 6),
            Metric.COST_USD: round(self.usd, 6),
            Metric.AGENT_TIME_S: round(self.elapsed_s(), 3),
            **(self.compute.summary() if self.compute is not None else {}),
        }
