"""What a run folder holds that a review reads, loaded once: the agent's tool calls (each with its
step, what it asked for and what came back; an outside agent's whole transcript too), the model calls the metering proxy refused, the files
the workspace's patch changed, the harness's notes on the workspace, the step snapshots, and the
run's tags and params. Read from the files the harness writes (mlrb/formats/run_folder.py reads the
record and the trajectory), so a past run is reviewed as a live one is.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.tags import Tag
from mlrb.formats import run_folder
from mlrb.run_files import snapshots
from mlrb.store import record

PATCH = Path(record.TEXTS) / "workspace.patch"
NOTES = Path(record.TEXTS) / "workspace_notes.txt"
PATCH_HEADER = re.compile(r"^diff --mlrb a/(.*) b/\1$")


@dataclass(frozen=True)
class ToolUse:
    """One tool call of the agent: what it asked for (a shell command, a file's path and content)
    and what came back, at its step."""

    step: int
    tool: str
    text: str  # the arguments' text: the command, or a file tool's path and content
    output: str  # what came back ("" when the run ended first)


@dataclass(frozen=True)
class Refusal:
    """A model call the metering proxy answered itself (mlrb/models/proxy.py), with its reason."""

    step: int
    model: str
    reason: str


@dataclass(frozen=True)
class PatchedFile:
    path: str  # relative to the workspace
    state: str  # "added", "changed" or "deleted"


@dataclass
class RunEvidence:
    path: Path
    name: str
    tags: dict[str, str]
    params: dict[str, str]
    tools: list[ToolUse] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    patched: list[PatchedFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # workspace_notes.txt's lines
    steps: list[dict[str, Any]] = field(default_factory=list)  # snapshots/steps.jsonl's lines
    builtin_agent: bool = False  # the built-in agent's own steps (an `agent` event): the snapshots follow its tools

    @property
    def network_allowed(self) -> bool:
        return self.tags.get(Tag.NETWORK, "false").lower() == "true"

    @property
    def cache_dir(self) -> str | None:
        """Where the run's task assets (their hidden parts included) are kept on the host."""
        found = self.params.get("paths.cache_dir")
        return str(Path(found).expanduser()) if found and found != "None" else None

    @property
    def read_only_globs(self) -> list[str]:
        """The read-only files the config names (a task folder's own list is in its hidden assets:
        what the harness restored of it is the tag `mlrb.read_only_restored`)."""
        try:
            globs = ast.literal_eval(self.params.get("task.read_only_files", "[]"))
        except (ValueError, SyntaxError):
            return []
        return [str(g) for g in globs] if isinstance(globs, list) else []

    @property
    def restored(self) -> list[str]:
        """The read-only files the agent changed, which the harness restored before scoring."""
        return [p.strip() for p in self.tags.get(Tag.READ_ONLY_RESTORED, "").split(",") if p.strip()]


def load(path: Path) -> RunEvidence:
    """The run in folder PATH; run_folder.NotARun when it holds none."""
    run = run_folder.read(Path(path), must_have_ended=False)
    return assemble(Path(path), run.name, dict(run.tags), dict(run.params), run.events, run.state["traces"])


def assemble(
    path: Path,
    name: str,
    tags: dict[str, str],
    params: dict[str, str],
    events: list[dict[str, Any]],
    traces: list[dict[str, Any]],
) -> RunEvidence:
    """The evidence of a run whose files are laid out in PATH as in its run folder (the trajectory,
    the patch and notes, agent/, snapshots/), with its tags, params, trajectory events and traces."""
    evidence = RunEvidence(Path(path), name, tags, params)
    evidence.tools = tool_uses(events)
    evidence.tools += transcripts(Path(path), evidence.tools)
    evidence.builtin_agent = any(e["event"] == "agent" for e in events)
    evidence.refusals = refusals(traces)
    evidence.patched = patched_files(read_text(Path(path) / PATCH))
    evidence.notes = [line for line in read_text(Path(path) / NOTES).splitlines() if line.strip()]
    evidence.steps = step_lines(Path(path) / "snapshots" / snapshots.STEPS)
    return evidence


def read_text(file: Path) -> str:
    return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else ""


def tool_uses(events: list[dict[str, Any]]) -> list[ToolUse]:
    """The trajectory's tool calls, each with its result (matched by id), in the order asked."""
    results = {e.get("id"): str(e.get("output", "")) for e in events if e["event"] == "tool_result"}
    return [
        ToolUse(
            int(e.get("step") or 0),
            str(e.get("tool", "")),
            arguments_text(e.get("arguments")),
            results.get(e.get("id"), ""),
        )
        for e in events
        if e["event"] == "tool_call"
    ]


def transcripts(path: Path, tools: list[ToolUse]) -> list[ToolUse]:
    """What an outside agent printed, whole (agent/*.txt: a program's stdout and stderr, a person's
    terminal), where the trajectory does not hold it already: its copy there is cut at
    trajectory.MAX_FIELD_CHARS, and a program can print past it."""
    found = []
    for file in sorted((path / "agent").glob("*.txt")):
        text = read_text(file)
        if text.strip() and not any(text.strip() in use.output for use in tools):
            found.append(ToolUse(max((u.step for u in tools), default=0), f"agent/{file.name}", "", text))
    return found


def arguments_text(arguments: Any) -> str:
    """A tool call's arguments as text: their string values, a line each (the command; a file's
    path and content); anything else as JSON."""
    if isinstance(arguments, dict):
        return "\n".join(v if isinstance(v, str) else json.dumps(v) for v in arguments.values())
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def refusals(traces: list[dict[str, Any]]) -> list[Refusal]:
    """The model calls that failed (a step's CHAT_MODEL span ended in error), with the proxy's reason."""
    found = []
    for trace in traces:
        for span in trace["spans"]:
            if span.get("span_type") != "CHAT_MODEL" or span.get("status") != "ERROR":
                continue
            reason = str(span.get("status_description") or "").removeprefix("Exception: ")
            model = str((span.get("attributes") or {}).get("mlflow.llm.model", ""))
            found.append(Refusal(int(trace.get("step") or 0), model, reason))
    return found


def patched_files(patch: str) -> list[PatchedFile]:
    """The files the workspace's patch names (mlrb/run_files/workspace.py's `diff`), each added,
    changed or deleted."""
    files: list[PatchedFile] = []
    lines = patch.splitlines()
    for i, line in enumerate(lines):
        header = PATCH_HEADER.match(line)
        if header is None:
            continue
        following = lines[i + 1 : i + 3]
        if any(f.startswith("--- /dev/null") or f.endswith(" added") or " added (" in f for f in following):
            state = "added"
        elif any(f.startswith("+++ /dev/null") or " deleted (" in f for f in following):
            state = "deleted"
        else:
            state = "changed"
        files.append(PatchedFile(header.group(1), state))
    return files


def step_lines(file: Path) -> list[dict[str, Any]]:
    if not file.is_file():
        return []
    lines = []
    for text in file.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines
