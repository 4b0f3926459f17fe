"""Where a run's events go: the run's event sink (mlrb/core/events.py) with its subscribers,
and the metrics' subscriber."""

from __future__ import annotations

from pathlib import Path

from mlrb.core import events
from mlrb.core.tags import Metric
from mlrb.run_files.trajectory import Trajectory, TrajectoryWriter
from mlrb.store.record import RecordedRun
from mlrb.store.tracing import TraceWriter


class MetricsWriter:
    """The metrics' subscriber: each call's latency and the run's totals after it, at its step,
    in one write (the call's BudgetState follows its ModelCalled)."""

    def __init__(self, recorder: RecordedRun):
        self.recorder = recorder
        self.pending: dict[str, float] = {}  # the last call's latency, until its totals come

    def handle(self, event: events.Event) -> None:
        match event:
            case events.ModelCalled():
                self.pending = {Metric.LLM_LATENCY_S: event.latency_s}
            case events.BudgetState():
                totals = {
                    Metric.LLM_INPUT_TOKENS: event.input_tokens,
                    Metric.LLM_OUTPUT_TOKENS: event.output_tokens,
                    Metric.LLM_COST_USD: event.usd,
                }
                self.recorder.log_metrics({**self.pending, **totals}, step=event.step)
                self.pending = {}

    def close(self, error: BaseException | None) -> None:
        pass  # a call's metrics are written with its totals, which the loop emits right after it


def open_sink(trajectory_file: Path, recorder: RecordedRun | None) -> events.EventSink:
    """The run's sink: the trajectory file, then (when the run is tracked) the MLflow traces and metrics."""
    subscribers: list[events.Subscriber] = [TrajectoryWriter(Trajectory(trajectory_file))]
    if recorder is not None:
        subscribers += [TraceWriter(recorder, session=recorder.run_id), MetricsWriter(recorder)]
    return events.EventSink(subscribers)
