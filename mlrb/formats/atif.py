"""A run's trajectory as ATIF, the Agent Trajectory Interchange Format of Harbor (its RFC 0001;
the `harbor` package's `harbor.models.trajectories` models and its validator), written at the
end of every run beside `trajectory.jsonl` as `trajectory.atif.json` and logged as an artifact.

What maps to what (docs/formats/atif.md says it for users):

- the system prompt, when one is known, is a `system` step; the task's instructions a `user` step;
- each model call the metering proxy metered is one `agent` step: its text, the tools it asked
  for (`tool_calls`), their results (`observation`, each linked by its call's id) and its usage
  and cost as the run was charged them (`metrics`: prompt tokens, every one of the prompt's, its
  `cached_tokens` read from the provider's cache among them, completion tokens, `cost_usd`; the
  tokens written to the cache in `extra`);
  the failed tries before it are in the step's `extra.api_retries`;
- a tool call no model asked for (the scripted baseline's command) is an `agent` step with
  `llm_call_count` 0;
- what the harness said or did between steps (a budget notice, a resumed attempt, an API that
  gave up) is a `system` step;
- `final_metrics` holds the run's totals as its budget counted them (`end` in trajectory.jsonl).
"""

from __future__ import annotations

import datetime
import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

from mlrb.core.messages import first_line
from mlrb.core.tags import Tag
from mlrb.formats.run_folder import TRAJECTORY, RunFolder, read

log = logging.getLogger(__name__)

SCHEMA_VERSION = "ATIF-v1.7"
FILE = "trajectory.atif.json"
NOTES = (
    "Converted by mlrb from the run's trajectory.jsonl: one agent step per metered model call, its usage and "
    "cost as the run's budget was charged them; a tool call no model asked for is an agent step with "
    "llm_call_count 0; the harness's own messages are system steps."
)


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(float(seconds), datetime.UTC).isoformat()


def tool_definition(tool: Any) -> dict[str, Any] | None:
    """A tool as the API was sent it, in OpenAI's function-calling shape (what ATIF asks for)."""
    if not isinstance(tool, dict):
        return None
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):  # Chat Completions
        return tool
    if "name" not in tool:
        return None
    schema = tool.get("input_schema", tool.get("parameters"))  # Anthropic; Responses
    function = {"name": tool["name"], "description": tool.get("description", ""), "parameters": schema or {}}
    return {"type": "function", "function": function}


class Steps:
    """The steps as they are built, in order; their ids are given at the end."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.by_call: dict[str, dict[str, Any]] = {}  # a tool call's id -> the step that holds it
        self.unnamed = 0

    def add(self, step: dict[str, Any]) -> dict[str, Any]:
        self.steps.append(step)
        return step

    def call_id(self, raw: Any) -> str:
        if raw:
            return str(raw)
        self.unnamed += 1
        return f"mlrb-call-{self.unnamed}"

    def agent_step(self, event: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """A model call's step (mlrb's `model_call` line)."""
        calls = []
        for call in event.get("tool_calls") or []:
            call_id = self.call_id(call.get("id"))
            calls.append(
                {
                    "tool_call_id": call_id,
                    "function_name": str(call.get("name") or ""),
                    "arguments": call.get("arguments") if isinstance(call.get("arguments"), dict) else {},
                }
            )
        # ATIF's names for the call's charge (its Metrics), from the trajectory's model_call line
        # (prompt_tokens counts every token of the prompt, cached_tokens those of them read from the cache)
        charged = {
            "prompt_tokens": int(event.get("input_tokens") or 0),
            "completion_tokens": int(event.get("output_tokens") or 0),
            "cached_tokens": int(event.get("cache_read_tokens") or 0),
            "cost_usd": float(event.get("cost_usd") or 0.0),
            "extra": {
                "usage_estimated": bool(event.get("usage_estimated")),
                "cache_write_tokens": int(event.get("cache_write_tokens") or 0),
                "cache_write_1h_tokens": int(event.get("cache_write_1h_tokens") or 0),
                "latency_s": event.get("latency_s"),
            },
        }
        step = {
            "source": "agent",
            "timestamp": iso(event.get("time")),
            "model_name": event.get("model"),
            "message": str(event.get("text") or ""),
            "llm_call_count": 1,
            "metrics": charged,
            "extra": {
                "mlrb_step": event.get("step"),
                "attempt": event.get("attempt"),
                "stop_reason": event.get("stop_reason"),
                **extra,
            },
        }
        if calls:
            step["tool_calls"] = calls
        self.add(step)
        for call in calls:
            self.by_call.setdefault(call["tool_call_id"], step)
        return step

    def tool_call(self, event: dict[str, Any]) -> None:
        """A tool call: in its model call's step, else (no model asked for it) a step of its own."""
        call_id = str(event.get("id") or "")
        if call_id and call_id in self.by_call:
            return
        call: dict[str, Any] = {
            "tool_call_id": self.call_id(call_id),
            "function_name": str(event.get("tool") or ""),
            "arguments": event.get("arguments") if isinstance(event.get("arguments"), dict) else {},
        }
        step = {
            "source": "agent",
            "timestamp": iso(event.get("time")),
            "message": "",
            "llm_call_count": 0,
            "tool_calls": [call],
            "extra": {"mlrb_step": event.get("step")},
        }
        self.add(step)
        self.by_call[call["tool_call_id"]] = step
        if not call_id:  # its result names no id either: it answers the latest call of this tool
            self.by_call[f"unnamed {call['function_name']}"] = step

    def tool_result(self, event: dict[str, Any]) -> None:
        call_id = str(event.get("id") or "")
        step = self.by_call.get(call_id) if call_id else self.by_call.get(f"unnamed {event.get('tool')}")
        if step is None:  # a result whose call was never seen: given the call it answers
            self.tool_call(event)
            step = self.steps[-1]
        if not call_id:
            call_id = step["tool_calls"][-1]["tool_call_id"]
        result = {
            "source_call_id": call_id,
            "content": str(event.get("output") or ""),
            "extra": {k: event.get(k) for k in ("is_error", "exit_code", "duration_s")},
        }
        step.setdefault("observation", {"results": []})["results"].append(result)

    def system(self, event: dict[str, Any], message: str, **extra: Any) -> None:
        self.add(
            {
                "source": "system",
                "timestamp": iso(event.get("time")),
                "message": message,
                "extra": {"mlrb_event": event["event"], **extra},
            }
        )


def convert(run: RunFolder) -> dict[str, Any]:
    """The run's trajectory as an ATIF document (a dict, as its JSON)."""
    steps = Steps()
    events = run.events
    started = events[0].get("time") if events else None
    system = run.system_prompt
    if system:
        steps.add({"source": "system", "timestamp": iso(started), "message": system})
    if run.instructions is not None:
        steps.add({"source": "user", "timestamp": iso(started), "message": run.instructions})
    pending: dict[str, Any] = {}  # what the next model call's step carries: the failed tries before it
    ended: dict[str, Any] = {}
    extra: dict[str, Any] = {"run_name": run.name, "run_dir": str(run.path)}
    for event in events:
        kind = event["event"]
        if kind == "model_call":
            steps.agent_step(event, pending)
            pending = {}
        elif kind == "api_retry":
            retry = {k: event.get(k) for k in ("attempt", "status", "error", "delay_s")}
            pending.setdefault("api_retries", []).append(retry)
        elif kind == "context_elided":
            pending["context_elided_items"] = event.get("items")
        elif kind == "tool_call":
            steps.tool_call(event)
        elif kind == "tool_result":
            steps.tool_result(event)
        elif kind == "api_error":
            steps.system(
                event,
                f"the model API gave up at step {event.get('step')} (attempt {event.get('attempt')}): "
                f"{event.get('error')}",
                status=event.get("status"),
            )
        elif kind == "budget_notice":
            steps.system(event, str(event.get("text") or ""), seconds_left=event.get("seconds_left"))
        elif kind == "resume":
            steps.system(
                event,
                f"the run went on in attempt {event.get('attempt')} ({event.get('why')}); "
                f"the workspace {event.get('workspace')}",
                spent=event.get("spent"),
            )
        elif kind == "start":
            extra["budget"] = event.get("budget")
        elif kind == "submit":
            extra["submitted"] = event.get("summary")
        elif kind == "end":
            ended = event
    if not steps.steps:
        steps.add({"source": "system", "message": "the run recorded no step"})
    for number, step in enumerate(steps.steps, 1):
        step["step_id"] = number
    document: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "session_id": run.state["run_id"] or run.name,
        "agent": agent_of(run),
        "steps": [{k: v for k, v in step.items() if v is not None} for step in steps.steps],
        "notes": NOTES,
        "extra": {
            **extra,
            **{
                k: run.tags[t]
                for k, t in (("task", Tag.TASK), ("seed", Tag.SEED), ("scale", Tag.SCALE))
                if t in run.tags
            },
        },
    }
    if ended:
        outcome = {k: ended.get(k) for k in ("status", "stop_reason", "message")}
        document["final_metrics"] = {
            "total_prompt_tokens": int(ended.get("input_tokens") or 0),
            "total_completion_tokens": int(ended.get("output_tokens") or 0),
            "total_cached_tokens": int(ended.get("cache_read_tokens") or 0),
            "total_cost_usd": float(ended.get("cost_usd") or 0.0),
            "total_steps": len(steps.steps),
            "extra": {
                "agent_steps": ended.get("steps"),
                "agent_time_s": ended.get("agent_time_s"),
                "outcome": outcome,
                "cache_write_tokens": int(ended.get("cache_write_tokens") or 0),
            },
        }
    return document


def agent_of(run: RunFolder) -> dict[str, Any]:
    """ATIF's `agent`: mlrb's agent config's name, mlrb's version (and commit), the model and its tools."""
    try:
        version = metadata.version("mlrb")
    except metadata.PackageNotFoundError:
        version = "unknown"
    commit = run.tags.get(Tag.GIT_COMMIT)
    agent: dict[str, Any] = {
        "name": run.params.get("agent.name") or run.tags.get(Tag.AGENT) or "unknown",
        "version": f"mlrb {version}" + (f" ({commit[:12]})" if commit else ""),
    }
    models = [e.get("model") for e in run.events if e["event"] in ("agent", "model_call") and e.get("model")]
    model = run.params.get("agent.options.model") or (models[0] if models else None)
    if model:
        agent["model_name"] = str(model)
    tools = [t for t in map(tool_definition, run.first_input("tools") or []) if t]
    if tools:
        agent["tool_definitions"] = tools
    extra = {"kind": run.params.get("agent.kind"), "provider": run.provider}
    agent["extra"] = {k: v for k, v in extra.items() if v}
    return agent


def write(run_dir: Path) -> Path:
    """Write RUN_DIR's trajectory as ATIF into the folder; returns the file."""
    document = convert(read(run_dir, must_have_ended=False))
    path = Path(run_dir) / FILE
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    partial.replace(path)
    return path


def record(run_dir: Path, recorder: Any) -> str | None:
    """Write the run's ATIF trajectory and log it as an artifact. A run never fails of it: a
    failure is logged as a warning and returned as a note (None when it was written, or when
    the run has no trajectory: it stopped before its agent started)."""
    if not (Path(run_dir) / TRAJECTORY).is_file():
        return None
    try:
        recorder.log_file(write(run_dir))
    except Exception as e:
        log.warning("writing the ATIF trajectory failed", exc_info=e)
        return f"writing the ATIF trajectory ({FILE}) failed: {type(e).__name__}: {first_line(e)}"
    return None
