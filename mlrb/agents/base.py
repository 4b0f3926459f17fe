"""The agent interface: given instructions, a sandbox and a budget, act and report how it ended."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig
from mlrb.core.events import EventSink
from mlrb.core.status import Status
from mlrb.run_files.resume import Resumption
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
    # A run that goes on in a new attempt (mlrb/run_files/resume.py): None on its first.
    resumed: Resumption | None = None
    # A folder of the run (outside the sandbox) kept across its attempts, for the agent's own state
    # (a conversation, a session's id): what it needs to go on where it was when the run resumes.
    state_dir: Path | None = None

    def step_ended(self, step: int) -> None:
        if self.on_step_end is not None:
            self.on_step_end(step)


@dataclass
class AgentOutcome:
    # How the agent's own part ended: OK (the agent said it is done), BUDGET_EXHAUSTED (a
    # limit stopped it) or AGENT_ERROR (its model or API failed it after retries); the
    # workspace is scored in every case. The run's status follows (status.of_run).
    status: Status
    stop_reason: str | None = None
    message: str = ""


class Agent(abc.ABC):
    """What every agent kind is (mlrb.core.registry.AGENTS names them) and what it declares it
    does. Each kind subclasses this; the harness reads these declarations (a kind that does
    something overrides its default) and never probes an agent for what it has."""

    # It hands in a known solution (the task's baseline command): the scorer starts with the run.
    runs_known_solution: ClassVar[bool] = False
    # It runs its tools itself and emits their events: the harness need not read tool calls from
    # its model calls.
    emits_tool_events: ClassVar[bool] = False
    # How often the run's metering proxy retries a failed upstream call for it; None: the proxy's
    # default. 0 for an agent that retries by itself (each try is then a call of its own).
    proxy_retries: ClassVar[int | None] = None
    # Programs of its own the sandbox mounts for it (read-only), set once `prepare` has them.
    tools_dir: Path | None = None

    def __init__(self, cfg: AgentConfig) -> None:
        """Raise ConfigError for anything missing (say an API key): this runs before the MLflow run exists."""
        self.cfg = cfg

    @classmethod
    def check_config(cls, cfg: AgentConfig) -> None:
        """Raise ConfigError for a config that cannot work, when configs are validated (before Hydra
        launches anything): no network, no heavy imports. Nothing to check by default."""
        return None

    def prepare(self, cache_dir: Path) -> None:
        """Before the run opens: what it needs on this machine (say its program, installed into the
        cache), or ConfigError. Nothing by default."""
        return None

    def warm_up(self) -> None:
        """While the run's store is checked: slow imports started on a thread. Nothing by default."""
        return None

    def model_upstreams(self) -> dict[str, Any] | None:
        """The providers it may call through the run's metering proxy, by name; None: it calls no
        model, and the run starts no proxy."""
        return None

    @abc.abstractmethod
    def run(self, ctx: AgentContext) -> AgentOutcome:
        """Act in ctx.sandbox under ctx.budget, and say how it ended."""
