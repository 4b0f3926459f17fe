"""MLflow traces of an agent's run: one trace per step, linked to the run, with
the model call (CHAT_MODEL) and each tool call (TOOL) as child spans.

`TraceWriter` is the traces' subscriber to the run's events (mlrb/core/events.py): a starting
event opens its span, its ending event closes it, each stamped with the time it happened.
The spans are plain data, built without MLflow. When a step's root span ends, its whole
trace goes to the recorder's `log_trace`: the run folder's record keeps it
(mlrb/store/record.py), and the store gets it from there through `export_trace`, which
`python -m mlrb.sync` uses too, so a trace synced later is the one a live run writes.

One trace per step (not one per run) so each is exported as soon as its step ends: a long
run shows up in the UI as it goes, and a crash loses one step at most. Traces are exported
synchronously (MLFLOW_ENABLE_ASYNC_TRACE_LOGGING=false unless the user set it): a step's
trace is a few rows in the store, and MLflow's asynchronous queue would cost more than
that at the end of the run, where flushing it waits on its consumer's one-second poll.
"""

from __future__ import annotations

import os
import time
import traceback
import uuid
from typing import Any, Protocol

from mlrb.core import events
from mlrb.core.tags import Tag

ASYNC_EXPORT_VAR = "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"
SESSION_METADATA = "mlflow.trace.session"  # groups a run's steps in the UI's sessions view
SOURCE_RUN_METADATA = "mlflow.sourceRun"


class TraceRecorder(Protocol):
    run_id: str

    def log_trace(self, trace: dict[str, Any]) -> None: ...


class TraceWriter:
    """Builds each step's trace from the events: {"step", "session", "spans"}, each span
    {name, span_type, span_id, parent_id, start_time_ns, end_time_ns, inputs, outputs,
    attributes, status, status_description, events}, in the order they ended."""

    def __init__(self, recorder: TraceRecorder, session: str):
        self.recorder = recorder
        self.session = session
        self.open: list[dict[str, Any]] = []  # innermost last
        self.ended: list[dict[str, Any]] = []
        self.step_number = 0

    def handle(self, event: events.Event) -> None:
        match event:
            case events.StepStarted():
                self.step_number = event.step
                self.enter(f"step {event.step}", "AGENT", {"step": event.step, "budget": event.budget}, {})
            case events.ModelCallStarted():
                attributes = {
                    "mlflow.llm.model": event.model,
                    "mlflow.llm.provider": event.provider,
                    "attempt": event.attempt,
                    "timeout_s": round(event.timeout_s, 3),
                }
                self.enter(
                    f"{event.provider} {event.model}",
                    "CHAT_MODEL",
                    event.request,
                    attributes,
                    started_ns=event.started_ns,
                )
            case events.ModelCalled():
                cost = event.cost
                span = self.open[-1]
                span["outputs"] = {"text": event.text, "tool_calls": event.tool_calls, "stop_reason": event.stop_reason}
                span["attributes"].update(
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
                self.exit(("Exception", event.error, f"Exception: {event.error}"))  # as MLflow records a str
            case events.ToolStarted():
                self.enter(event.tool, "TOOL", event.arguments, {"tool_call_id": event.id}, started_ns=event.started_ns)
            case events.ToolEnded():
                span = self.open[-1]
                span["outputs"] = event.output
                span["attributes"].update({"is_error": event.is_error, "exit_code": event.exit_code})
                self.exit()
            case events.StepEnded():
                self.open[-1]["outputs"] = {"outcome": event.outcome}
                self.exit()

    def enter(self, name: str, span_type: str, inputs: Any, attributes: dict[str, Any], started_ns: int = 0) -> None:
        """Open a span, begun now or at `started_ns` (a call reported once it is over), never
        before its parent."""
        start = time.time_ns()
        if started_ns:
            start = max(min(started_ns, start), self.open[-1]["start_time_ns"] if self.open else 0)
        self.open.append(
            {
                "name": name,
                "span_type": span_type,
                "span_id": uuid.uuid4().hex[:16],
                "parent_id": self.open[-1]["span_id"] if self.open else None,
                "start_time_ns": start,
                "end_time_ns": None,
                "inputs": inputs,
                "outputs": None,
                "attributes": attributes,
                "status": "OK",
                "status_description": "",
                "events": [],
            }
        )

    def exit(self, error: tuple[str, str, str] | None = None) -> None:
        """End the innermost span; with `error` (its type's name, message and stack trace) failed,
        with the status and the exception event MLflow records for one."""
        span = self.open.pop()
        span["end_time_ns"] = max(time.time_ns(), span["start_time_ns"] + 1)
        if error is not None:
            kind, message, stacktrace = error
            span["status"], span["status_description"] = "ERROR", f"{kind}: {message}"
            attributes = {"exception.message": message, "exception.type": kind, "exception.stacktrace": stacktrace}
            span["events"].append({"name": "exception", "timestamp": time.time_ns(), "attributes": attributes})
        self.ended.append(span)
        if not self.open:  # the step's root: its trace is whole
            trace = {"step": self.step_number, "session": self.session, "spans": self.ended}
            self.ended = []
            self.recorder.log_trace(trace)

    def close(self, error: BaseException | None) -> None:
        """End the spans still open, with the error that stopped the agent, as a `with` of
        MLflow's would: an Exception fails them, an interruption ends them as they stand."""
        while self.open:
            self.exit(described(error) if isinstance(error, Exception) else None)


def described(error: BaseException) -> tuple[str, str, str]:
    """An exception as a failed span records it: its type's name, its message, its stack trace."""
    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return type(error).__name__, str(error), stack


# What MLflow imports on a process's first trace export, not before: its tracer and exporter, the
# prediction context it reads each trace's model from (all of mlflow.pyfunc) and GitPython, for
# the trace's git metadata (importing it runs `git version`). About 0.1 CPU s, and as much again
# in collections over what the imports make, in every recording process; imported in advance
# (`import_exporter`) where the process's lasting imports are made, or in a warm parent a
# recording process is forked from, once.
EXPORTER_IMPORTS = (
    "mlflow.tracing.provider",
    "mlflow.tracing.processor.mlflow_v3",
    "mlflow.tracing.processor.otel",
    "mlflow.tracing.export.mlflow_v3",
    "mlflow.pyfunc.context",
    "git",
)


def import_exporter() -> None:
    """Import what a first `export_trace` would (EXPORTER_IMPORTS). One that cannot be imported
    is left out, as MLflow leaves it out."""
    import importlib

    for name in EXPORTER_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # MLflow goes on without it (git metadata, the prediction context), as it would then


def export_trace(tracking_uri: str, experiment_id: str, run_id: str, trace: dict[str, Any]) -> None:
    """Write one step's trace into the store, with its spans' own times: the run's link, the
    session, the step's tag, and each span's inputs, outputs, attributes, status and events."""
    import mlflow
    from mlflow.entities import SpanEvent, SpanStatus

    os.environ.setdefault(ASYNC_EXPORT_VAR, "false")  # read when MLflow makes its exporter
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri)  # MLflow's tracing exports through the process-wide URI
    try:
        started: dict[str, Any] = {}
        for span in sorted(trace["spans"], key=lambda s: s["start_time_ns"]):  # a parent starts before its children
            common = dict(
                name=span["name"],
                span_type=span["span_type"],
                inputs=span["inputs"],
                attributes=span["attributes"],
                start_time_ns=span["start_time_ns"],
            )
            if span["parent_id"] is None:  # the step's root
                metadata = {SOURCE_RUN_METADATA: run_id, SESSION_METADATA: trace["session"]}
                live = mlflow.start_span_no_context(
                    **common, tags={Tag.STEP: str(trace["step"])}, metadata=metadata, experiment_id=experiment_id
                )
            else:
                live = mlflow.start_span_no_context(**common, parent_span=started[span["parent_id"]])
            started[span["span_id"]] = live
        for span in trace["spans"]:  # in the order they ended: children before their parents
            live = started[span["span_id"]]
            for event in span["events"]:
                live.add_event(SpanEvent(event["name"], event["timestamp"], event["attributes"]))
            status = SpanStatus(span["status"], span["status_description"] or "")
            live.end(outputs=span["outputs"], status=status, end_time_ns=span["end_time_ns"])
    finally:
        mlflow.flush_trace_async_logging()  # nothing waits here unless the user turned async export on
        mlflow.set_tracking_uri(None)  # back to MLflow's own resolution (this also resets its tracer)
        if previous is not None:
            os.environ["MLFLOW_TRACKING_URI"] = previous
