"""MLflow traces of an agent's run: one trace per step, linked to the run, with
the model call (CHAT_MODEL) and each tool call (TOOL) as child spans.

One trace per step (not one per run) so each is exported as soon as its step
ends: a long run shows up in the UI as it goes, and a crash loses one step at most.

`TraceWriter` is the traces' subscriber to the run's events (mlrb/events.py): a
starting event opens its span, its ending event closes it. MLflow's tracing exports
through the process-wide tracking URI, while the harness records through an explicit
client; the writer points the process-wide URI at the run's store for the agent's
lifetime and puts it back when it is closed.

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

from mlrb import events
from mlrb.tags import Tag
from mlrb.tracking import RunRecorder

ASYNC_EXPORT_VAR = "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"


class TraceWriter:
    def __init__(self, recorder: RunRecorder, session: str):
        import mlflow

        self.recorder: RunRecorder | None = recorder
        self.session = session
        # The open spans, innermost last, each with the context that closes it.
        self.open: list[tuple[contextlib.AbstractContextManager[Any], Any]] = []
        self.previous_env = os.environ.get("MLFLOW_TRACKING_URI")
        # Read when MLflow makes its exporter, which set_tracking_uri below resets.
        os.environ.setdefault(ASYNC_EXPORT_VAR, "false")
        mlflow.set_tracking_uri(recorder.client.tracking_uri)

    def handle(self, event: events.Event) -> None:
        match event:
            case events.StepStarted():
                self.enter(self.step(event.step, {"step": event.step, "budget": event.budget}))
            case events.ModelCallStarted():
                attributes = {
                    "mlflow.llm.model": event.model,
                    "mlflow.llm.provider": event.provider,
                    "attempt": event.attempt,
                    "timeout_s": round(event.timeout_s, 3),
                }
                self.enter(self.span(f"{event.provider} {event.model}", "CHAT_MODEL", event.request, attributes))
            case events.ModelCalled():
                cost = event.cost
                span = self.innermost()
                span.set_outputs({"text": event.text, "tool_calls": event.tool_calls, "stop_reason": event.stop_reason})
                span.set_attributes(
                    {
                        "mlflow.chat.tokenUsage": {
                            "input_tokens": cost.input_tokens,
                            "output_tokens": cost.output_tokens,
                            "total_tokens": cost.input_tokens + cost.output_tokens,
                        },
                        "mlflow.llm.cost": {
                            "input_cost": cost.input_usd,
                            "output_cost": cost.output_usd,
                            "total_cost": cost.usd,
                        },
                        "usage_estimated": cost.estimated,
                    }
                )
                self.exit()
            case events.ModelCallFailed():
                self.innermost().record_exception(event.error)
                self.exit()
            case events.ToolStarted():
                self.enter(self.span(event.tool, "TOOL", event.arguments, {"tool_call_id": event.id}))
            case events.ToolEnded():
                span = self.innermost()
                span.set_outputs(event.output)
                span.set_attributes({"is_error": event.is_error, "exit_code": event.exit_code})
                self.exit()
            case events.StepEnded():
                self.innermost().set_outputs({"outcome": event.outcome})
                self.exit()

    def enter(self, context: contextlib.AbstractContextManager[Any]) -> None:
        self.open.append((context, context.__enter__()))

    def innermost(self) -> Any:
        return self.open[-1][1]

    def exit(self, error: BaseException | None = None) -> None:
        context, _ = self.open.pop()
        context.__exit__(type(error) if error else None, error, error.__traceback__ if error else None)

    @contextlib.contextmanager
    def step(self, number: int, inputs: dict[str, Any]) -> Iterator[Any]:
        """The root span of one step's trace."""
        import mlflow
        from mlflow.entities import SpanType
        from mlflow.entities.trace_location import MlflowExperimentLocation

        assert self.recorder is not None
        with mlflow.start_span(
            name=f"step {number}",
            span_type=SpanType.AGENT,
            run_id=self.recorder.run_id,
            trace_destination=MlflowExperimentLocation(self.recorder.experiment_id),
        ) as span:
            span.set_inputs(inputs)
            # The session groups a run's steps in the UI's sessions view.
            mlflow.update_current_trace(metadata={"mlflow.trace.session": self.session}, tags={Tag.STEP: str(number)})
            yield span

    @contextlib.contextmanager
    def span(self, name: str, span_type: str, inputs: Any, attributes: dict[str, Any]) -> Iterator[Any]:
        """A child span of the current step (span_type: "CHAT_MODEL", "TOOL"...)."""
        import mlflow

        with mlflow.start_span(name=name, span_type=span_type, attributes=attributes) as span:
            span.set_inputs(inputs)
            yield span

    def close(self, error: BaseException | None) -> None:
        """End the spans still open (with the error that stopped the agent, as a `with` would),
        write out every pending trace, then put the process-wide tracking URI back."""
        if self.recorder is None:
            return
        import mlflow

        try:
            while self.open:
                self.exit(error)
        finally:
            mlflow.flush_trace_async_logging()  # nothing waits here unless the user turned async export on
            mlflow.set_tracking_uri(None)  # back to MLflow's own resolution (this also resets its tracer)
            if self.previous_env is not None:
                os.environ["MLFLOW_TRACKING_URI"] = self.previous_env
            self.recorder = None
