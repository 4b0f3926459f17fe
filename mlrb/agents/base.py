"""The agent interface: given instructions, a sandbox and a budget, act and report how it ended."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig
from mlrb.core.events import EventSink
from mlrb.core.status import Status
from mlrb.harness.resume import Resumption
from mlrb.sandbox.base import Sandbox
from mlrb.tasks.base import Task


@dataclass
class AgentContext:
    task: Task
    instructions: str
    sandbox: Sandbox
    budget: Budget
    # The run's event sink (mlrb/core/events.py): what the agent emits there reaches the
    # trajectory file, the MLflow traces and the metrics. The harness opens and closes it.
    events: EventSink
    seed: int
    # The run's own folder on the host (outside the sandbox): for the agent's logs.
    run_dir: Path | None = None
    # Called with the step's number after each step (the harness snapshots the workspace).
    on_step_end: Callable[[int], object] | None = None  # what it returns is not used
    # The run's metering proxy (mlrb/proxy.MeteringProxy), for an agent that asked for one
    # (`model_upstreams()`); the sandbox's `model_url` is where it is reached from inside.
    model: Any = None
    # A run that goes on in a new attempt (mlrb/harness/resume.py): None on its first.
    resumed: Resumption | None = None
    # A folder of the run (outside the sandbox) kept across its attempts, for the agent's own state
    # (a conversation, a session's id): what it needs to go on where it was when the run resumes.
    state_dir: Path | None = None

    def step_ended(self, step: int) -> None:
        if self.on_step_end is not None:
            self.on_step_end(step)


@dataclass
class AgentOutcome:
    # One of status.AGENT_ENDINGS: OK (the agent said it is done), BUDGET_EXHAUSTED (a
    # limit stopped it) or AGENT_ERROR (its model or API failed it after retries); the
    # workspace is scored in every case. The run's status follows (status.of_run).
    status: Status
    stop_reason: str | None = None
    message: str = ""


class Agent(Protocol):
    def __init__(self, cfg: AgentConfig) -> None:
        """Raise ConfigError for anything missing (say an API key): this runs before the MLflow run exists."""
        ...

    # Optional: `@classmethod check_config(cls, cfg: AgentConfig) -> None` raising ConfigError,
    # called when configs are validated (before Hydra launches anything); no network, no heavy imports.

    def run(self, ctx: AgentContext) -> AgentOutcome: ...
