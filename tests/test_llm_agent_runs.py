"""Whole runs of the LLM agents through `python -m mlrb`, against a scripted model
server on loopback, asserted on what MLflow holds afterwards; and the one-line
errors a user gets before anything starts. The runs' task is incidental: they run the
cheapest real task (conftest's HARNESS_TASK), where the scripted tool calls edit and run its
train.py, except the run that hands in nothing (see there)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (
    HARNESS_EXPERIMENT,
    HARNESS_SUBMISSION,
    HARNESS_TASK,
    PLUMBING,
    REPO,
    assert_record_matches_store,
    harness_task,
    mlflow_client,
    run_cli,
    store_args,
)
from fake_llm_server import FakeLlmServer, error, reply, tool
from mlrb.tasks.handling import solutions_of

KEY = "sk-ant-e2e-secret-never-recorded-987"
ONE_FEATURE = 'FEATURES = ["x1"]'  # the given train.py's model: the price on x1 alone
ALL_FEATURES = 'FEATURES = ["x1", "x2", "x3"]'


def only_run(tmp_path: Path, experiment_name: str = HARNESS_EXPERIMENT):
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def everything_recorded(tmp_path: Path) -> bytes:
    """Every byte the run left: the MLflow database, artifacts, the run folder and its logs."""
    return b"".join(
        p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and p.stat().st_size < 50_000_000
    )


def harness_task_assets(cache_dir: Path):
    """The cheapest real task (HARNESS_TASK) as its runs load it, and its assets in cache_dir."""
    from mlrb.harness.assets import ensure_assets

    task = harness_task()
    return task, ensure_assets(task, cache_dir)


def all_features_score(cache_dir: Path, folder: Path) -> float:
    """The score of train.py fitted on all three features (as the scripted edit makes it), run
    and scored directly, outside the harness."""
    task, assets = harness_task_assets(cache_dir)
    start = folder / "edited"
    shutil.copytree(assets / "public", start)
    train = start / "train.py"
    train.write_text(train.read_text().replace(ONE_FEATURE, ALL_FEATURES))
    solutions = dataclasses.replace(solutions_of(task, assets / "public"), starting_files=start)
    workspace = solutions.run(HARNESS_SUBMISSION, folder / "workspace")
    report = task.judge.score(workspace / task.rules.submission, assets, folder / "work")
    assert report.valid, report.reason
    return report.score


def harness_anchors(cache_dir: Path) -> dict:
    """hidden/calibration.json of the cheapest task's assets: the anchors their build measured."""
    _, assets = harness_task_assets(cache_dir)
    return json.loads((assets / "hidden" / "calibration.json").read_text())


@pytest.mark.integration
def test_claude_edits_runs_and_submits_and_mlflow_shows_every_step(tmp_path, cache_dir):
    script = [
        error(529, "overloaded"),  # retried: the first attempt's span records the failure
        reply(
            tool("read_file", path="train.py", start_line=1, num_lines=10),
            text="Let me read the starter.",
            usage=(1200, 80),
        ),
        reply(tool("edit_file", path="train.py", old_text=ONE_FEATURE, new_text=ALL_FEATURES), usage=(1500, 120)),
        reply(tool("run_python", path="train.py", timeout_s=300), usage=(1700, 60)),  # writes submission.csv
        reply(tool("submit", summary="fitted on all three features"), usage=(2100, 40)),
    ]
    with FakeLlmServer(script) as server:
        started = time.monotonic()
        result = run_cli(
            *store_args(tmp_path, cache_dir),
            *HARNESS_TASK,
            "agent=claude",
            "agent.options.retry_base_delay_s=0.01",
            cwd=tmp_path,
            env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url},
        )
        wall_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{HARNESS_EXPERIMENT}/claude/smoke/0: score" in result.stdout and "status ok" in result.stdout

    # What the model was sent: the key only in its header (from the run's proxy), tool results, the budget.
    requests = server.requests
    assert len(requests) == 5 and all(r["headers"]["x-api-key"] == KEY for r in requests)
    assert all(KEY not in json.dumps(r["body"]) for r in requests)
    run_result = requests[4]["body"]["messages"][-1]["content"]
    assert run_result[0]["type"] == "tool_result" and "exit code 0" in run_result[0]["content"]
    assert "train MAE: " in run_result[0]["content"] and "[Budget left: " in run_result[-1]["text"]

    client, run = only_run(tmp_path)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == f"{HARNESS_EXPERIMENT}/claude/smoke/0"
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["mlrb.status"] == "ok" and tags["mlrb.agent_message"] == "fitted on all three features"
    assert tags["mlrb.valid"] == "True"
    # The run folder's record holds what the store holds, the model calls' metrics at their steps too.
    record = assert_record_matches_store(client, run)
    assert [step for step, _ in record["metrics"]["llm.cost_usd"]] == [1, 2, 3, 4]
    # The agent's edit (the model fitted on all three features), replayed outside the harness, scores the same.
    assert metrics["score"] == pytest.approx(all_features_score(cache_dir, tmp_path / "replay"), abs=1e-6)

    # Budget totals from the API's usage, and cost = tokens x the default model's prices ($2 / $10 per million).
    input_tokens, output_tokens = 1200 + 1500 + 1700 + 2100, 80 + 120 + 60 + 40
    assert (metrics["steps"], metrics["input_tokens"], metrics["output_tokens"]) == (4, input_tokens, output_tokens)
    assert metrics["cost_usd"] == pytest.approx(input_tokens * 2 / 1e6 + output_tokens * 10 / 1e6, abs=1e-6)
    history = client.get_metric_history(run_id, "llm.cost_usd")
    assert [m.step for m in history] == [1, 2, 3, 4]
    assert [m.value for m in history] == sorted(m.value for m in history)
    assert history[-1].value == pytest.approx(metrics["cost_usd"], abs=1e-6)
    assert [m.value for m in client.get_metric_history(run_id, "llm.input_tokens")][-1] == input_tokens

    # One trace per step, linked to the run: the model call and the tool calls as spans, all in
    # the store when the harness exits (exported synchronously, step by step; nothing to flush here).
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run_id)
    assert len(traces) == 4 and all(t.info.state == "OK" for t in traces)
    spans = [span for trace in traces for span in trace.data.spans]
    assert all(t.info.trace_metadata.get("mlflow.sourceRun") == run_id for t in traces)
    chat = [s for s in spans if s.span_type == "CHAT_MODEL"]
    assert len(chat) == 5  # four calls, one of them after a failed attempt
    assert sum(s.status.status_code == "ERROR" for s in chat) == 1
    ok_chat = sorted((s for s in chat if s.status.status_code == "OK"), key=lambda s: s.start_time_ns)
    # Each call's span shows what was new in it: the instructions, then the tool results.
    assert ok_chat[0].inputs["new_messages"][0]["content"][0]["text"].startswith("Predict the sale price of a house")
    assert "Your working directory" in ok_chat[0].inputs["system"]
    assert [m["role"] for m in ok_chat[1].inputs["new_messages"]] == ["assistant", "user"]
    assert ok_chat[1].inputs["new_messages"][1]["content"][0]["type"] == "tool_result"
    assert ok_chat[0].outputs["tool_calls"][0]["name"] == "read_file"
    assert sum(s.attributes["mlflow.chat.tokenUsage"]["input_tokens"] for s in ok_chat) == input_tokens
    assert all(s.attributes["mlflow.llm.model"] == "claude-sonnet-5" for s in ok_chat)
    tools = {s.name: s for s in spans if s.span_type == "TOOL"}
    assert set(tools) == {"read_file", "edit_file", "run_python", "submit"}
    assert tools["edit_file"].inputs["new_text"] == ALL_FEATURES
    assert "train MAE: " in tools["run_python"].outputs and tools["run_python"].attributes["exit_code"] == 0
    assert all(s.end_time_ns > s.start_time_ns for s in spans)  # latency is there

    # Artifacts: the trajectory step by step, and the edit in the workspace patch.
    local = client.download_artifacts(run_id, "", str(tmp_path / "downloaded"))
    events = [json.loads(line) for line in open(f"{local}/trajectory.jsonl")]
    kinds = [e["event"] for e in events]
    assert kinds.count("model_call") == 4 and kinds.count("api_retry") == 1 and "submit" in kinds
    assert f"+{ALL_FEATURES}\n" in open(f"{local}/workspace.patch").read()
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "instructions.md", "trajectory.jsonl", "workspace.patch", "score_report.json",
            "scorer.log"} <= artifacts  # fmt: skip

    # The harness's commit, read by git while the store was checked, and where the run's time went.
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head and tags["mlrb.git_dirty"] in ("True", "False")
    stages = {k.removeprefix("stage_time_s."): v for k, v in metrics.items() if k.startswith("stage_time_s.")}
    assert set(stages) == {"compose", "assets", "sandbox_start", "agent", "collect", "scoring", "recording"}
    assert all(v > 0 for v in stages.values()) and sum(stages.values()) < wall_s
    assert stages["agent"] >= metrics["agent_time_s"] - 0.01
    assert stages["scoring"] == pytest.approx(metrics["score_time_s"], abs=1e-3)

    assert KEY.encode() not in everything_recorded(tmp_path)


@pytest.mark.integration
def test_gpt4o_runs_through_chat_completions_with_the_config_url(tmp_path, cache_dir):
    key = "sk-proj-e2e-secret-never-recorded-654"
    script = [
        reply(tool("bash", command=HARNESS_SUBMISSION, timeout_s=300), usage=(2000, 50)),  # the given train.py
        reply(tool("submit", summary="ran the baseline"), usage=(2500, 30)),
    ]
    with FakeLlmServer(script) as server:
        result = run_cli(
            *store_args(tmp_path, cache_dir),
            *HARNESS_TASK,
            "agent=gpt4o",
            f"agent.options.base_url={server.openai_url}",
            cwd=tmp_path,
            # The config key wins over the SDK's variable, which points nowhere here.
            env={"OPENAI_API_KEY": key, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["path"] for r in server.requests] == ["/v1/chat/completions"] * 2
    assert server.requests[0]["body"]["model"] == "gpt-4o"
    client, run = only_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.status"] == "ok"
    assert run.data.tags["mlrb.valid"] == "True"
    # Same command as the baseline: the baseline anchor the asset build measured, read from its file
    # (the mean of its seeds, which all score alike: train.py draws nothing at random).
    assert run.data.metrics["score"] == pytest.approx(harness_anchors(cache_dir)["baseline_score"], abs=1e-6)
    assert run.data.metrics["cost_usd"] == pytest.approx((4500 * 2.5 + 80 * 10) / 1e6, abs=1e-6)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, flush=True)
    assert len(traces) == 2
    assert key.encode() not in everything_recorded(tmp_path)


# On the default task's plumbing run: it checks that a run whose agent handed in nothing says "no
# submission", which holds where the submission is a folder of its own (llm_merging's submission/).
# A folder task's submission is the whole workspace, never absent: there the untouched workspace is
# scored, and eval.py's error on it is the reason. Nothing handed in, its scorer never imports torch.
@pytest.mark.integration
def test_openai_compatible_server_needs_no_key_and_a_fatal_error_is_recorded(tmp_path, plumbing_cache):
    script = [reply(tool("list_files"), usage=(300, 20)), error(401, "bad token")]
    with FakeLlmServer(script) as server:
        result = run_cli(
            *store_args(tmp_path, plumbing_cache),
            PLUMBING,
            "agent=openai_compatible",
            f"agent.options.base_url={server.openai_url}",
            "agent.options.model=local-llama",
            cwd=tmp_path,
            env={"OPENAI_API_KEY": ""},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert server.requests[0]["body"]["model"] == "local-llama"
    assert server.requests[0]["body"]["max_tokens"] == 2048
    _, run = only_run(tmp_path, "llm_merging")
    # The run still ends FINISHED: the workspace was collected and scored (nothing there).
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["mlrb.status"] == "agent_error" and "HTTP 401" in tags["mlrb.agent_message"]
    assert tags["mlrb.valid"] == "False" and "no submission" in tags["mlrb.invalid_reason"]
    assert run.data.metrics["cost_usd"] == 0.0 and run.data.metrics["steps"] == 2


@pytest.mark.fast
@pytest.mark.parametrize(
    "args, env, expected",
    [
        (
            ["agent=claude"],
            {"ANTHROPIC_API_KEY": ""},
            "agent claude needs an API key: set the environment variable ANTHROPIC_API_KEY",
        ),
        (
            ["agent=gpt4o"],
            {"OPENAI_API_KEY": ""},
            "agent gpt4o needs an API key: set the environment variable OPENAI_API_KEY",
        ),
        (
            ["agent=openai_compatible", "agent.options.model=m"],
            {},
            "missing value for 'agent.options.base_url'",
        ),
        (
            ["agent=claude", "agent.options.temprature=0"],
            {"ANTHROPIC_API_KEY": "x"},
            "unknown config key 'agent.options.temprature'; did you mean 'agent.options.temperature'?",
        ),
        (
            ["agent=claude", "+agent.options.temprature=0"],
            {"ANTHROPIC_API_KEY": "x"},
            "unknown option 'agent.options.temprature' for agent claude; did you mean 'agent.options.temperature'?",
        ),
    ],
)
def test_config_problems_are_one_line_before_anything_runs(tmp_path, args, env, expected):
    result = run_cli(
        *args, f"tracking.dir={tmp_path / 'mlruns'}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlrb: error: "), result.stderr
    assert expected in lines[0]
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "run").exists()
