"""python -m mlrb.export inspect RUN_OR_SWEEP_DIR... --out DIR: runs as Inspect eval logs.

One log per task and agent, written by Inspect's own writer (`inspect_ai.log.write_eval_log`),
so `inspect view` and `read_eval_log` open it. Its samples are the runs: a sample is a
configuration of the run (its budget, and the keys a sweep varied), its epochs the seeds, each
run one epoch. A sample holds the task's prompt, the conversation as the metering proxy saw the
model calls (the traces' spans; a run with no model call, the tool calls of its trajectory),
its scores (`score`, `normalised_score`, `valid`, the counted scores), its model usage with
cost, its times and how it ended. docs/formats/inspect.md says what maps to what, and what is lost.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import math
import re
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

from mlrb.analysis import stats
from mlrb.core.status import Status
from mlrb.core.tags import Metric, Tag
from mlrb.formats.run_folder import NotARun, RunFolder, runs_in
from mlrb.models.api_shapes import text_of

ATTEMPTS = {s.value for s in Status if s.is_attempt}
PROG = "python -m mlrb.export inspect"
SCORER = "mlrb"
SCORES = (Metric.SCORE, Metric.NORMALISED_SCORE, Metric.VALID, Metric.COUNTED_SCORE, Metric.COUNTED_NORMALISED_SCORE)
NO_MODEL = "none/none"  # Inspect's name for an eval without a model
STOP_REASONS = {
    "end_turn": "stop",
    "stop": "stop",
    "completed": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "tool_calls": "tool_calls",
    "max_tokens": "max_tokens",
    "length": "max_tokens",
    "incomplete": "max_tokens",
    "content_filter": "content_filter",
    "refusal": "content_filter",
}
# How a run's agent stopped (its budget's limit, mlrb/core/budget.py) as Inspect's limits, with the budget's value.
LIMITS = {
    "wall_time": ("time", "budget.wall_time_s"),
    "steps": ("turn", "budget.max_steps"),
    "input_tokens": ("token", "budget.max_input_tokens"),
    "output_tokens": ("token", "budget.max_output_tokens"),
    "usd": ("cost", "budget.max_usd"),
    "gpu_hours": ("custom", "budget.max_gpu_hours"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "runs", nargs="+", type=Path, help="run folders (outputs/runs/<run>) or sweep folders (all their runs)"
    )
    p.add_argument(
        "--out", type=Path, required=True, help="the folder the logs are written to (`inspect view --log-dir`)"
    )
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        runs = runs_in(args.runs)
    except NotARun as e:
        print(f"mlrb.export inspect: error: {e}", file=sys.stderr)
        return 2
    try:
        from inspect_ai.log import write_eval_log
    except ImportError:
        print(
            "mlrb.export inspect: error: needs the inspect-ai package: pip install 'mlrb[inspect]' "
            "(bash install.sh --dev installs it)",
            file=sys.stderr,
        )
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"mlrb.export inspect: error: --out {args.out} is a file, not a folder", file=sys.stderr)
        return 2
    logs = [eval_log(group) for group in by_task_and_agent(runs).values()]  # all made before any is written
    args.out.mkdir(parents=True, exist_ok=True)
    for log in logs:
        path = args.out / log_name(log)
        write_eval_log(log, str(path), format="eval")
        epochs = max((s.epoch for s in log.samples or []), default=0)
        print(
            f"{path}: task {log.eval.task}, agent {log.eval.solver}: {len(log.samples or [])} runs as "
            f"{len(log.eval.dataset.sample_ids or [])} samples x up to {epochs} epochs"
        )
    return 0


def by_task_and_agent(runs: list[RunFolder]) -> dict[tuple[str, str], list[RunFolder]]:
    groups: dict[tuple[str, str], list[RunFolder]] = {}
    seen: set[str] = set()
    for run in runs:
        if str(run.path.resolve()) in seen:  # a run named twice (its folder, and its sweep's)
            continue
        seen.add(str(run.path.resolve()))
        key = (
            run.params.get("task.name") or run.tags.get(Tag.TASK, "task"),
            run.params.get("agent.name") or run.tags.get(Tag.AGENT, "agent"),
        )
        groups.setdefault(key, []).append(run)
    return groups


def sample_id(run: RunFolder) -> str:
    """The run's configuration but its task, agent and seed: its budget, and the keys its sweep varied
    (a run's name is task/agent/budget/seed, then those keys)."""
    base, _, varied = run.name.partition(" ")
    parts = base.split("/")
    budget = parts[2] if len(parts) == 4 else run.params.get("budget.name", "run")
    return " ".join(p for p in (budget, varied) if p)


def seed_order(run: RunFolder) -> tuple:
    seed = run.params.get("seed", run.tags.get(Tag.SEED, ""))
    return (0, int(seed), "") if re.fullmatch(r"-?\d+", seed) else (1, 0, seed), started_at(run)


def started_at(run: RunFolder) -> str:
    return iso(run.lines[0]["t"])


def ended_at(run: RunFolder) -> str:
    return iso(run.lines[-1]["t"])


def iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(float(seconds), datetime.UTC).isoformat()


def model_key(run: RunFolder, model: str) -> str:
    return f"{run.provider}/{model}" if run.provider else model


def eval_log(runs: list[RunFolder]) -> Any:
    """The Inspect log of one task's and agent's runs."""
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalPlan,
        EvalPlanStep,
        EvalResults,
        EvalRevision,
        EvalSpec,
        EvalStats,
    )

    ids: dict[str, list[RunFolder]] = {}
    for run in runs:
        ids.setdefault(sample_id(run), []).append(run)
    samples = []
    for sid, of_id in ids.items():
        for epoch, run in enumerate(sorted(of_id, key=seed_order), 1):
            samples.append(sample_of(run, sid, epoch))
    first = min(runs, key=started_at)
    task, agent = first.params.get("task.name", "task"), first.params.get("agent.name", "agent")
    models = Counter(model for s in samples for model in s.model_usage)
    usage: dict[str, Any] = {}
    for s in samples:
        for model, used in s.model_usage.items():
            usage[model] = usage[model] + used if model in usage else used
    digest = hashlib.sha256("\n".join(sorted(r.state["run_id"] or str(r.path) for r in runs)).encode()).hexdigest()
    sweeps = {r.tags.get(Tag.SWEEP_ID) for r in runs}
    run_id = sweeps.pop() if len(sweeps) == 1 else None  # the sweep's id, when the runs are one sweep's
    commit = first.tags.get(Tag.GIT_COMMIT)
    try:
        version = metadata.version("mlrb")
    except metadata.PackageNotFoundError:
        version = "unknown"
    spec = EvalSpec(
        eval_id=digest[:22],
        run_id=run_id or digest[22:44],
        created=started_at(first),
        task=task,
        task_id=hashlib.sha256(task.encode()).hexdigest()[:22],
        task_display_name=first.params.get("task.title") or task,
        solver=agent,
        solver_args={k.removeprefix("agent."): v for k, v in first.params.items() if k.startswith("agent.")},
        tags=["mlrb"],
        dataset=EvalDataset(name=task, samples=len(ids), sample_ids=list(ids)),
        model=models.most_common(1)[0][0] if models else NO_MODEL,
        config=EvalConfig(epochs=max(s.epoch for s in samples)),
        revision=EvalRevision(type="git", origin="", commit=commit, dirty=first.tags.get(Tag.GIT_DIRTY) == "True")
        if commit
        else None,
        packages={"mlrb": version},
        metadata={"exported_by": "mlrb", "runs": [str(r.path) for r in runs]},
    )
    plan = EvalPlan(steps=[EvalPlanStep(solver=agent, params=spec.solver_args or {})])
    stats = EvalStats(started_at=started_at(first), completed_at=max(ended_at(r) for r in runs), model_usage=usage)
    results = EvalResults(
        total_samples=len(samples), completed_samples=sum(s.error is None for s in samples), scores=eval_scores(samples)
    )
    return EvalLog(status="success", eval=spec, plan=plan, results=results, stats=stats, samples=samples)


def eval_scores(samples: list[Any]) -> list[Any]:
    """Each score's mean and standard error (Inspect's mean() and stderr() metrics), counting the runs
    as the report does (mlrb/report/aggregate.py): over the attempts only (a run that is not the
    agent's doing, or that never ended, is in no mean); `valid` over every attempt, a failed one 0; the
    counted scores over every attempt, a failed one counted as doing nothing, and no mean when an
    attempt has no counted score; the raw scores, which only a valid run has, as the mean of the
    valid runs (`mean_of_valid`), never as a mean of the attempts."""
    from inspect_ai.log import EvalMetric, EvalScore

    attempts = [s for s in samples if is_attempt(s)]
    scores = []
    for name in SCORES:
        values: list[float | None] = [value_of(s, name) for s in attempts]
        if name == Metric.VALID:
            values = [v or 0.0 for v in values]  # an attempt that was never scored is no valid one
        if name in (Metric.SCORE, Metric.NORMALISED_SCORE):
            values, suffix = [v for v in values if v is not None], "_of_valid"
        else:
            suffix = ""
        if not values or any(v is None for v in values):
            continue
        counted = [float(v) for v in values if v is not None]
        metrics = {
            f"mean{suffix}": EvalMetric(name=f"mean{suffix}", value=sum(counted) / len(counted)),
            f"stderr{suffix}": EvalMetric(name=f"stderr{suffix}", value=stats.sem(counted) or 0.0),
        }
        scores.append(
            EvalScore(
                name=name,
                scorer=SCORER,
                scored_samples=len(counted),
                unscored_samples=len(samples) - len(counted),
                metrics=metrics,
            )
        )
    return scores


def value_of(sample: Any, name: str) -> float | None:
    """The sample's score NAME, None when it has none (NaN included)."""
    value = (sample.scores[SCORER].value or {}).get(name)
    return None if value is None or math.isnan(float(value)) else float(value)


def is_attempt(sample: Any) -> bool:
    """Whether the sample's run counts (mlrb/core/status.py): the agent's doing, and ended."""
    status = (sample.metadata or {}).get("status")
    return status in ATTEMPTS and (sample.metadata or {}).get("mlflow_status") == "FINISHED"


def sample_of(run: RunFolder, sid: str, epoch: int) -> Any:
    """One run as one epoch of its sample."""
    from inspect_ai.log import EvalError, EvalSample, EvalSampleLimit
    from inspect_ai.model import ModelUsage
    from inspect_ai.scorer import Score

    tags = run.tags
    value: dict[str, float | None] = {name: run.metric(name) for name in SCORES}
    explanation = tags.get(Tag.INVALID_REASON) or None  # why a submission was not valid
    usage: dict[str, Any] = {}
    for event in run.events:
        if event["event"] == "model_call":
            key = model_key(run, str(event.get("model")))
            prompt, output = int(event.get("input_tokens") or 0), int(event.get("output_tokens") or 0)
            read, written = int(event.get("cache_read_tokens") or 0), int(event.get("cache_write_tokens") or 0)
            used = ModelUsage(
                input_tokens=prompt - read - written,
                output_tokens=output,  # Inspect's: the cache's apart
                total_tokens=prompt + output,
                input_tokens_cache_read=read,
                input_tokens_cache_write=written,
                total_cost=float(event.get("cost_usd") or 0.0),
            )
            usage[key] = usage[key] + used if key in usage else used
    messages, output, source = conversation(run)
    stop = tags.get(Tag.STOP_REASON) or ""
    limit = None
    if stop in LIMITS and run.params.get(LIMITS[stop][1]) not in (None, "None"):
        kind, param = LIMITS[stop]
        limit = EvalSampleLimit.model_validate(
            {"type": kind, "limit": float(run.params[param]), "reason": f"the budget's {stop} limit"}
        )
    error = None
    if run.state["status"] == "FAILED":
        error = EvalError(message=tags.get(Tag.ERROR, "the run failed"), traceback="", traceback_ansi="")
    metadata_ = {
        "run_name": run.name,
        "run_id": run.state["run_id"],
        "run_dir": str(run.path),
        "seed": run.params.get("seed", tags.get(Tag.SEED)),
        "status": tags.get(Tag.STATUS),
        "mlflow_status": run.state["status"],
        "stop_reason": stop or None,
        "agent_message": tags.get(Tag.AGENT_MESSAGE),
        "scale": tags.get(Tag.SCALE),
        "counted_as": tags.get(Tag.COUNTED_AS),
        "counted_reason": tags.get(Tag.COUNTED_REASON),
        "steps": run.metric(Metric.STEPS),
        "cost_usd": run.metric(Metric.COST_USD),
        "messages_from": source,
    }
    return EvalSample(
        id=sid,
        epoch=epoch,
        input=run.instructions or "",
        target="",
        messages=messages,
        output=output,
        scores={
            SCORER: Score(
                value=value,
                answer=tags.get(Tag.AGENT_MESSAGE),
                explanation=explanation,
                metadata={"valid": tags.get(Tag.VALID), "invalid_reason": tags.get(Tag.INVALID_REASON)},
            )
        },
        metadata={k: v for k, v in metadata_.items() if v is not None},
        model_usage=usage,
        started_at=started_at(run),
        completed_at=ended_at(run),
        total_time=run.metric(Metric.WALL_TIME_S),
        working_time=run.metric(Metric.AGENT_TIME_S),
        uuid=run.state["run_id"],
        error=error,
        limit=limit,
    )


def conversation(run: RunFolder) -> tuple[list[Any], Any, str]:
    """The sample's messages, its output (the last answer) and where they came from: the model
    calls' spans ("model calls"), or, for a run without one, its trajectory's tool calls ("trajectory")."""
    from inspect_ai.model import ChatMessageAssistant, ModelOutput

    turns, shape, last = main_conversation(run)
    messages: list[Any] = []
    if last is not None:
        try:
            messages = asyncio.run(inspect_messages(shape, turns, run.system_prompt, last.get("model")))
            source = "model calls"
        except Exception:  # a shape Inspect's converters refuse: the trajectory's account instead
            messages = []
    if not messages:
        messages, source = from_trajectory(run), "trajectory"
    elif last is not None:
        messages.append(assistant(last["outputs"], last.get("model")))
    answer = next((m for m in reversed(messages) if isinstance(m, ChatMessageAssistant)), None)
    output = ModelOutput()
    if answer is not None:
        stop = STOP_REASONS.get(str((last or {}).get("outputs", {}).get("stop_reason")), "unknown")
        output = ModelOutput.from_message(answer, stop_reason=stop)  # type: ignore[arg-type]
    return messages, output, source


def main_conversation(run: RunFolder) -> tuple[list[Any], str, dict[str, Any] | None]:
    """The longest conversation of the run's answered model calls (an outside agent's side calls
    and subagents hold others), its API's shape and its last call ({outputs, model}). Each call's
    span holds the turns new in it and the conversation's length: a call continues the
    conversation that its earlier turns make up."""
    conversations: list[dict[str, Any]] = []
    for span in run.chat_spans:
        inputs = span["inputs"] if isinstance(span["inputs"], dict) else {}
        if span["status"] != "OK" or not isinstance(span["outputs"], dict):
            continue
        if isinstance(inputs.get("input"), str):  # Responses, with its input as one string
            new, shape = [{"role": "user", "content": inputs["input"]}], "responses"
        elif "new_input" in inputs:
            new, shape = list(inputs["new_input"]), "responses"
        else:
            provider = span["attributes"].get("mlflow.llm.provider")
            new, shape = list(inputs.get("new_messages") or []), "anthropic" if provider == "anthropic" else "chat"
        total = int((inputs.get("conversation") or {}).get("turns", len(new)))
        earlier = total - len(new)
        going_on = [c for c in conversations if earlier > 0 and len(c["turns"]) == earlier]
        if going_on:
            current = going_on[-1]
            current["turns"] = current["turns"] + new
        else:
            current = {"turns": new}
            conversations.append(current)
        current.update(shape=shape, last={"outputs": span["outputs"], "model": inputs.get("model")})
    if not conversations:
        return [], "chat", None
    longest = max(reversed(conversations), key=lambda c: len(c["turns"]))
    return longest["turns"], longest["shape"], longest["last"]


async def inspect_messages(shape: str, turns: list[Any], system: str | None, model: str | None) -> list[Any]:
    """The API's turns as Inspect's messages, by Inspect's own converters."""
    from inspect_ai.model import (
        ChatMessageSystem,
        messages_from_anthropic,
        messages_from_openai,
        messages_from_openai_responses,
    )

    if shape == "anthropic":
        return await messages_from_anthropic(turns, system)
    converted = await (
        messages_from_openai_responses(turns, model) if shape == "responses" else messages_from_openai(turns, model)
    )
    has_system = any(m.role == "system" for m in converted)
    return ([ChatMessageSystem(content=system)] if system and not has_system else []) + converted


def assistant(outputs: dict[str, Any], model: str | None) -> Any:
    """A call's answer (the span's outputs: text, tool calls) as Inspect's assistant message."""
    from inspect_ai.model import ChatMessageAssistant
    from inspect_ai.tool import ToolCall

    calls = [
        ToolCall(
            id=str(c.get("id") or ""),
            function=str(c.get("name") or ""),
            arguments=c.get("arguments") if isinstance(c.get("arguments"), dict) else {},
        )
        for c in outputs.get("tool_calls") or []
    ]
    return ChatMessageAssistant(content=str(outputs.get("text") or ""), tool_calls=calls or None, model=model)


def from_trajectory(run: RunFolder) -> list[Any]:
    """The messages a run without model calls leaves (the scripted baseline, a person): its prompt,
    and each command it ran as a tool call with its result."""
    from inspect_ai.model import ChatMessageSystem, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCallError

    messages: list[Any] = []
    if run.system_prompt:
        messages.append(ChatMessageSystem(content=run.system_prompt))
    if run.instructions is not None:
        messages.append(ChatMessageUser(content=run.instructions))
    for event in run.events:
        if event["event"] == "model_call":
            messages.append(assistant(event, event.get("model")))
        elif event["event"] == "tool_call":
            call_id = str(event.get("id") or "")
            asked = any(any(c.id == call_id for c in getattr(m, "tool_calls", None) or []) for m in messages)
            if not (call_id and asked):
                call = {"id": call_id, "name": event.get("tool"), "arguments": event.get("arguments")}
                messages.append(assistant({"text": "", "tool_calls": [call]}, None))
        elif event["event"] == "tool_result":
            output = text_of(event.get("output"))
            failed = ToolCallError(type="unknown", message=output[:2000]) if event.get("is_error") else None
            messages.append(
                ChatMessageTool(
                    content=output,
                    tool_call_id=str(event.get("id") or ""),
                    function=str(event.get("tool") or ""),
                    error=failed,
                )
            )
    return messages


def log_name(log: Any) -> str:
    """As Inspect names its logs: the time it began, the task, and the eval's id (here the agent's name too)."""
    created = log.eval.created.replace(":", "-").split(".")[0]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{log.eval.task}_{log.eval.solver}")
    return f"{created}_{safe}_{log.eval.eval_id}.eval"
