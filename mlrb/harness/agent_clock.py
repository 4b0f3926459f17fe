"""What the agent can read of its budget at any moment: a file in its workspace that always
holds the time, steps, tokens, dollars and GPU-hours left (`$MLRB_BUDGET_FILE` in its environment), and a
last-minutes notice, once, before its time is up (in the file, in the built-in agent's budget
note, and in the run's trajectory as a `budget_notice` event).

The harness writes the file (the agent may read it, and anything it writes there is replaced):
through a new file renamed over it, so that a link the agent put in its place is replaced, not
followed. The snapshots and the workspace's patch leave it out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

from mlrb.core import events
from mlrb.core.budget import Budget
from mlrb.run_files import workspace

log = logging.getLogger(__name__)

FILE = workspace.BUDGET_FILE  # at the workspace's top
NOTICE_S = 600.0  # the last-minutes notice comes this long before the time is up...
NOTICE_SHARE = 0.1  # ...or at this share of the budget's time, for a short budget


def notice_at_s(budget: Budget) -> float:
    """Seconds left when the notice comes."""
    return min(NOTICE_S, NOTICE_SHARE * budget.cfg.wall_time_s)


def left(budget: Budget) -> dict:
    """What is left of every limit (None: no such limit), and when the time is up if the clock runs on."""
    cfg, remaining = budget.cfg, budget.remaining_s()
    return {
        "wall_time_s_left": round(remaining, 1),
        "wall_time_s": cfg.wall_time_s,
        "ends_at_unix": round(time.time() + remaining, 1),  # later if the harness pauses the clock meanwhile
        "steps_left": max(0, cfg.max_steps - budget.steps),
        "usd_left": None if cfg.max_usd is None else round(max(0.0, cfg.max_usd - budget.usd), 6),
        "input_tokens_left": None
        if cfg.max_input_tokens is None
        else max(0, cfg.max_input_tokens - budget.input_tokens),
        "output_tokens_left": None
        if cfg.max_output_tokens is None
        else max(0, cfg.max_output_tokens - budget.output_tokens),
        "gpu_hours_left": None
        if cfg.max_gpu_hours is None or budget.compute is None
        else round(max(0.0, cfg.max_gpu_hours - budget.compute.gpu_hours()), 6),
        "updated_unix": round(time.time(), 1),
    }


class AgentClock:
    """Keeps the workspace's budget file current, and gives the notice once."""

    def __init__(self, work: Path, budget: Budget, sink: events.EventSink):
        self.work, self.budget, self.sink = Path(work), budget, sink
        self.noticed = False
        self.failed = False

    def update(self) -> float | None:
        """Write the file (and give the notice when its time has come); how soon to come again
        so as to give the notice on time (None: no hurry)."""
        state = left(self.budget)
        if not self.noticed and state["wall_time_s_left"] <= notice_at_s(self.budget):
            self.noticed = True
            self.budget.notice = notice_text(state["wall_time_s_left"])
            self.sink.emit(events.BudgetNotice(self.budget.steps, state["wall_time_s_left"], self.budget.notice))
        state["notice"] = self.budget.notice
        self.write(json.dumps(state, indent=1) + "\n")
        return None if self.noticed else max(0.5, state["wall_time_s_left"] - notice_at_s(self.budget))

    def write(self, text: str) -> None:
        # The new copy has a name of its own (the patch and the snapshots leave out these two names
        # alone): whatever the agent put there is removed first, and the copy made anew, never followed.
        temporary = self.work / workspace.BUDGET_PART
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.chmod(temporary, 0o644)  # the agent runs as another user
                os.replace(temporary, self.work / FILE)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
        except OSError as e:  # say, a folder the agent put in its place: the agent loses its clock, nothing else
            if not self.failed:
                log.warning("could not write the agent's budget file %s: %s", self.work / FILE, e)
            self.failed = True


def notice_text(seconds_left: float) -> str:
    minutes = max(1, round(seconds_left / 60))
    return (
        f"About {minutes} minute{'s' if minutes != 1 else ''} of wall time left: put your best submission in "
        "place now; when the time is up your workspace is scored as it is."
    )
