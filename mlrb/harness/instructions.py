"""Render a task's prompt from MLRB's template fields and the run's budget."""

from __future__ import annotations

from pathlib import Path

from mlrb.core.config import BudgetConfig
from mlrb.core.messages import time_limit
from mlrb.tasks.base import Task

TEMPLATE = Path(__file__).resolve().parents[1] / "tasks" / "instructions.md"
OWN_TEMPLATE = """{problem}

## Your environment
- Your workspace (the only place you may write): {workspace}. It starts as a copy of the task's files.
- A read-only copy of those starting files: {data_dir} (also $MLRB_DATA).
- The harness enforces your budget: {budget}. When it runs out, your workspace is scored as it is.
"""


def render(task: Task, budget: BudgetConfig, workspace: str, data_dir: str) -> str:
    own = task.start.instructions()
    if own is not None:  # a folder task's research problem, then the run's environment
        return OWN_TEMPLATE.format(
            problem=own.strip(), budget=describe_budget(budget), workspace=workspace, data_dir=data_dir
        ) + clock_note(workspace)
    prompt, hw = task.start.prompt, task.hardware
    compute = f"{hw.gpus} x {hw.gpu_type} GPU" if hw.gpus else "CPU only, no GPU"
    if hw.cpus:
        compute += f", {hw.cpus} CPU cores"
    if hw.memory_gb:
        compute += f", {hw.memory_gb:g} GB memory"
    fields = {
        "title": task.start.title,
        "task": prompt.task,
        "dataset": prompt.dataset,
        "dataset_shape": prompt.dataset_shape,
        "models": prompt.models,
        "compute": compute,
        "time_limit": f"The competition allows {time_limit(task.start.time_limit_s)}",
        "budget": describe_budget(budget),
        "result": prompt.result,
        "evaluation": prompt.evaluation,
        "rules": "\n".join(f"- {rule}" for rule in prompt.rules) or "- none",
        "additional_info": prompt.additional_info or "none",
        "workspace": workspace,
        "data_dir": data_dir,
        "submission": task.rules.submission,
    }
    return TEMPLATE.read_text().format_map(fields) + clock_note(workspace)


def clock_note(workspace: str) -> str:
    """Where the agent reads its clock (mlrb/harness/agent_clock.py)."""
    return (
        f"\nThe file {workspace}/.mlrb_budget.json (also $MLRB_BUDGET_FILE) always holds the wall time, steps "
        "and money you have left; a notice comes there, once, in the last minutes.\n"
    )


def describe_budget(budget: BudgetConfig) -> str:
    parts = [f"{time_limit(budget.wall_time_s)} of wall time", f"{budget.max_steps} steps"]
    if budget.max_usd is not None:
        parts.append(f"${budget.max_usd:g} of API cost")
    return ", ".join(parts)
