"""Every run's trajectory is also written as ATIF (Harbor's Agent Trajectory Interchange Format),
`trajectory.atif.json` in the run folder and an artifact of the run, and Harbor's own validator
(the `harbor` package, in its Python 3.12 side environment `.venv-harbor`) accepts it: a Claude
agent's run against the scripted model server (a failed try, text, tools, their results, the
metered usage and cost per call) and the scripted baseline's (a command no model asked for)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, REPO, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, error, reply, tool

HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"


def harbor_validates(path: Path) -> dict:
    """Harbor's validator's verdict on the file (`TrajectoryValidator`, its pydantic models), and the
    document as Harbor's `Trajectory` model reads it back."""
    if not HARBOR_PYTHON.exists():
        pytest.fail(f"{HARBOR_PYTHON} is missing: `bash install.sh --dev` makes it (harbor needs Python 3.12)")
    script = (
        "import json, sys\n"
        "from harbor.utils.trajectory_validator import TrajectoryValidator\n"
        "from harbor.models.trajectories import Trajectory\n"
        "validator = TrajectoryValidator()\n"
        "if not validator.validate(sys.argv[1]):\n"
        "    sys.exit('invalid: ' + '; '.join(validator.get_errors()))\n"
        "print(json.dumps(Trajectory(**json.load(open(sys.argv[1]))).to_json_dict()))\n"
    )
    checked = subprocess.run([str(HARBOR_PYTHON), "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr[-3000:]
    return json.loads(checked.stdout)


def only_run(tmp_path: Path):
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    return client, run


@pytest.mark.integration
def test_an_llm_agents_run_is_written_as_atif_that_harbor_validates(tmp_path, cache_dir):
    script = [
        error(529, "overloaded"),  # a failed try: in the next step's extra, not a step
        reply(tool("read_file", path="train.py", start_line=1, num_lines=5), text="Reading.", usage=(1200, 80)),
        reply(tool("run_python", path="train.py", timeout_s=300), usage=(1700, 60)),  # a valid submission
        reply(tool("submit", summary="ran the starter"), usage=(2100, 40)),
    ]
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=claude",
                         "agent.options.retry_base_delay_s=0.01", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": "sk-ant-atif-test", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    document = harbor_validates(run_dir / "trajectory.atif.json")
    client, run = only_run(tmp_path)

    assert document["schema_version"] == "ATIF-v1.7" and document["session_id"] == run.data.tags["mlrb.run_id"]
    assert document["agent"]["name"] == "claude" and document["agent"]["model_name"] == "claude-sonnet-5"
    assert {t["function"]["name"] for t in document["agent"]["tool_definitions"]} >= {"bash", "read_file", "submit"}
    steps = document["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent", "agent"]
    assert steps[1]["message"] == (run_dir / "record" / "instructions.md").read_text()
    calls = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    calls = [c for c in calls if c["event"] == "model_call"]
    # Each model call one step, its usage and cost as the metering proxy charged the run.
    for step, call in zip(steps[2:], calls, strict=True):
        assert step["metrics"]["prompt_tokens"] == call["input_tokens"]
        assert step["metrics"]["completion_tokens"] == call["output_tokens"]
        assert step["metrics"]["cost_usd"] == call["cost_usd"] and step["llm_call_count"] == 1
    assert [s["metrics"]["prompt_tokens"] for s in steps[2:]] == [1200, 1700, 2100]
    assert steps[2]["message"] == "Reading." and steps[2]["extra"]["api_retries"][0]["status"] == 529
    # The tools each asked for, with their results linked by the call's id.
    assert [s["tool_calls"][0]["function_name"] for s in steps[2:]] == ["read_file", "run_python", "submit"]
    for step in steps[2:]:
        (result,) = step["observation"]["results"]
        assert result["source_call_id"] == step["tool_calls"][0]["tool_call_id"]
    assert "exit code 0" in steps[3]["observation"]["results"][0]["content"]
    # The totals are the run's, as its metrics say.
    totals, metrics = document["final_metrics"], run.data.metrics
    assert totals["total_prompt_tokens"] == metrics["input_tokens"] == 5000
    assert totals["total_completion_tokens"] == metrics["output_tokens"] == 180
    assert totals["total_cost_usd"] == pytest.approx(metrics["cost_usd"], abs=1e-9)
    assert totals["total_cost_usd"] == pytest.approx(sum(s["metrics"]["cost_usd"] for s in steps[2:]), abs=1e-9)
    assert totals["total_steps"] == len(steps) and totals["extra"]["outcome"]["status"] == "ok"
    # An artifact of the run, beside trajectory.jsonl.
    assert {"trajectory.jsonl", "trajectory.atif.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.integration
def test_the_scripted_baselines_command_is_a_step_without_a_model_call(tmp_path, cache_dir):
    result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=baseline", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    document = harbor_validates(tmp_path / "run" / "trajectory.atif.json")
    assert document["agent"]["name"] == "baseline" and "model_name" not in document["agent"]
    user, command = document["steps"]
    assert user["source"] == "user" and "Predict the sale price of a house" in user["message"]  # the task's prompt
    assert command["source"] == "agent" and command["llm_call_count"] == 0 and "metrics" not in command
    (call,) = command["tool_calls"]
    (result,) = command["observation"]["results"]
    assert call["function_name"] == "shell" and "python" in call["arguments"]["command"]
    assert result["source_call_id"] == call["tool_call_id"] and result["extra"]["exit_code"] == 0
    assert document["final_metrics"]["total_cost_usd"] == 0.0


@pytest.mark.fast
def test_a_trajectory_that_cannot_be_converted_is_a_note_and_nothing_is_written(tmp_path):
    from mlrb.formats import atif

    (tmp_path / "trajectory.jsonl").write_text('{"time": 1, "event": "start", "run": "x", "budget": {}}\n')
    (tmp_path / "record.jsonl").write_text('{"v": 99, "t": 1, "kind": "opened"}\n')  # a record of another format
    logged = []

    class Recorder:
        def log_file(self, path, folder=None):
            logged.append(path)

    note = atif.record(tmp_path, Recorder())
    assert (
        note.startswith("writing the ATIF trajectory (trajectory.atif.json) failed: ") and "format version 99" in note
    )
    assert not logged and not list(tmp_path.glob("trajectory.atif.json*"))
    assert atif.record(tmp_path / "no-run", Recorder()) is None  # a run stopped before its agent: no trajectory
