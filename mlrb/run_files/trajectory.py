"""An append-only JSONL log of what the agent did, flushed line by line so a
crash mid-run leaves everything that happened before it."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mlrb.core import disk, events

MAX_FIELD_CHARS = 20_000


def parse(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The log's events, read back; a line that is not a JSON object (a run killed mid-write) is skipped."""
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


class Trajectory:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        disk.mend(self.path)
        self.closed = False

    def record(self, event: str, **fields: Any) -> None:
        """One line, whole or not at all (a disk the agent filled cuts none in two)."""
        if self.closed:
            raise ValueError(f"I/O operation on closed file: {self.path}")
        entry = {"time": time.time(), "event": event, **{k: clip(v) for k, v in fields.items()}}
        disk.append_whole(self.path, (json.dumps(entry, default=str) + "\n").encode("utf-8"))

    def close(self) -> None:
        self.closed = True  # (each line is written and closed as it comes)


def clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"[... {len(value) - MAX_FIELD_CHARS} more characters ...]"
    return value


class TrajectoryWriter:
    """The trajectory's subscriber to the run's events (mlrb/core/events.py): one line per event
    worth a line; closing the sink closes the file."""

    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory

    def handle(self, event: events.Event) -> None:
        record = self.trajectory.record
        match event:
            case events.RunStarted():
                record("start", run=event.run, budget=event.budget)
            case events.BudgetNotice():
                record("budget_notice", **dataclasses.asdict(event))
            case events.RunResumed():
                record("resume", **dataclasses.asdict(event))
            case events.RunEnded():
                record("end", **event.outcome, **event.spent)
            case events.AgentStarted():
                record("agent", provider=event.provider, model=event.model, tools=event.tools, system=event.system)
            case events.ContextElided():
                record("context_elided", **dataclasses.asdict(event))
            case events.ApiRetry():
                record("api_retry", **dataclasses.asdict(event))
            case events.ModelCalled():
                cost = event.cost
                record(
                    "model_call",
                    step=event.step,
                    model=event.model,
                    attempt=event.attempt,
                    latency_s=round(event.latency_s, 3),
                    input_tokens=cost.input_tokens,  # the prompt's every token, the cache's among them
                    cache_read_tokens=cost.cache_read_tokens,
                    cache_write_tokens=cost.cache_write_tokens,
                    cache_write_1h_tokens=cost.cache_write_1h_tokens,
                    output_tokens=cost.output_tokens,
                    usage_estimated=cost.estimated,
                    web_searches=cost.web_searches,  # billed beside tokens: fee_usd, within cost_usd
                    fee_usd=round(cost.fee_usd, 8),
                    cost_usd=round(cost.usd, 8),
                    tier=cost.tier,  # the service tier it was billed at
                    stop_reason=event.stop_reason,
                    text=event.text,
                    tool_calls=event.tool_calls,
                )
            case events.ApiGaveUp():
                record("api_error", **dataclasses.asdict(event))
            case events.ToolStarted():  # when it was asked for, if not now
                fields = dataclasses.asdict(event)
                record("tool_call", **{k: v for k, v in fields.items() if v or k != "started_ns"})
            case events.ToolEnded():  # the event's fields, in its order, the duration rounded
                record("tool_result", **{**dataclasses.asdict(event), "duration_s": round(event.duration_s, 3)})
            case events.Submitted():
                record("submit", **dataclasses.asdict(event))

    def close(self, error: BaseException | None) -> None:
        self.trajectory.close()
