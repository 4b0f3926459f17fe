"""MLflow traces of an agent's run: one trace per step, linked to the run, with
the model call (CHAT_MODEL) and each tool call (TOOL) as child spans.

One trace per step (not one per run) so each is exported as soon as its step
ends: a long run shows up in the UI as it goes, and a crash loses one step at most.

MLflow's tracing exports through the process-wide tracking URI, while the
harness records through an explicit client; `Tracer` points the process-wide
URI at the run's store for the agent's lifetime and puts it back afterwards.

Traces are exported synchronously, as each step ends (MLFLOW_ENABLE_ASYNC_TRACE_LOGGING=false
unless the user set it): a step's trace is a few rows in the store, and MLflow's
asynchronous queue would cost more than that at the end of the run, where flushing
it waits on its consumer's one-second poll (about 2 s per run).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from mlrb.tracking import RunRecorder

ASYNC_EXPORT_VAR = "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"


class NoSpan:
    """Stands in for a span when the run is not tracked."""

    def set_inputs(self, inputs: Any) -> None: ...

    def set_outputs(self, outputs: Any) -> None: ...

    def set_attribute(self, key: str, value: Any) -> None: ...

    def set_attributes(self, attributes: dict[str, Any]) -> None: ...

    def record_exception(self, exception: Any) -> None: ...


class Tracer:
    def __init__(self, recorder: RunRecorder | None, session: str):
        self.recorder = recorder
        self.session = session
        self.previous_env: str | None = None
        if recorder is not None:
            import mlflow

            self.previous_env = os.environ.get("MLFLOW_TRACKING_URI")
            # Read when MLflow makes its exporter, which set_tracking_uri below resets.
            os.environ.setdefault(ASYNC_EXPORT_VAR, "false")
            mlflow.set_tracking_uri(recorder.client.tracking_uri)

    @contextlib.contextmanager
    def step(self, number: int, inputs: dict[str, Any]) -> Iterator[Any]:
        """The root span of one step's trace."""
        if self.recorder is None:
            yield NoSpan()
            return
        import mlflow
        from mlflow.entities import SpanType
        from mlflow.entities.trace_location import MlflowExperimentLocation

        with mlflow.start_span(
            name=f"step {number}",
            span_type=SpanType.AGENT,
            run_id=self.recorder.run_id,
            trace_destination=MlflowExperimentLocation(self.recorder.experiment_id),
        ) as span:
            span.set_inputs(inputs)
            # The session groups a run's steps in the UI's sessions view.
            mlflow.update_current_trace(
                metadata={"mlflow.trace.session": self.session}, tags={"mlrb.step": str(number)}
            )
            yield span

    @contextlib.contextmanager
    def span(self, name: str, span_type: str, inputs: Any, attributes: dict[str, Any] | None = None) -> Iterator[Any]:
        """A child span of the current step (span_type: "CHAT_MODEL", "TOOL"...)."""
        if self.recorder is None:
            yield NoSpan()
            return
        import mlflow

        with mlflow.start_span(name=name, span_type=span_type, attributes=attributes or {}) as span:
            span.set_inputs(inputs)
            yield span

    def close(self) -> None:
        """Write out every pending trace, then put the process-wide tracking URI back."""
        if self.recorder is None:
            return
        import mlflow

        mlflow.flush_trace_async_logging()  # nothing waits here unless the user turned async export on
        mlflow.set_tracking_uri(None)  # back to MLflow's own resolution (this also resets its tracer)
        if self.previous_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = self.previous_env
        self.recorder = None
