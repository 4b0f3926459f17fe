"""The scripted baseline agent: runs the task's published baseline solution in
the sandbox, exactly as a model would through its shell tool, then submits.
Its one step goes through the run's event sink as an LLM agent's steps do, so its
command and output are in the trajectory and in the run's trace."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from mlrb.agents.base import Agent, AgentContext, AgentOutcome
from mlrb.agents.tools import describe_exec
from mlrb.core import events
from mlrb.core.config import AgentConfig
from mlrb.core.status import Status
from mlrb.run_files.trajectory import MAX_FIELD_CHARS
from mlrb.sandbox.base import ExecResult

TOOL, CALL_ID = "shell", "baseline"


class BaselineAgent(Agent):
    # It runs the task's own solution, which hands in a submission: the run starts its scorer
    # with the agent, so the scorer's imports overlap the solution's work (mlrb/run.py).
    runs_known_solution = True

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg

    def run(self, ctx: AgentContext) -> AgentOutcome:
        command = ctx.task.baseline_command()
        limit = ctx.budget.exhausted()
        if limit:
            return AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "no budget left before the first step")
        return one_command_step(
            ctx,
            TOOL,
            CALL_ID,
            {"command": command},
            command,
            lambda result: command_outcome(ctx, result, BASELINE_SAYS),
        )


@dataclass(frozen=True)
class Says:
    """How an agent that is one command says it ended: out of time, its command failing, done."""

    ran_out: str
    exited: str  # followed by the exit code and the last line of the command's error
    finished: str


BASELINE_SAYS = Says("the baseline ran out of time", "baseline command exited", "baseline finished")


def command_outcome(ctx: AgentContext, result: ExecResult, says: Says) -> AgentOutcome:
    """How an agent that is one command (the baseline's script, an outside agent's program) ended:
    out of the budget's time, its command failing, or finished."""
    if result.timed_out and ctx.budget.exhausted():
        return AgentOutcome(Status.BUDGET_EXHAUSTED, ctx.budget.exhausted(), says.ran_out)
    if result.exit_code != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return AgentOutcome(Status.AGENT_ERROR, None, f"{says.exited} {result.exit_code}: {tail[:500]}")
    return AgentOutcome(Status.OK, None, says.finished)


def one_command_step(
    ctx: AgentContext,
    tool: str,
    call_id: str,
    arguments: dict,
    command: str,
    outcome_of: Callable[[ExecResult], AgentOutcome],
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[ExecResult], None] | None = None,
) -> AgentOutcome:
    """An agent that is one command for the whole run (the baseline's script, an outside agent's
    program): one step with one tool call, bounded by the budget's wall time alone, its events
    emitted as a model's step's are. `on_start` gets the step's number before the command runs,
    `on_result` the result before its events."""
    ctx.budget.record_step()
    step = ctx.budget.steps
    ctx.events.emit(events.StepStarted(step, ctx.budget.note()))
    if on_start is not None:
        on_start(step)
    ctx.events.emit(events.ToolStarted(step, tool, call_id, arguments))
    timeout_s = ctx.budget.remaining_s()
    result = ctx.sandbox.exec(command, timeout_s=timeout_s, whole_run=True)  # the whole run is this command
    if on_result is not None:
        on_result(result)
    output = describe_exec(result, timeout_s, MAX_FIELD_CHARS)
    ctx.events.emit(
        events.ToolEnded(step, tool, call_id, output.is_error, result.exit_code, result.duration_s, output.text)
    )
    outcome = outcome_of(result)
    if outcome.status == Status.OK:
        ctx.events.emit(events.Submitted(step, outcome.message))
    ctx.events.emit(events.StepEnded(step, dataclasses.asdict(outcome)))
    ctx.step_ended(step)
    return outcome
