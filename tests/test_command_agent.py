"""Bring your own agent (`agent=command`, mlrb/agents/command.py): a program in the sandbox that
calls its model through the run's metering proxy, as `python -m mlrb` runs it, against a
scripted upstream on loopback."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import (
    HARNESS_EXPERIMENT,
    HARNESS_SUBMISSION,
    HARNESS_TASK,
    PLUMBING,
    REPO,
    mlflow_client,
    run_cli,
    run_module,
    store_args,
)
from fake_llm_server import FakeLlmServer, reply, tool
from test_docker_sandbox import needs_docker

KEY = "sk-ant-command-agent-real-key-555"

# The agent: asks the model (the official SDK, configured only by its environment) until it is
# told to merge, then makes its submission (SUBMITS, a shell command); a refused call ends it with
# exit status 3.
ASKS_ITS_MODEL = """
import os, subprocess, anthropic
client = anthropic.Anthropic(max_retries=0)
assert "sk-ant" not in " ".join(os.environ.values()), "a real key reached the sandbox"
while True:
    try:
        text = client.messages.create(model=os.environ["MLRB_MODEL"], max_tokens=100, messages=[
            {"role": "user", "content": os.environ["MLRB_PROMPT"][:500]}]).content[0].text
    except anthropic.BadRequestError as e:
        print("refused:", e.message)
        raise SystemExit(3)
    print("model:", text)
    if text == "merge":
        break
subprocess.run(SUBMITS, shell=True, check=True)
"""


def asking_agent(submits: str) -> str:
    """ASKS_ITS_MODEL, its submission made by the shell command SUBMITS."""
    return ASKS_ITS_MODEL.replace("SUBMITS", repr(submits))


AGENT = asking_agent('python merge.py --data "$MLRB_DATA" --output submission')  # the starter's merge


def assert_tool_seen(tmp_path, name: str, arguments: dict, in_output: str) -> None:
    """The run's trajectory and trace show the agent's tool call, as the harness read it from the
    model's answer and the agent's next request (mlrb/models/metering.py): its arguments and its output."""
    trajectory = [json.loads(line) for line in (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()]
    (asked,) = [e for e in trajectory if e["event"] == "tool_call" and (e["tool"], e["arguments"]) == (name, arguments)]
    (result,) = [e for e in trajectory if e["event"] == "tool_result" and e["id"] == asked["id"]]
    assert in_output in result["output"] and result["duration_s"] > 0
    kinds = [e["event"] for e in trajectory]
    assert kinds.index("tool_result") < max(
        i for i, k in enumerate(kinds) if k == "model_call"
    )  # before the call that answers
    client = mlflow_client(tmp_path)
    (trace,) = client.search_traces(locations=[client.get_experiment_by_name("llm_merging").experiment_id])
    (span,) = [s for s in trace.data.spans if s.span_type == "TOOL" and (s.name, s.inputs) == (name, arguments)]
    assert span.end_time_ns - span.start_time_ns >= int(result["duration_s"] * 1e9) - 1e6


def command_override(source: str) -> str:
    """agent.options.command running SOURCE with python, with no quote a shell or Hydra would read."""
    data = source.encode()
    return f"agent.options.command='python -c \"exec(({int.from_bytes(data)}).to_bytes({len(data)}))\"'"


def command_run(tmp_path, cache, script, *overrides, task=(PLUMBING,), agent=AGENT, experiment="llm_merging"):
    """`agent=command` running AGENT (or AGENT given) at the plumbing scale (or on TASK given, whose runs'
    experiment is EXPERIMENT), against the scripted upstream."""
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, cache), *task, "agent=command", command_override(agent), *overrides,
                         cwd=tmp_path, env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return result, server, client, run


@pytest.mark.integration
def test_a_program_in_bwrap_calls_its_model_through_the_proxy_and_submits(tmp_path, cache_dir):
    # Its task is incidental: the cheapest real task (HARNESS_TASK), its submission the given train.py's.
    script = [reply(text="look around", usage=(1000, 40)), reply(text="merge", usage=(1200, 20))]
    result, server, client, run = command_run(tmp_path, cache_dir, script, task=HARNESS_TASK,
                                              agent=asking_agent(HARNESS_SUBMISSION), experiment=HARNESS_EXPERIMENT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{HARNESS_EXPERIMENT}/command/smoke/0: score" in result.stdout and "status ok" in result.stdout
    assert run.data.tags["mlrb.status"] == "ok" and run.data.tags["mlrb.valid"] == "True"
    # The upstream got the real key; the program had only the run's token.
    assert [r["headers"]["x-api-key"] for r in server.requests] == [KEY, KEY]
    assert run.data.metrics["llm.input_tokens"] == 2200 and run.data.metrics["llm.output_tokens"] == 60
    assert run.data.metrics["llm.cost_usd"] == pytest.approx((2200 * 2.0 + 60 * 10.0) / 1e6)
    assert run.data.tags["mlrb.models_used"] == "claude-sonnet-5"  # agent.options.model, which the program was given
    trajectory = [json.loads(line) for line in (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()]
    calls = [e for e in trajectory if e["event"] == "model_call"]
    assert [(c["text"], c["input_tokens"]) for c in calls] == [("look around", 1000), ("merge", 1200)]
    (trace,) = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    spans = [s for s in trace.data.spans if s.span_type == "CHAT_MODEL"]
    assert [s.outputs["text"] for s in spans] == ["look around", "merge"]
    # The first call's whole conversation, as the program sent it; the next call's new turns only.
    assert [m["role"] for m in spans[0].inputs["new_messages"]] == ["user"] and "new_messages" in spans[1].inputs
    recorded = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert KEY.encode() not in recorded


# The worked example of docs/agents.md, as it shows it (its key aside), run from a clone's root;
# the test runs it at the plumbing scale (PLUMBING added).
EXAMPLE = ("task=llm_merging", "agent=command", "agent.options.program_dir=examples/agents",
           "agent.options.command=python $MLRB_AGENT_DIR/shell_agent.py")  # fmt: skip


@pytest.mark.integration
def test_the_docs_worked_example_a_shell_agent_of_your_own_edits_runs_and_submits(tmp_path, plumbing_cache):
    """examples/agents/shell_agent.py: the scripted model has it run the merge with its bash tool,
    then stops calling tools; the program reads nothing of mlrb but its environment."""
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the clone's root, as the docs run it
    script = [reply(tool("bash", command=MERGE), usage=(900, 30)), reply(text="Merged.", usage=(1100, 10))]
    with FakeLlmServer(script) as server:
        result = run_cli(*EXAMPLE, PLUMBING, *store_args(tmp_path, plumbing_cache), cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "llm_merging/command/smoke/0: score" in result.stdout and "(valid); status ok" in result.stdout
    assert [r["body"]["tools"][0]["name"] for r in server.requests] == ["bash", "bash"]
    assert_tool_seen(tmp_path, "bash", {"command": MERGE}, "exit status 0")
    assert "$ python merge.py" in (tmp_path / "run" / "agent" / "stdout.txt").read_text()


@pytest.mark.fast
def test_a_program_dir_that_is_not_there_is_one_line(tmp_path):
    result = run_cli("agent=command", "agent.options.program_dir=no/such/folder", "agent.options.command=python a.py",
                     cwd=tmp_path, env={"ANTHROPIC_API_KEY": KEY})  # fmt: skip
    assert result.returncode == 2 and not (tmp_path / "outputs").exists()
    (line,) = result.stderr.strip().splitlines()
    assert "agent.options.program_dir no/such/folder is not a folder on this machine" in line


@pytest.mark.integration
def test_once_its_tokens_are_spent_the_proxy_refuses_and_the_run_ends_budget_exhausted(tmp_path, plumbing_cache):
    script = [reply(text="think", usage=(100, 100))] * 5
    result, server, client, run = command_run(tmp_path, plumbing_cache, script, "budget.max_output_tokens=150")
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(server.requests) == 2  # the third call was refused by the proxy, never sent
    assert run.data.tags["mlrb.status"] == "budget_exhausted"
    assert run.data.tags["mlrb.stop_reason"] == "output_tokens"
    assert run.data.metrics["llm.output_tokens"] == 200


@pytest.mark.fast
@pytest.mark.parametrize(
    ("overrides", "env", "expected"),
    [
        ([], {"ANTHROPIC_API_KEY": KEY}, "agent=command needs the program to run: agent.options.command="),
        (["agent.options.command=ls"], {}, "agent command needs an API key: set $ANTHROPIC_API_KEY or $OPENAI_API_KEY"),
    ],
)  # fmt: skip
def test_a_command_agent_without_its_program_or_a_key_is_one_line(tmp_path, overrides, env, expected):
    clean = {"ANTHROPIC_API_KEY": "", "OPENAI_API_KEY": "", **env}
    result = run_cli(*store_args(tmp_path, tmp_path / "cache"), "agent=command", *overrides, cwd=tmp_path, env=clean)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr


# ---- Claude Code, the real binary from npm ------------------------------------------------------
MERGE = 'python merge.py --data "$MLRB_DATA" --output submission'


def reach(port: int) -> str:
    """A command that tries to reach the scripted upstream, the real API's stand-in, directly."""
    return (
        'python -c "import socket; s = socket.socket(); s.settimeout(5); '
        f"print('upstream', 'reached' if s.connect_ex(('127.0.0.1', {port})) == 0 else 'blocked')\""
    )


@pytest.mark.system
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=needs_docker)])
def test_claude_code_runs_in_its_sandbox_through_the_proxy_edits_and_submits(tmp_path, built_cache, sandbox):
    """agent=claude_code: its pinned binary installed into the cache, run on the task's prompt in
    the sandbox; the scripted model has it run the merge with its Bash tool, then say it is done."""
    with FakeLlmServer([]) as server:
        server.script += [reply(tool("Bash", command=reach(server.port), description="try the API"), usage=(3000, 60)),
                          reply(tool("Bash", command=MERGE, description="merge the experts"), usage=(3200, 60)),
                          reply(text="Merged the experts into submission/.", usage=(3400, 20))]  # fmt: skip
        result = run_cli(*store_args(tmp_path, built_cache), "agent=claude_code", f"sandbox={sandbox}", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "llm_merging/claude_code/smoke/0" in result.stdout and "status ok" in result.stdout
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert run.data.tags["mlrb.valid"] == "True"
    # Claude Code's own requests (streamed, its tools) went out through the proxy with the real key.
    assert [(r["path"], r["body"]["stream"], r["headers"]["x-api-key"]) for r in server.requests] == [
        ("/v1/messages?beta=true", True, KEY)] * 3  # fmt: skip
    assert "Bash" in {t["name"] for t in server.requests[0]["body"]["tools"]}
    # A direct connection to anything but the proxy fails inside the sandbox: the API is out of reach.
    assert_tool_seen(
        tmp_path, "Bash", {"command": reach(server.port), "description": "try the API"}, "upstream blocked"
    )
    assert run.data.metrics["llm.input_tokens"] == 9600 and run.data.metrics["llm.output_tokens"] == 140
    transcript = (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    assert '"type":"result"' in transcript and "Merged the experts" in transcript
    assert "agent/stdout.txt" in {a.path for a in client.list_artifacts(run.info.run_id, "agent")}
    assert not list((tmp_path / "run" / "workspace").glob(".claude*"))  # its files stay out of the workspace
    # The harness saw its Bash call in the model's answer and its result in the next request.
    assert_tool_seen(tmp_path, "Bash", {"command": MERGE, "description": "merge the experts"}, "merged")
    recorded = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert KEY.encode() not in recorded


# Each program's last call refused as its provider says "out of credit": Anthropic's 400, which
# Claude Code prints; OpenAI's 429 insufficient_quota, which Codex takes as final ("Quota exceeded").
OUT_OF_TOKENS = {
    "claude_code": (
        "anthropic",
        tool("Bash", command="echo hi", description="say hi"),
        "budget is spent (output_tokens)",
    ),
    "codex": ("openai", tool("exec_command", cmd="echo hi"), '"turn.failed"'),
}


@pytest.mark.system
@pytest.mark.parametrize("agent", sorted(OUT_OF_TOKENS))
def test_out_of_tokens_the_program_s_next_call_is_refused_and_the_run_ends_budget_exhausted(tmp_path, built_cache,
                                                                                             agent):  # fmt: skip
    provider, call, transcript_says = OUT_OF_TOKENS[agent]
    script = [reply(call, usage=(3000, 60))] * 3
    with FakeLlmServer(script) as server:
        url = server.anthropic_url if provider == "anthropic" else server.openai_url
        env = {f"{provider.upper()}_API_KEY": KEY, f"{provider.upper()}_BASE_URL": url}
        result = run_cli(*store_args(tmp_path, built_cache), f"agent={agent}", "budget.max_output_tokens=50",
                         cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(server.requests) == 1  # its next call was refused, never sent
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert (run.data.tags["mlrb.status"], run.data.tags["mlrb.stop_reason"]) == (
        "budget_exhausted",
        "output_tokens",
    )
    assert transcript_says in (tmp_path / "run" / "agent" / "stdout.txt").read_text()


@pytest.mark.integration
def test_prefetch_installs_claude_code_for_offline_nodes_and_a_run_without_it_or_npm_is_one_line(tmp_path):

    def prefetch(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
        return run_module("mlrb.prefetch", *args, f"paths.cache_dir={tmp_path / 'cache'}", cwd=tmp_path,
                          env={"PATH": path} if path else None)  # fmt: skip

    checked = prefetch("--check", "agent=claude_code")
    assert checked.returncode == 1 and checked.stdout.startswith("missing: claude_code: @anthropic-ai/claude-code@")
    no_npm = run_cli(*store_args(tmp_path, tmp_path / "cache"), PLUMBING, "agent=claude_code", "sandbox=unconfined",
                     cwd=tmp_path, env={"ANTHROPIC_API_KEY": KEY, "PATH": "/nonexistent"})  # fmt: skip
    assert no_npm.returncode == 2, no_npm.stderr
    (line,) = no_npm.stderr.strip().splitlines()
    assert (
        "needs @anthropic-ai/claude-code@2.1.328, which is not in the cache" in line
        and "npm is not on the PATH" in line
    )
    assert not (tmp_path / "run").exists()  # refused before anything was recorded
    assert prefetch("agent=claude_code").returncode == 0  # needs no API key
    again = prefetch("--check", "agent=claude_code", path="/nonexistent")  # an offline node: no npm needed now
    assert again.returncode == 0 and "is installed" in again.stdout


# ---- Codex CLI, the real binary from npm ---------------------------------------------------------
@pytest.mark.system
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=needs_docker)])
def test_codex_runs_in_its_sandbox_through_the_proxy_edits_and_submits(tmp_path, built_cache, sandbox):
    """agent=codex: `codex exec` on the task's prompt, with the proxy as a model provider of its
    own (Responses API); the scripted model has it run the merge with its exec_command tool (a
    login shell, whose PATH must still find the harness's python), then say it is done."""
    # yield_time_ms: Codex hands a command's output back after 10 s by default, the command still running;
    # under load the merge takes longer, and Codex then ends with it unfinished.
    with FakeLlmServer([]) as server:
        server.script += [reply(tool("exec_command", cmd=reach(server.port)), usage=(3000, 60)),
                          reply(tool("exec_command", cmd=MERGE, yield_time_ms=300_000), usage=(3200, 60)),
                          reply(text="Merged.", usage=(3400, 20))]  # fmt: skip
        result = run_cli(*store_args(tmp_path, built_cache), "agent=codex", f"sandbox={sandbox}", cwd=tmp_path,
                         env={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": server.openai_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "llm_merging/codex/smoke/0" in result.stdout
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert run.data.tags["mlrb.valid"] == "True", (tmp_path / "run" / "agent" / "stdout.txt").read_text()[-2000:]
    assert [(r["path"], r["body"]["stream"], r["headers"]["authorization"]) for r in server.requests] == [
        ("/v1/responses", True, f"Bearer {KEY}")] * 3  # fmt: skip
    output = server.requests[2]["body"]["input"][-1]
    assert output["type"] == "function_call_output" and "merged" in str(output["output"])
    # A direct connection to anything but the proxy fails inside the sandbox: the API is out of reach.
    assert_tool_seen(tmp_path, "exec_command", {"cmd": reach(server.port)}, "upstream blocked")
    assert run.data.metrics["llm.input_tokens"] == 9600 and run.data.metrics["llm.output_tokens"] == 140
    assert '"type":"turn.completed"' in (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    assert_tool_seen(tmp_path, "exec_command", {"cmd": MERGE, "yield_time_ms": 300_000}, "merged")
    recorded = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert KEY.encode() not in recorded


@pytest.mark.fast
def test_codex_is_told_to_send_nothing_but_its_model_calls(tmp_path):
    """agent=codex's command writes Codex's config before it starts: its own provider (the proxy),
    and its web search, update check, analytics, feedback and OpenTelemetry export off, and no history file.
    Run as written, with a stand-in `codex` that prints the config it would read (the real binary
    validates these keys: a misspelt value is an error there, checked by hand with 0.169.0)."""
    import tomllib

    import yaml

    from conftest import REPO

    command = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / "codex.yaml").read_text())["options"]["command"]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "codex").write_text('#!/bin/sh\ncat "$CODEX_HOME/config.toml"\n')
    (tmp_path / "bin" / "codex").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "CODEX_HOME": str(tmp_path / "home"),
           "OPENAI_BASE_URL": "http://127.0.0.1:8787/openai/v1", "MLRB_PROMPT": "Solve."}  # fmt: skip
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    config = tomllib.loads(done.stdout)
    assert (
        config["model_provider"] == "mlrb" and config["model_providers"]["mlrb"]["base_url"] == env["OPENAI_BASE_URL"]
    )
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"]["enabled"] is False and config["feedback"]["enabled"] is False
    assert {config["otel"][k] for k in ("exporter", "trace_exporter", "metrics_exporter")} == {"none"}
    assert config["history"]["persistence"] == "none"
    assert config["web_search"] == "disabled"  # the provider's search, outside the sandbox: off


@pytest.mark.fast
@pytest.mark.parametrize("machine, package, triple", [("x86_64", "linux-x64", "x86_64-unknown-linux-musl"),
                                                       ("aarch64", "linux-arm64", "aarch64-unknown-linux-musl")])  # fmt: skip
def test_codex_s_binary_is_found_for_the_machine_it_runs_on(monkeypatch, tmp_path, machine, package, triple):
    """npm installs the build of the machine it runs on: on an Arm node (a GH200 cluster) Codex's
    binary is @openai/codex-linux-arm64's aarch64 one (its path checked by hand in the 0.169.0
    tarball), and the cache keeps each platform's install apart."""
    import platform

    import yaml

    from mlrb.agents import installed

    monkeypatch.setattr(platform, "machine", lambda: machine)
    install = yaml.safe_load((REPO / "mlrb" / "conf" / "agent" / "codex.yaml").read_text())["options"]["install"]
    assert installed.resolved(install["bin"]) == {
        "codex": f"node_modules/@openai/codex-{package}/vendor/{triple}/bin/codex"
    }
    assert installed.location(tmp_path, install["npm"]).name == f"openai_codex@0.169.0-{package}"
