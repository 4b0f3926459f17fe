"""The scripted baseline agent: runs the task's published baseline solution in
the sandbox, exactly as a model would through its shell tool, then submits.
Its one step goes through the run's event sink as an LLM agent's steps do, so its
command and output are in the trajectory and in the run's trace."""

from __future__ import annotations

import dataclasses

from mlrb import events
from mlrb.agents.base import AgentContext, AgentOutcome
from mlrb.agents.tools import describe_exec
from mlrb.config import AgentConfig
from mlrb.sandbox.base import ExecResult
from mlrb.status import Status
from mlrb.trajectory import MAX_FIELD_CHARS

TOOL, CALL_ID = "shell", "baseline"


class BaselineAgent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg

    def run(self, ctx: AgentContext) -> AgentOutcome:
        command = ctx.task.spec.baseline_command
        limit = ctx.budget.exhausted()
        if limit:
            return AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "no budget left before the first step")
        ctx.budget.record_step()
        step = ctx.budget.steps
        ctx.events.emit(events.StepStarted(step, ctx.budget.note()))
        ctx.events.emit(events.ToolStarted(step, TOOL, CALL_ID, {"command": command}))
        timeout_s = ctx.budget.remaining_s()
        result = ctx.sandbox.exec(command, timeout_s=timeout_s, whole_run=True)  # the whole run is this script
        output = describe_exec(result, timeout_s, MAX_FIELD_CHARS)
        ctx.events.emit(
            events.ToolEnded(step, TOOL, CALL_ID, output.is_error, result.exit_code, result.duration_s, output.text)
        )
        outcome = self.outcome(ctx, result)
        if outcome.status == Status.OK:
            ctx.events.emit(events.Submitted(step, outcome.message))
        ctx.events.emit(events.StepEnded(step, dataclasses.asdict(outcome)))
        ctx.step_ended(step)
        return outcome

    @staticmethod
    def outcome(ctx: AgentContext, result: ExecResult) -> AgentOutcome:
        if result.timed_out and ctx.budget.exhausted():
            return AgentOutcome(Status.BUDGET_EXHAUSTED, ctx.budget.exhausted(), "the baseline ran out of time")
        if result.exit_code != 0:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            return AgentOutcome(Status.AGENT_ERROR, None, f"baseline command exited {result.exit_code}: {tail}")
        return AgentOutcome(Status.OK, None, "baseline finished")
