"""What happened in a run, as typed events, and the one sink per run that hands each to
its subscribers: the trajectory file (`trajectory.TrajectoryWriter`), the MLflow traces
(`agents.tracing.TraceWriter`) and the metrics (`agents.recording.MetricsWriter`).

The harness opens the sink (`agents.recording.open_sink`), emits the run's start and
end, and closes it; between them the agent, whichever it is, emits what it does (the
LLM agent's loop, the baseline's one command). The budget counts the cost; each
subscriber decides what its record holds. Events that open something (a step, a model
call, a tool call) are closed by their own ending event; if the agent stops on an
exception instead, the sink's `close` hands that exception to every subscriber, which
closes whatever is open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class RunStarted:
    run: str  # the run's name
    budget: dict[str, Any]  # the budget's config


@dataclass(frozen=True)
class RunResumed:
    """The run goes on in a new attempt, after its process ended before the run was recorded."""

    attempt: int  # this attempt (the first is 1)
    why: str  # how the attempt before it ended, as far as the harness knows
    spent: dict[str, Any]  # what the attempts before it spent, carried
    workspace: str  # "as it was" (the folder survived) or "from step N's snapshot"


@dataclass(frozen=True)
class BudgetNotice:
    """The agent's time is nearly up: said once (mlrb/harness/agent_clock.py)."""

    step: int
    seconds_left: float
    text: str


@dataclass(frozen=True)
class RunEnded:
    """The agent is done (the harness scores its workspace next)."""

    outcome: dict[str, Any]  # how the agent ended: status, stop_reason, message
    spent: dict[str, Any]  # what it spent of the budget


@dataclass(frozen=True)
class AgentStarted:
    provider: str
    model: str
    tools: list[str]
    system: str


@dataclass(frozen=True)
class StepStarted:
    step: int
    budget: str  # what is left of every limit, as the model is shown it


@dataclass(frozen=True)
class StepEnded:
    step: int
    outcome: dict[str, Any] | None  # how the run ended, when it ended at this step


@dataclass(frozen=True)
class ContextElided:
    step: int
    items: int


@dataclass(frozen=True)
class ModelCallStarted:
    step: int
    attempt: int
    provider: str
    model: str
    timeout_s: float
    request: dict[str, Any]  # what is new in this call (not the whole conversation again)
    # When the call began (time.time_ns()): the metering proxy reports a call once it is over.
    started_ns: int = 0


@dataclass(frozen=True)
class Cost:
    """One call's charge: the API's reported usage (estimated when it reports none) times the prices.
    The input tokens are every token of the prompt; those read from the provider's prompt cache and
    those written to it (an hour's among them) are parts of them, each priced at its own rate."""

    input_tokens: int
    output_tokens: int
    estimated: bool
    input_usd: float  # the prompt's tokens, each kind at its rate
    output_usd: float
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    fee_usd: float = 0.0  # what the provider billed beside tokens: its web searches
    web_searches: int = 0
    tier: str = "standard"  # the service tier it was billed at: "standard", or the provider's ("priority", "flex")

    @property
    def usd(self) -> float:
        return self.input_usd + self.output_usd + self.fee_usd


@dataclass(frozen=True)
class ModelCalled:
    """A model call that returned; it ends its ModelCallStarted."""

    step: int
    attempt: int
    model: str
    latency_s: float
    text: str
    tool_calls: list[dict[str, Any]]
    stop_reason: str | None
    cost: Cost


@dataclass(frozen=True)
class ModelCallFailed:
    """A model call that failed; it ends its ModelCallStarted. `error` is already redacted."""

    step: int
    attempt: int
    error: str


@dataclass(frozen=True)
class BudgetState:
    """The run's totals after a call was charged."""

    step: int
    input_tokens: int
    output_tokens: int
    usd: float


@dataclass(frozen=True)
class ApiRetry:
    step: int
    attempt: int
    status: int | None
    error: str
    delay_s: float


@dataclass(frozen=True)
class ApiGaveUp:
    step: int
    attempt: int
    status: int | None
    error: str


@dataclass(frozen=True)
class ToolStarted:
    step: int
    tool: str
    id: str
    arguments: dict[str, Any]
    # When the tool was asked for (time.time_ns()), for a call the harness saw only once it was
    # answered (an outside agent's, from its model calls): 0 when it starts now.
    started_ns: int = 0


@dataclass(frozen=True)
class ToolEnded:
    step: int
    tool: str
    id: str
    is_error: bool
    exit_code: int | None
    duration_s: float
    output: str


@dataclass(frozen=True)
class Submitted:
    step: int
    summary: str


Event = (
    RunStarted
    | RunResumed
    | BudgetNotice
    | RunEnded
    | AgentStarted
    | StepStarted
    | StepEnded
    | ContextElided
    | ModelCallStarted
    | ModelCalled
    | ModelCallFailed
    | BudgetState
    | ApiRetry
    | ApiGaveUp
    | ToolStarted
    | ToolEnded
    | Submitted
)


class Subscriber(Protocol):
    def handle(self, event: Event) -> None: ...

    def close(self, error: BaseException | None) -> None:
        """The run is done with the sink; `error` is what stopped the agent, if an exception did."""
        ...


class EventSink:
    """Hands each event to every subscriber, in the order given. A subscriber that fails
    does not keep the others from the event; its error is raised once they all have it,
    and stops the run as any recording failure does. An event emitted where no one can stop
    the run (the metering proxy's threads) hands its error to `defer`: the next emit, from the
    agent, or the close raises it."""

    def __init__(self, subscribers: list[Subscriber]):
        self.subscribers = subscribers
        self.deferred: BaseException | None = None

    def defer(self, error: BaseException) -> None:
        self.deferred = self.deferred or error

    def emit(self, event: Event) -> None:
        self.each(lambda s: s.handle(event))

    def close(self, error: BaseException | None = None) -> None:
        self.each(lambda s: s.close(error))

    def each(self, action: Callable[[Subscriber], None]) -> None:
        failure, self.deferred = self.deferred, None
        for subscriber in self.subscribers:
            try:
                action(subscriber)
            except BaseException as e:  # an interruption too: the others still get the event
                failure = failure or e
        if failure is not None:
            raise failure
