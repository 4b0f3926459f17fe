"""The LLM agent's loop, in process: the real SDK clients against a scripted server
on loopback, acting through an unconfined sandbox on a temporary workspace."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from fake_llm_server import FakeLlmServer, error, hang, reply, tool
from mlrb.agents.base import AgentContext
from mlrb.agents.llm import LlmAgent, fit_context
from mlrb.agents.recording import open_sink
from mlrb.agents.tools import ToolEnv, run_tool, truncate
from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig, BudgetConfig, ConfigError, SandboxConfig
from mlrb.models import metering
from mlrb.models.providers import Message, ToolCall, ToolResult
from mlrb.models.proxy import MeteringProxy
from mlrb.sandbox.base import Limits
from mlrb.sandbox.unconfined import UnconfinedSandbox

pytestmark = pytest.mark.fast

KEY = "sk-test-key-never-recorded-1234"
KEY_ENV = "MLRB_TEST_LLM_KEY"
AGENT_FILES = {"anthropic": "claude", "openai": "gpt4o"}


def agent_config(wire: str = "anthropic", **options) -> AgentConfig:
    """mlrb/conf/agent/claude.yaml (wire "anthropic") or gpt4o.yaml ("openai"), with the test's key and options."""
    name = AGENT_FILES[wire]
    raw = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / f"{name}.yaml").read_text())
    raw["options"].update({"api_key_env": KEY_ENV, "retry_base_delay_s": 0.001, **options})
    return AgentConfig(name=name, kind="llm", options=raw["options"])


def budget_config(**limits) -> BudgetConfig:
    values = dict(
        name="test", wall_time_s=60, max_steps=20, max_input_tokens=None, max_output_tokens=None, max_usd=None
    )
    values.update(limits)
    return BudgetConfig(**values)


@contextlib.contextmanager
def metered(agent: LlmAgent, budget: Budget, sink) -> Iterator[MeteringProxy]:
    """The run's metering proxy, as the harness starts it for the agent: it charges the budget
    and emits the model calls' events into the sink."""
    proxy = metering.start(agent)
    assert proxy is not None
    metering.attach(proxy, budget, sink)
    with proxy:
        yield proxy


class Run:
    """One agent run against a scripted server; what it returned, sent and recorded."""

    def __init__(
        self, tmp_path: Path, script, provider="anthropic", budget=None, url="config", monkeypatch=None, **options
    ):
        self.workspace = tmp_path / "workspace"
        self.workspace.mkdir(exist_ok=True)
        (tmp_path / "data").mkdir(exist_ok=True)
        self.server = FakeLlmServer(script)
        server_url = self.server.anthropic_url if provider == "anthropic" else self.server.openai_url
        if url == "env":  # through the SDK's own variable
            monkeypatch.setenv("ANTHROPIC_BASE_URL" if provider == "anthropic" else "OPENAI_BASE_URL", server_url)
            options["base_url"] = None
        else:
            options["base_url"] = server_url if url == "config" else url
        self.budget = Budget(budget or budget_config())
        sink = open_sink(tmp_path / "trajectory.jsonl", recorder=None)  # the trajectory only: no store
        sandbox = UnconfinedSandbox(SandboxConfig(), self.workspace, tmp_path / "data", "test", Limits())
        agent = LlmAgent(agent_config(provider, **options))
        started = time.monotonic()
        try:
            with metered(agent, self.budget, sink) as proxy:
                self.outcome = agent.run(AgentContext(None, "Solve the task.", sandbox, self.budget, sink, 0,
                                                      model=proxy))  # fmt: skip
        finally:
            self.seconds = time.monotonic() - started
            sink.close()
            sandbox.close()
            self.server.close()
        self.requests = self.server.requests
        self.trajectory_text = (tmp_path / "trajectory.jsonl").read_text()
        self.events = [json.loads(line) for line in self.trajectory_text.splitlines()]

    def sent(self, n: int) -> str:
        """The n-th request body as text."""
        return json.dumps(self.requests[n]["body"])


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


# --- configuration ---------------------------------------------------------------


def test_a_misspelt_option_is_one_line_naming_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        LlmAgent.check_config(agent_config(temprature=0.2))
    message = str(e.value)
    assert (
        "unknown option 'agent.options.temprature'" in message and "did you mean 'agent.options.temperature'" in message
    )
    assert "price_input_per_mtok" in message and "\n" not in message


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"provider": "gemini"}, "unknown agent.options.provider 'gemini'; valid choices: anthropic, openai"),
        ({"temperature": "hot"}, "invalid value for 'agent.options.temperature'"),
        (
            {"max_tokens_per_call": 0},
            "agent.options.max_tokens_per_call must be positive, got 0: give a finite number above 0",
        ),
        ({"max_retries": -1}, "agent.options.max_retries must not be negative, got -1"),
        # NaN compares false with everything: a NaN price would make every call free
        (
            {"price_output_per_mtok": float("nan")},
            "agent.options.price_output_per_mtok must not be negative, got nan: give a finite number",
        ),
        (
            {"request_timeout_s": float("inf")},
            "agent.options.request_timeout_s must be positive, got inf: give a finite number",
        ),
        (
            {"retry_statuses": [429, "server"]},
            "agent.options.retry_statuses has 'server': give HTTP statuses such as 429, or a class such as 5xx",
        ),
    ],
)
def test_bad_option_values_are_config_errors(options, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        LlmAgent.check_config(agent_config(**options))


def test_a_missing_key_names_the_variable_and_no_key_is_needed_when_none_is_named(monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match=f"agent claude needs an API key: set the environment variable {KEY_ENV}"):
        LlmAgent.check_config(agent_config())
    with pytest.raises(ConfigError, match=KEY_ENV):
        LlmAgent(agent_config())  # the constructor checks too (it runs before the MLflow run exists)
    LlmAgent.check_config(agent_config("openai", api_key_env=None))


def test_checking_a_config_imports_neither_sdk_nor_mlflow(tmp_path):
    probe = (
        "import sys\n"
        "from mlrb.core.config import AgentConfig\n"
        "from mlrb.agents.llm import LlmAgent\n"
        f"LlmAgent.check_config(AgentConfig('claude', 'llm', {{'provider': 'anthropic', 'model': 'claude-3-5-sonnet-20240620', 'api_key_env': '{KEY_ENV}'}}))\n"
        "print('HEAVY', [m for m in ('anthropic', 'openai', 'mlflow', 'torch') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


# --- tools -------------------------------------------------------------------------


def tool_env(tmp_path: Path, output_chars: int = 20_000) -> ToolEnv:
    (tmp_path / "data").mkdir(exist_ok=True)
    sandbox = UnconfinedSandbox(SandboxConfig(), tmp_path, tmp_path / "data", "test", Limits())
    return ToolEnv(sandbox, lambda: 30.0, default_timeout_s=10, output_chars=output_chars)


def test_edit_file_replaces_exactly_one_occurrence_or_fails_clearly(tmp_path):
    env = tool_env(tmp_path)
    (tmp_path / "f.py").write_text("a = 1\nb = 1\nc = 2\n")
    absent = run_tool(env, "edit_file", {"path": "f.py", "old_text": "d = 3", "new_text": "d = 4"})
    assert absent.is_error and "old_text not found in f.py" in absent.text
    twice = run_tool(env, "edit_file", {"path": "f.py", "old_text": " = 1", "new_text": " = 5"})
    assert twice.is_error and "occurs 2 times" in twice.text
    assert (tmp_path / "f.py").read_text() == "a = 1\nb = 1\nc = 2\n"  # failures change nothing
    done = run_tool(env, "edit_file", {"path": "f.py", "old_text": "c = 2", "new_text": "c = 3"})
    assert not done.is_error and (tmp_path / "f.py").read_text().endswith("c = 3\n")


def test_file_tools_and_commands(tmp_path):
    env = tool_env(tmp_path)
    assert not run_tool(env, "write_file", {"path": "sub/x.py", "content": "print('hi')\nprint(2)\n"}).is_error
    read = run_tool(env, "read_file", {"path": "sub/x.py", "start_line": 2})
    assert "2 lines in total" in read.text and "print(2)" in read.text and "hi" not in read.text
    assert "error: FileNotFoundError" in run_tool(env, "read_file", {"path": "nope.txt"}).text
    assert "outside the workspace" in run_tool(env, "write_file", {"path": "../escape", "content": ""}).text
    ran = run_tool(env, "run_python", {"path": "sub/x.py"})
    assert ran.exit_code == 0 and "hi\n2" in ran.text
    listed = run_tool(env, "list_files", {})
    assert "sub/x.py" in listed.text
    failed = run_tool(env, "bash", {"command": "echo oops >&2; exit 4"})
    assert failed.is_error and failed.exit_code == 4 and "exit code 4" in failed.text and "oops" in failed.text
    slow = run_tool(env, "bash", {"command": "sleep 5", "timeout_s": 0.3})
    assert slow.is_error and "timed out" in slow.text
    assert "unknown tool 'dance'" in run_tool(env, "dance", {}).text


def test_long_outputs_are_cut_with_a_visible_marker(tmp_path):
    env = tool_env(tmp_path, output_chars=1000)
    out = run_tool(env, "bash", {"command": "python -c \"print('x' * 50000); print('THE END')\""})
    assert len(out.text) < 1100 and "characters truncated" in out.text and "THE END" in out.text
    assert truncate("short", 10) == "short"
    bars = run_tool(env, "bash", {"command": "printf 'load 0%%\\rload 50%%\\rload 100%%\\ndone\\r\\n'"})
    assert "load 100%\ndone" in bars.text and "50%" not in bars.text  # progress bars: the last frame only


# --- the loop ----------------------------------------------------------------------


def test_anthropic_loop_acts_through_the_sandbox_and_submits(tmp_path, monkeypatch):
    script = [
        reply(tool("write_file", path="notes.txt", content="plan: average\n"), text="I will take notes."),
        reply(
            tool("edit_file", path="notes.txt", old_text="average", new_text="sum"),
            tool("bash", command="cat notes.txt"),
        ),
        reply(tool("submit", summary="done here")),
    ]
    # url="env": the SDK's own ANTHROPIC_BASE_URL keeps working when the config names no base URL.
    run = Run(tmp_path, script, url="env", monkeypatch=monkeypatch, budget=budget_config(max_usd=1.0))
    outcome, budget, workspace, requests = run.outcome, run.budget, run.workspace, run.requests

    assert outcome.status == "ok" and outcome.message == "done here"
    assert (workspace / "notes.txt").read_text() == "plan: sum\n"
    assert len(requests) == 3 and all(r["path"] == "/v1/messages" for r in requests)
    # The real key goes upstream from the proxy; the harness's own headers do not.
    assert all(r["headers"].get("x-api-key") == KEY and "authorization" not in r["headers"] for r in requests)
    assert not any(h.startswith("x-mlrb") for r in requests for h in r["headers"])
    first = requests[0]["body"]
    assert first["model"] == "claude-sonnet-5" and first["max_tokens"] == 4096  # agent=claude's default
    assert "Your working directory is your workspace" in first["system"]
    assert {t["name"] for t in first["tools"]} == {
        "bash", "run_python", "read_file", "write_file", "edit_file", "list_files", "submit",
    }  # fmt: skip
    opening = first["messages"][0]["content"][0]["text"]
    assert opening.startswith("Solve the task.") and "[Budget left: " in opening and "20 of 20 steps" in opening
    # The tool results go back as tool_result blocks answering each tool_use, with the budget left.
    last = requests[2]["body"]["messages"][-1]["content"]
    tool_use_ids = [b["id"] for b in requests[2]["body"]["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in last if b["type"] == "tool_result"] == tool_use_ids
    assert "plan: sum" in last[1]["content"] and "replaced 1 occurrence" in last[0]["content"]
    assert "18 of 20 steps" in last[-1]["text"] and "$0.9" in last[-1]["text"]
    # Usage from the API: 3 calls of 1000 in / 100 out tokens at Claude Sonnet 5's $2 / $10 per million.
    assert budget.summary()["input_tokens"] == 3000 and budget.summary()["output_tokens"] == 300
    assert budget.usd == pytest.approx(3 * (1000 * 2 + 100 * 10) / 1e6)
    events = [e["event"] for e in run.events]
    assert events.count("model_call") == 3 and events.count("tool_result") == 4 and events[-1] == "submit"


def test_openai_loop_speaks_chat_completions_and_the_config_url_beats_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    run = Run(
        tmp_path,
        [reply(tool("bash", command="echo hello"), text="Looking."), reply(tool("submit", summary="ok"))],
        provider="openai",
        budget=budget_config(max_usd=1.0),
    )
    assert run.outcome.status == "ok"
    assert [r["path"] for r in run.requests] == ["/v1/chat/completions"] * 2
    assert all(r["headers"].get("authorization") == f"Bearer {KEY}" for r in run.requests)
    body = run.requests[1]["body"]
    assert body["model"] == "gpt-4o" and body["max_completion_tokens"] == 4096 and body["seed"] == 0
    assert body["messages"][0]["role"] == "system" and {t["type"] for t in body["tools"]} == {"function"}
    assistant, result, note = body["messages"][-3:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "bash",
        "arguments": json.dumps({"command": "echo hello"}),
    }
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": result["content"]}
    assert "hello" in result["content"] and note["role"] == "user" and "19 of 20 steps" in note["content"]
    assert run.budget.usd == pytest.approx(2 * (1000 * 2.5 + 100 * 10) / 1e6)


def test_a_reply_without_tool_calls_is_nudged_and_usage_is_estimated_when_not_reported(tmp_path):
    run = Run(
        tmp_path,
        [reply(text="Thinking out loud.", usage=None), reply(tool("submit"))],
        provider="openai",
    )
    assert run.outcome.status == "ok"
    assert "No tool was called" in run.requests[1]["body"]["messages"][-1]["content"]
    first_call = next(e for e in run.events if e["event"] == "model_call")
    assert first_call["usage_estimated"] is True and first_call["input_tokens"] > 0


# --- budgets -----------------------------------------------------------------------


def busy(n: int, usage=(1000, 100)):
    return [reply(tool("bash", command="echo working"), usage=usage) for _ in range(n)]


@pytest.mark.parametrize(
    "limits, usage, calls, stop_reason",
    [
        ({"max_steps": 2}, (1000, 100), 2, "steps"),
        ({"max_input_tokens": 1500}, (1000, 100), 2, "input_tokens"),
        ({"max_output_tokens": 250}, (10, 100), 3, "output_tokens"),
        # $2 / $10 per million: 1000 in + 100 out = $0.003 a call; $0.01 is gone after 4 calls.
        ({"max_usd": 0.01}, (1000, 100), 4, "usd"),
    ],
)
def test_each_budget_limit_stops_the_run_cleanly(tmp_path, limits, usage, calls, stop_reason):
    run = Run(tmp_path, busy(10, usage), budget=budget_config(**limits))
    assert (run.outcome.status, run.outcome.stop_reason) == ("budget_exhausted", stop_reason)
    assert len(run.requests) == calls


def test_each_call_is_capped_by_the_output_tokens_left(tmp_path):
    run = Run(tmp_path, busy(10, (10, 100)), budget=budget_config(max_output_tokens=250))
    assert [r["body"]["max_tokens"] for r in run.requests] == [250, 150, 50]


def test_the_wall_time_kills_a_long_command(tmp_path):
    script = [reply(tool("bash", command="sleep 30", timeout_s=600))] + busy(3)
    run = Run(tmp_path, script, budget=budget_config(wall_time_s=3))
    assert (run.outcome.status, run.outcome.stop_reason) == ("budget_exhausted", "wall_time")
    assert run.seconds < 10


def test_a_hung_model_call_cannot_overrun_the_wall_time(tmp_path):
    run = Run(tmp_path, [hang(30)], budget=budget_config(wall_time_s=3))
    assert (run.outcome.status, run.outcome.stop_reason) == ("budget_exhausted", "wall_time")
    assert run.seconds < 10


# --- API failures ------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_transient_failures_are_retried_with_backoff(tmp_path, provider):
    run = Run(tmp_path, [error(429), error(500), reply(tool("submit"))], provider=provider)
    assert run.outcome.status == "ok"
    assert len(run.requests) == 3
    retries = [e for e in run.events if e["event"] == "api_retry"]
    assert [r["status"] for r in retries] == [429, 500]
    assert retries[1]["delay_s"] == pytest.approx(2 * retries[0]["delay_s"])  # exponential
    assert run.budget.steps == 1  # retries are one step


def test_retries_are_bounded(tmp_path):
    run = Run(tmp_path, [error(503)] * 5, max_retries=2)
    assert run.outcome.status == "agent_error"
    assert "HTTP 503" in run.outcome.message and "gave up after 3 attempts" in run.outcome.message
    assert len(run.requests) == 3


def test_the_config_names_the_statuses_that_are_retried(tmp_path):
    run = Run(tmp_path, [error(429), error(503), reply(tool("submit"))], retry_statuses=[429])
    assert run.outcome.status == "agent_error" and "HTTP 503" in run.outcome.message
    assert "gave up" not in run.outcome.message  # not retried: the config leaves 5xx out
    assert len(run.requests) == 2
    assert [e["status"] for e in run.events if e["event"] == "api_retry"] == [429]


def test_an_unreachable_server_is_retried_then_reported(tmp_path):
    run = Run(tmp_path, [], url="http://127.0.0.1:9", max_retries=1)
    assert run.outcome.status == "agent_error" and "unreachable" in run.outcome.message


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_fatal_error_ends_the_run_with_its_status(tmp_path, provider):
    run = Run(tmp_path, [error(401, "invalid x-api-key"), reply(tool("submit"))], provider=provider)
    assert run.outcome.status == "agent_error"
    assert "HTTP 401" in run.outcome.message and "invalid x-api-key" in run.outcome.message
    assert len(run.requests) == 1  # not retried
    assert any(e["event"] == "api_error" and e["status"] == 401 for e in run.events)


# --- context and secrets -----------------------------------------------------------


def test_old_tool_outputs_are_elided_to_keep_the_context_in_bounds(tmp_path):
    big = "python -c \"print('y' * 3000)\""
    script = [reply(tool("bash", command=big)) for _ in range(4)] + [reply(tool("submit"))]
    run = Run(tmp_path, script, context_chars=8000)
    assert run.outcome.status == "ok"
    last = run.requests[-1]["body"]["messages"]
    results = [b["content"] for m in last if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]  # fmt: skip
    assert results[0].startswith("[output elided to save context") and "yyyy" in results[-1]
    assert len(json.dumps(last)) < 12_000
    assert any(e["event"] == "context_elided" for e in run.events)


def test_fit_context_keeps_the_instructions_and_the_latest_exchange():
    history = [Message("user", "instructions " * 100)]
    for i in range(5):
        history.append(
            Message("assistant", tool_calls=[ToolCall(f"c{i}", "write_file", {"path": "p", "content": "z" * 1000})])
        )
        history.append(Message("user", "note", tool_results=[ToolResult(f"c{i}", "o" * 1000)]))
    assert fit_context(history, 10**6) == 0
    assert fit_context(history, 4000) > 0
    assert history[0].text.startswith("instructions")
    assert history[-1].tool_results[0].content == "o" * 1000
    assert history[-2].tool_calls[0].arguments["content"] == "z" * 1000
    assert history[1].tool_calls[0].arguments["content"].startswith("[elided")


def test_the_key_never_reaches_the_model_or_the_trajectory(tmp_path):
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "leak.txt").write_text(f"token={KEY}\n")
    run = Run(tmp_path, [reply(tool("bash", command="cat leak.txt")), reply(tool("submit"))])
    assert "token=***" in run.sent(1)
    assert KEY not in run.sent(1) and KEY not in run.trajectory_text


def test_budget_note_names_every_limit():
    budget = Budget(
        budget_config(wall_time_s=3600, max_steps=10, max_usd=2.0, max_input_tokens=5000, max_output_tokens=700)
    )
    budget.record_step()
    budget.record_usage(1000, 200, 0.5)
    note = budget.note()
    for part in ("59 min", "9 of 10 steps", "$1.5000 of $2", "4,000 input tokens", "500 output tokens"):
        assert part in note
