"""How each run's agent spent its time, and what it tried to reach, from its trajectory
(`trajectory.jsonl`, mlrb/run_files/trajectory.py).

A run's trajectory is read once: from its run folder when the run's `mlrb.run_dir` tag names a
folder here that holds this run (its `record.jsonl` opens with the run's id), else downloaded
from the store (the artifact `trajectory.jsonl`), a few runs at a time. It is folded line by
line into a `RunActivity` (seconds per category, flagged calls) and not kept. A run without a
trajectory (none recorded, or the store cannot give it) has no activity: the report counts it
as "no trajectory".

Time, per run:
- waiting on the model: each model call's latency, and the pauses before its retries;
- each tool call's duration (its `tool_result`) goes to its category (report/activity.py); a
  call with no result (the run was stopped during it) lasts until the trajectory's last line;
- the command agent's program as a whole (tool `command`) is not counted: its model and tool
  calls are;
- wall time: from the trajectory's `start` line to its `end` line (else its first and last);
  what no call accounts for (the agent's own work between calls, the harness's) is "other".
  Calls that overlap (an outside agent's parallel tool calls) can add up to more than the wall
  time: the shares are then of their sum, so they still add up to 100%.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.report import activity
from mlrb.report.runs import RunRow
from mlrb.run_files.trajectory import parse

ARTIFACT = "trajectory.jsonl"  # where run.py logs it: the artifacts' root
EXAMPLE_CHARS = 160
DOWNLOADS_AT_ONCE = 8  # a remote store answers one request per run: a few at a time


@dataclass
class RunActivity:
    wall_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(activity.CATEGORIES, 0.0))
    tool_calls: int = 0
    model_calls: int = 0
    flagged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(activity.FLAGS, 0))  # flag -> calls
    examples: dict[str, str] = field(default_factory=dict)  # flag -> the first call flagged so

    def shares(self) -> dict[str, float]:
        """category -> share of the run's time (module docstring); "other" takes what no call accounts for."""
        counted = sum(self.seconds.values())
        total = max(self.wall_s, counted)
        if total <= 0:
            return dict.fromkeys(activity.CATEGORIES, 0.0)
        seconds = {**self.seconds, activity.OTHER: self.seconds[activity.OTHER] + total - counted}
        return {c: seconds[c] / total for c in activity.CATEGORIES}


def number(value: Any) -> float:
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return 0.0


def summarise(events: Iterable[dict[str, Any]]) -> RunActivity:
    """A trajectory's events, folded into its activity (module docstring)."""
    result = RunActivity()
    open_calls: dict[str, tuple[activity.Activity, float]] = {}  # id -> (the call, when it was asked)
    first = last = start = end = None
    for event in events:
        when = event.get("time")
        if isinstance(when, int | float):
            first = when if first is None else first
            last = when
        kind = event.get("event")
        if kind == "start" and start is None:
            start = when
        elif kind == "end":
            end = when
        elif kind == "model_call":
            result.model_calls += 1
            result.seconds[activity.MODEL] += number(event.get("latency_s"))
        elif kind == "api_retry":
            result.seconds[activity.MODEL] += number(event.get("delay_s"))
        elif kind == "tool_call":
            tool = str(event.get("tool"))
            call = activity.classify(tool, event.get("arguments"))
            asked = event.get("started_ns")
            asked_s = asked / 1e9 if isinstance(asked, int | float) and asked else (when or 0.0)
            open_calls[str(event.get("id"))] = (call, asked_s)
            for flag in call.flags:
                result.flagged[flag] += 1
                result.examples.setdefault(flag, f"{tool}: {' '.join(call.text.split())[:EXAMPLE_CHARS]}")
        elif kind == "tool_result":
            call, _ = open_calls.pop(str(event.get("id")), (activity.classify(str(event.get("tool")), {}), 0.0))
            add_call(result, call, number(event.get("duration_s")))
    finish = end if end is not None else last
    for call, asked_s in open_calls.values():  # stopped during the call
        add_call(result, call, number((finish or 0.0) - asked_s) if asked_s else 0.0)
    began = start if start is not None else first
    result.wall_s = number(finish - began) if finish is not None and began is not None else 0.0
    return result


def add_call(result: RunActivity, call: activity.Activity, seconds: float) -> None:
    if call.category is None:  # the command agent's whole program: its calls are counted instead
        return
    result.tool_calls += 1
    result.seconds[call.category] += seconds


def read_file(path: Path) -> RunActivity:
    with open(path, encoding="utf-8", errors="replace") as f:
        return summarise(parse(f))


def local_trajectory(row: RunRow) -> Path | None:
    """The run's own trajectory in its run folder, when that folder is here and is this run's."""
    return local_file(row, ARTIFACT)


def local_file(row: RunRow, name: str) -> Path | None:
    """The file NAME of the run's folder, when that folder is here and is this run's (its record
    opens with the run's id: a folder of the same name may hold a later run)."""
    if not row.run_dir:
        return None
    folder = Path(row.run_dir)
    try:
        with open(folder / "record.jsonl", encoding="utf-8") as f:
            opened = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    path = folder / name
    ours = opened.get("run_id") in (row.own_id or row.run_id, row.run_id) if isinstance(opened, dict) else False
    return path if ours and path.is_file() else None


def read_local(row: RunRow) -> RunActivity | None:
    """The run's activity from its own run folder; None when the folder is not here (or not this run's)."""
    local = local_trajectory(row)
    if local is None:
        return None
    try:
        return read_file(local)
    except OSError:  # gone or unreadable since it was found: the store's copy is the same file
        return None


def download(client: Any, row: RunRow, scratch: Path) -> RunActivity | None:
    """The run's activity from the store's copy, or None when it has none to give."""
    folder = scratch / row.run_id
    try:
        downloaded = Path(client.download_artifacts(row.run_id, ARTIFACT, str(folder)))
        return read_file(downloaded) if downloaded.is_file() else None
    except Exception:  # no such artifact (a run recorded without one, or a store that lost it)
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_all(client: Any, rows: Sequence[RunRow]) -> dict[str, RunActivity | None]:
    """run id -> its activity (None: no trajectory), each run's trajectory read once. Run folders
    are read here, one after another (parsing holds the interpreter: threads would only wait on
    each other); only the store's downloads go a few at a time."""
    found = {row.run_id: read_local(row) for row in rows}
    remote = [row for row in rows if found[row.run_id] is None]
    if client is not None and remote:
        with tempfile.TemporaryDirectory(prefix="mlrb-report-") as scratch:
            with ThreadPoolExecutor(max_workers=DOWNLOADS_AT_ONCE) as pool:
                downloads = pool.map(lambda row: download(client, row, Path(scratch)), remote)
                found.update(zip([row.run_id for row in remote], downloads, strict=True))
    return found
