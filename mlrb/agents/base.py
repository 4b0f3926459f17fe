"""The agent interface: given instructions, a sandbox and a budget, act and report how it ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from mlrb.budget import Budget
from mlrb.config import AgentConfig
from mlrb.sandbox.base import Sandbox
from mlrb.tasks.base import Task
from mlrb.trajectory import Trajectory


@dataclass
class AgentContext:
    task: Task
    instructions: str
    sandbox: Sandbox
    budget: Budget
    trajectory: Trajectory
    seed: int


@dataclass
class AgentOutcome:
    # "submitted": the agent said it is done; "budget_exhausted": a limit stopped it;
    # "agent_error": the agent's own work failed (its score still counts, as a failure).
    status: str
    stop_reason: Optional[str] = None
    message: str = ""


class Agent(Protocol):
    def __init__(self, cfg: AgentConfig) -> None: ...

    def run(self, ctx: AgentContext) -> AgentOutcome: ...
