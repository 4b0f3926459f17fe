"""The run's event sink (mlrb/core/events.py) with its real subscribers: an LLM agent's run
against a scripted model server on loopback, recorded into a real MLflow store, leaves
the same sequence of model calls, tool calls and costs in the trajectory file, the
traces and the metrics; and a subscriber that fails keeps no other from the event."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conftest import mlflow_client
from fake_llm_server import FakeLlmServer, error, reply, tool
from mlrb.agents.base import AgentContext
from mlrb.agents.llm import LlmAgent
from mlrb.agents.recording import MetricsWriter, open_sink
from mlrb.core import events
from mlrb.core.budget import Budget
from mlrb.core.config import SandboxConfig, TrackingConfig
from mlrb.models import metering
from mlrb.models.proxy import Call, MeteringProxy, Upstream
from mlrb.run_files.trajectory import Trajectory, TrajectoryWriter
from mlrb.sandbox.base import Limits
from mlrb.sandbox.unconfined import UnconfinedSandbox
from mlrb.store import record, recording_process
from test_llm_agent import KEY, KEY_ENV, agent_config, budget_config, metered


def recorded_run(tmp_path, name: str) -> record.RecordedRun:
    """A run recorded as the harness records one: through its folder's record into the store."""
    (tmp_path / "run").mkdir()
    store_run = recording_process.start().store_run(TrackingConfig(dir=str(tmp_path / "mlruns")))
    return record.RecordedRun(store_run, tmp_path / "run", "events", name, {}, record.new_run_id())


pytestmark = pytest.mark.fast


def test_the_trajectory_the_traces_and_the_metrics_see_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the store is the test's own
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    script = [
        error(529, "overloaded"),  # retried: two tries of the first call
        reply(tool("bash", command="echo one"), tool("write_file", path="a.txt", content="x"), usage=(1200, 80)),
        reply(text="Thinking.", usage=(1500, 120), delay_s=0.3),  # no tool call: nudged
        reply(tool("submit", summary="done"), usage=(1700, 60)),
    ]
    recorder = recorded_run(tmp_path, "events/0")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "data").mkdir()
    sandbox = UnconfinedSandbox(SandboxConfig(), tmp_path / "workspace", tmp_path / "data", "test", Limits())
    sink = open_sink(tmp_path / "trajectory.jsonl", recorder)
    budget = Budget(budget_config())
    with FakeLlmServer(script) as server:
        agent = LlmAgent(agent_config(base_url=server.anthropic_url))
        try:
            with metered(agent, budget, sink) as proxy:
                outcome = agent.run(AgentContext(None, "Solve.", sandbox, budget, sink, seed=0, model=proxy))
        finally:
            sandbox.close()
            sink.close()
    assert (outcome.status, outcome.message) == ("ok", "done")

    # The trajectory: every event in the order the loop emitted it.
    lines = [json.loads(line) for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("step"), e.get("tool")) for e in lines] == [
        ("agent", None, None),
        ("api_retry", 1, None),
        ("model_call", 1, None),
        ("tool_call", 1, "bash"),
        ("tool_result", 1, "bash"),
        ("tool_call", 1, "write_file"),
        ("tool_result", 1, "write_file"),
        ("model_call", 2, None),
        ("model_call", 3, None),
        ("tool_call", 3, "submit"),
        ("tool_result", 3, "submit"),
        ("submit", 3, None),
    ]
    calls = [e for e in lines if e["event"] == "model_call"]
    tools = [e for e in lines if e["event"] == "tool_result"]
    assert [c["input_tokens"] for c in calls] == [1200, 1500, 1700] and calls[0]["attempt"] == 2
    assert [c["cost_usd"] for c in calls] == pytest.approx(  # agent=claude's model: $2 / $10 per million
        [(i * 2 + o * 10) / 1e6 for i, o in [(1200, 80), (1500, 120), (1700, 60)]]
    )

    # The traces: one per step, its spans in the same order, with the same usage and outputs.
    recorder.store_run.flush()  # the record's lines are in the store, as at the run's end
    client = mlflow_client(tmp_path)
    store_id, experiment_id = recorder.store_run.wait_opened()
    traces = client.search_traces(locations=[experiment_id], run_id=store_id)
    by_step = {int(t.info.tags["mlrb.step"]): sorted(t.data.spans, key=lambda s: s.start_time_ns) for t in traces}
    assert sorted(by_step) == [1, 2, 3]
    assert [[(s.span_type, s.status.status_code) for s in by_step[n]] for n in (1, 2, 3)] == [
        [("AGENT", "OK"), ("CHAT_MODEL", "ERROR"), ("CHAT_MODEL", "OK"), ("TOOL", "OK"), ("TOOL", "OK")],
        [("AGENT", "OK"), ("CHAT_MODEL", "OK")],
        [("AGENT", "OK"), ("CHAT_MODEL", "OK"), ("TOOL", "OK")],
    ]
    spans = [s for n in (1, 2, 3) for s in by_step[n]]
    chat = [s for s in spans if s.span_type == "CHAT_MODEL" and s.status.status_code == "OK"]
    assert [s.attributes["mlflow.chat.tokenUsage"]["input_tokens"] for s in chat] == [c["input_tokens"] for c in calls]
    assert [s.attributes["mlflow.llm.cost"]["total_cost"] for s in chat] == pytest.approx(
        [c["cost_usd"] for c in calls]
    )
    assert [s.attributes["attempt"] for s in spans if s.span_type == "CHAT_MODEL"] == [1, 2, 1, 1]
    assert [s.outputs["text"] for s in chat] == [c["text"] for c in calls]
    # A call's span lasts as long as the call did (the proxy reports it once it is over), within its step.
    step_2, call_2 = by_step[2]
    assert 0.3e9 <= call_2.end_time_ns - call_2.start_time_ns <= step_2.end_time_ns - step_2.start_time_ns
    # Each call's span records the settings and what is new in the conversation, not all of it again.
    first_try = next(s for s in spans if s.span_type == "CHAT_MODEL")
    assert "tools" in first_try.inputs and "system" in first_try.inputs and chat[0].inputs == first_try.inputs
    assert "tools" not in call_2.inputs and "messages" not in call_2.inputs
    assert [m["role"] for m in call_2.inputs["new_messages"]] == ["assistant", "user"]
    assert call_2.inputs["conversation"]["turns"] == 3
    tool_spans = [s for s in spans if s.span_type == "TOOL"]
    assert [(s.name, s.outputs) for s in tool_spans] == [(t["tool"], t["output"]) for t in tools]
    assert by_step[3][0].outputs == {"outcome": {"status": "ok", "stop_reason": None, "message": "done"}}

    # The metrics: each call's latency and the running totals, at the call's step.
    def history(name: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(store_id, name)]

    running_usd = [sum(c["cost_usd"] for c in calls[: n + 1]) for n in range(3)]
    assert history("llm.input_tokens") == [(1, 1200), (2, 2700), (3, 4400)]
    assert [s for s, _ in history("llm.cost_usd")] == [1, 2, 3]
    assert [v for _, v in history("llm.cost_usd")] == pytest.approx(running_usd)
    assert [(s, round(v, 3)) for s, v in history("llm.latency_s")] == [(c["step"], c["latency_s"]) for c in calls]
    assert history("llm.output_tokens")[-1] == (3, budget.output_tokens) == (3, 260)

    # A subscriber that fails (the trajectory's file is closed) keeps the metrics from nothing,
    # and its error still reaches the agent, which stops the run as a recording failure does.
    trajectory = Trajectory(tmp_path / "trajectory.jsonl")
    trajectory.close()
    sink = events.EventSink([TrajectoryWriter(trajectory), MetricsWriter(recorder)])
    late = events.ModelCalled(9, 1, "m", 0.5, "", [], None, events.Cost(1, 1, False, 0.0, 0.0))
    with pytest.raises(ValueError, match="closed file"):
        sink.emit(late)
    sink.emit(events.BudgetState(9, 4401, 261, 1.0))  # a call's metrics are written with its totals
    recorder.store_run.flush()
    assert history("llm.latency_s")[-1] == (9, 0.5) and history("llm.cost_usd")[-1] == (9, 1.0)
    assert (tmp_path / "trajectory.jsonl").read_text().count("\n") == len(lines)
    recorder.finish("FINISHED")


def test_a_recording_failure_in_a_model_call_s_events_reaches_the_agent_at_its_next_event(tmp_path):
    """The proxy reports a call from its own thread, where no one could stop the run: the sink
    keeps the error and raises it at the agent's next event, which stops the run."""

    class Broken:
        def handle(self, event):
            if isinstance(event, events.ModelCalled):
                raise OSError("the store went away")

        def close(self, error):
            pass

    sink = events.EventSink([Broken()])
    calls = metering.CallEvents(sink, Budget(budget_config()))
    answer = {"content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 1, "output_tokens": 1}}
    calls.emit(Call("anthropic", "/anthropic/v1/messages", "m", False, 200, response=answer))  # no error here
    with pytest.raises(OSError, match="the store went away"):
        sink.emit(events.StepEnded(1, None))
    sink.emit(events.StepEnded(2, None))  # raised once


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in this process, even when the suite runs in a script's
    background (`pytest &`), where the shell starts it with SIGINT ignored and Python keeps that."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_tool_call_ends_its_spans_with_the_interruption(tmp_path, monkeypatch, ctrl_c_raises):
    """Ctrl-C while a command runs: the agent stops there, and the sink's close still ends the
    tool's span and its step's, so the step's trace reaches the store."""
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    recorder = recorded_run(tmp_path, "events/1")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "data").mkdir()
    sandbox = UnconfinedSandbox(SandboxConfig(), tmp_path / "workspace", tmp_path / "data", "test", Limits())
    sink = open_sink(tmp_path / "trajectory.jsonl", recorder)
    command = f"kill -INT {os.getpid()}; sleep 30"
    script = [reply(tool("bash", command=command))]
    with FakeLlmServer(script) as server:
        agent = LlmAgent(agent_config(base_url=server.anthropic_url))
        stopped: BaseException | None = None
        budget = Budget(budget_config())
        try:
            with metered(agent, budget, sink) as proxy:
                agent.run(AgentContext(None, "Solve.", sandbox, budget, sink, 0, model=proxy))
        except KeyboardInterrupt as e:
            stopped = e
        finally:
            sandbox.close()
    sink.close(stopped)  # as the harness closes it when an interruption stops the agent
    assert isinstance(stopped, KeyboardInterrupt)
    recorder.store_run.flush()
    run_id, experiment_id = recorder.store_run.wait_opened()
    [trace] = mlflow_client(tmp_path).search_traces(locations=[experiment_id], run_id=run_id)
    spans = sorted(trace.data.spans, key=lambda s: s.start_time_ns)
    # MLflow marks a span failed for an Exception only; an interruption (a KeyboardInterrupt,
    # as mlrb.core.interrupts.Interrupted is) ends it as it stands.
    assert [(s.span_type, s.status.status_code) for s in spans] == [
        ("AGENT", "OK"),
        ("CHAT_MODEL", "OK"),
        ("TOOL", "OK"),
    ]
    assert all(s.end_time_ns > s.start_time_ns for s in spans) and spans[2].outputs is None
    assert trace.info.tags["mlrb.step"] == "1" and spans[2].inputs == {"command": command}
    kinds = [json.loads(line)["event"] for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert kinds == ["agent", "model_call", "tool_call"]  # the command never returned a result
    recorder.finish("KILLED")


def test_an_outside_agent_s_tool_calls_are_seen_in_its_model_calls(tmp_path):
    """For an agent that does not emit its own tool events, the harness reads them from the calls
    (mlrb/models/metering.py): asked in an answer, answered in the next request, over a streamed OpenAI
    chat conversation here as a program would hold one."""
    import openai

    script = [reply(tool("bash", command="ls"), usage=(50, 5), delay_s=0.2), reply(text="done", usage=(60, 5))]
    sink = open_sink(tmp_path / "trajectory.jsonl", recorder=None)
    budget = Budget(budget_config())
    budget.record_step()
    with FakeLlmServer(script) as server:
        upstream = {"openai": Upstream(server.openai_url, "sk-real")}
        with MeteringProxy(upstream, "token", None) as proxy:
            metering.attach(proxy, budget, sink, tools=True)
            client = openai.OpenAI(api_key="token", base_url=proxy.base_url("openai"), max_retries=0)
            messages: list = [{"role": "user", "content": "Solve."}]
            chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
            call = next(c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls)
            messages += [{"role": "assistant", "tool_calls": [{"id": call.id, "type": "function", "function":
                          {"name": "bash", "arguments": call.function.arguments}}]},
                         {"role": "tool", "tool_call_id": call.id, "content": "a.txt"}]  # fmt: skip
            time.sleep(0.3)  # the command runs
            client.chat.completions.create(model="m", messages=messages)
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "trajectory.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines] == ["model_call", "tool_call", "tool_result", "model_call"]
    asked, result = lines[1], lines[2]
    assert (asked["tool"], asked["id"], asked["arguments"]) == ("bash", call.id, {"command": "ls"})
    assert asked["started_ns"] > 0 and result["output"] == "a.txt" and result["exit_code"] is None
    assert 0.3 <= result["duration_s"] < 5
