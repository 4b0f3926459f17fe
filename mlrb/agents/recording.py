"""Where an agent's events go: the run's event sink (mlrb/events.py) with its subscribers,
and the metrics' subscriber."""

from __future__ import annotations

from mlrb import events
from mlrb.agents.base import AgentContext
from mlrb.agents.tracing import TraceWriter
from mlrb.tracking import RunRecorder
from mlrb.trajectory import TrajectoryWriter


class MetricsWriter:
    """The metrics' subscriber: each call's latency and the run's totals after it, at its step."""

    def __init__(self, recorder: RunRecorder):
        self.recorder = recorder

    def handle(self, event: events.Event) -> None:
        match event:
            case events.ModelCalled():
                self.recorder.log_metrics({"llm.latency_s": event.latency_s}, step=event.step)
            case events.BudgetState():
                totals = {
                    "llm.input_tokens": event.input_tokens,
                    "llm.output_tokens": event.output_tokens,
                    "llm.cost_usd": event.usd,
                }
                self.recorder.log_metrics(totals, step=event.step)

    def close(self, error: BaseException | None) -> None:
        pass  # each event is written as it comes


def open_sink(ctx: AgentContext) -> events.EventSink:
    """The run's sink: the trajectory file, then (when the run is tracked) the MLflow traces and metrics."""
    subscribers: list[events.Subscriber] = [TrajectoryWriter(ctx.trajectory)]
    if ctx.recorder is not None:
        subscribers += [TraceWriter(ctx.recorder, session=ctx.recorder.run_id), MetricsWriter(ctx.recorder)]
    return events.EventSink(subscribers)
