"""Where an agent's events go: the run's event sink (mlrb/events.py) with its subscribers,
and the metrics' subscriber."""

from __future__ import annotations

from mlrb import events
from mlrb.agents.base import AgentContext
from mlrb.agents.tracing import TraceWriter
from mlrb.tracking import RunRecorder
from mlrb.trajectory import TrajectoryWriter


class MetricsWriter:
    """The metrics' subscriber: each call's latency and the run's totals after it, at its step,
    in one write (the call's BudgetState follows its ModelCalled)."""

    def __init__(self, recorder: RunRecorder):
        self.recorder = recorder
        self.pending: dict[str, float] = {}  # the last call's latency, until its totals come

    def handle(self, event: events.Event) -> None:
        match event:
            case events.ModelCalled():
                self.pending = {"llm.latency_s": event.latency_s}
            case events.BudgetState():
                totals = {
                    "llm.input_tokens": event.input_tokens,
                    "llm.output_tokens": event.output_tokens,
                    "llm.cost_usd": event.usd,
                }
                self.recorder.log_metrics({**self.pending, **totals}, step=event.step)
                self.pending = {}

    def close(self, error: BaseException | None) -> None:
        pass  # a call's metrics are written with its totals, which the loop emits right after it


def open_sink(ctx: AgentContext) -> events.EventSink:
    """The run's sink: the trajectory file, then (when the run is tracked) the MLflow traces and metrics."""
    subscribers: list[events.Subscriber] = [TrajectoryWriter(ctx.trajectory)]
    if ctx.recorder is not None:
        subscribers += [TraceWriter(ctx.recorder, session=ctx.recorder.run_id), MetricsWriter(ctx.recorder)]
    return events.EventSink(subscribers)
