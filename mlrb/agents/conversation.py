"""The built-in agent's conversation, kept in the run folder after each reply and step, so that
a resumed run (mlrb/run_files/resume.py) goes on with the model's memory of what it did, instead of
starting the task over and paying for its calls again. The harness writes and reads it, out of
the sandbox's reach (the agent's state folder, which the sandbox mounts, is not the place): a
file the agent cannot change, and one that does not fit is no conversation (a fresh start)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mlrb.models.providers import Message, ToolCall, ToolResult
from mlrb.run_files import resume

FILE = "conversation.json"


def save(folder: Path, history: list[Message]) -> None:
    """HISTORY, written whole (a new file renamed over the old: a kill mid-write leaves the last one)."""
    resume.atomic_write(Path(folder) / FILE, json.dumps([dataclasses.asdict(m) for m in history]))


def load(folder: Path) -> list[Message] | None:
    """The conversation an earlier attempt kept, or None when there is none."""
    try:
        data = json.loads((Path(folder) / FILE).read_text())
        return [
            Message(
                m["role"],
                m["text"],
                tool_calls=[ToolCall(**c) for c in m["tool_calls"]],
                tool_results=[ToolResult(**r) for r in m["tool_results"]],
            )
            for m in data
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def resumed_note(why: str, attempt: int) -> str:
    """What the model is told when its run goes on in a new attempt."""
    return (
        f"[The run was stopped ({why}) and goes on now, attempt {attempt}. Your workspace is as you left it; "
        "processes you had running were stopped. Go on where you were.]"
    )
