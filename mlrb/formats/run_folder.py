"""What the exports read of a run folder: its record (mlrb/store/record.py), the agent's events
(`trajectory.jsonl`, mlrb/run_files/trajectory.py), its prompt and the model calls as the metering proxy
saw them (the traces' CHAT_MODEL spans: each call's settings and the turns new in it)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.tags import SWEEP_ROLE, Tag
from mlrb.models.api_shapes import text_of
from mlrb.run_files.trajectory import parse
from mlrb.store import record

TRAJECTORY = "trajectory.jsonl"
INSTRUCTIONS = Path(record.TEXTS) / "instructions.md"


class NotARun(ValueError):
    """A folder that holds no run this mlrb can read (or none that has ended, where one must have)."""


@dataclass
class RunFolder:
    path: Path
    lines: list[dict[str, Any]]  # the record's
    state: dict[str, Any]  # the record folded: what the store holds (record.fold)
    events: list[dict[str, Any]] = field(default_factory=list)  # the trajectory's lines, in order

    @property
    def params(self) -> dict[str, str]:
        return self.state["params"]

    @property
    def tags(self) -> dict[str, str]:
        return self.state["tags"]

    def metric(self, name: str) -> float | None:
        """The metric's last value, None when the run did not log it."""
        history = self.state["metrics"].get(name)
        return history[-1][1] if history else None

    @property
    def name(self) -> str:
        opened = [line for line in self.lines if line["kind"] == "opened"]
        return opened[-1]["run_name"] if opened else self.path.name

    @property
    def ended(self) -> bool:
        return self.state["status"] is not None

    @property
    def instructions(self) -> str | None:
        path = self.path / INSTRUCTIONS
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    @functools.cached_property
    def chat_spans(self) -> list[dict[str, Any]]:
        """The model calls' spans (each try of a call its own), in the order they started."""
        spans = [s for trace in self.state["traces"] for s in trace["spans"] if s["span_type"] == "CHAT_MODEL"]
        return sorted(spans, key=lambda s: s["start_time_ns"])

    def first_input(self, *keys: str) -> Any:
        """The first model call's value of the first of KEYS it was sent (an unchanged value is
        recorded with the first call only)."""
        for span in self.chat_spans:
            inputs = span["inputs"] if isinstance(span["inputs"], dict) else {}
            for key in keys:
                if inputs.get(key):
                    return inputs[key]
        return None

    @property
    def system_prompt(self) -> str | None:
        """What the agent's model was told first: the built-in agent's system prompt, else the
        first call's `system` (Anthropic) or `instructions` (OpenAI Responses)."""
        for event in self.events:
            if event["event"] == "agent" and event.get("system"):
                return str(event["system"])
        found = self.first_input("system", "instructions")
        return text_of(found) if found else None

    @property
    def provider(self) -> str | None:
        for event in self.events:
            if event["event"] == "agent":
                return event.get("provider")
        for span in self.chat_spans:
            return span["attributes"].get("mlflow.llm.provider")
        return None


def read(path: Path, must_have_ended: bool = True) -> RunFolder:
    """The run in folder PATH; NotARun (one line) when it holds none, or one not yet ended."""
    path = Path(path)
    if not (path / record.FILE).is_file():
        raise NotARun(
            f"{path}: not a run folder (no {record.FILE}): name a run folder (outputs/runs/<run>) or a "
            "sweep folder (outputs/sweeps/<time>)"
        )
    try:
        lines = record.read(path)
    except (ValueError, OSError) as e:
        raise NotARun(f"{path}: its {record.FILE} cannot be read: {e}") from e
    run = RunFolder(path, lines, record.fold(lines), events(path))
    return ended(run) if must_have_ended else run


def ended(run: RunFolder) -> RunFolder:
    if not run.ended:
        raise NotARun(
            f"{run.path}: the run {run.name} has not ended (its record has no end status): export it once it has"
        )
    return run


def events(path: Path) -> list[dict[str, Any]]:
    """The trajectory's lines; a line cut short (the harness killed mid-write) is left out."""
    file = Path(path) / TRAJECTORY
    if not file.is_file():
        return []
    return [e for e in parse(file.read_text(encoding="utf-8", errors="replace").splitlines()) if "event" in e]


def runs_in(folders: list[Path]) -> list[RunFolder]:
    """The ended runs FOLDERS name: a run folder is its run, a sweep folder (its record is a
    sweep's parent run) is the runs in its job folders. NotARun for a folder that is neither,
    or a run that has not ended."""
    found: list[RunFolder] = []
    for folder in folders:
        run = read(folder, must_have_ended=False)
        if run.tags.get(Tag.ROLE) != SWEEP_ROLE:
            found.append(ended(run))
            continue
        jobs = sorted(p.parent for p in Path(folder).glob(f"*/{record.FILE}"))
        if not jobs:
            raise NotARun(f"{folder}: a sweep folder with no run folders in it")
        found += [read(job) for job in jobs]
    return found
