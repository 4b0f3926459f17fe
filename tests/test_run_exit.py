"""How `python -m mlrb` ends a single run: at once, without the interpreter's slow
teardown (mlrb/cli.py `end_process`), but only after everything is written: the
MLflow record, the log file, the result line; and it still waits for a thread of
the user's that is not done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, reply, tool

pytestmark = pytest.mark.integration

# A user's Hydra callback, run after mlrb's job returned: it logs a line and leaves a
# thread (not a daemon) that writes a file half a second later.
LATE_WRITER = """
import logging, threading, time
from pathlib import Path
from hydra.experimental.callback import Callback

class LateWriter(Callback):
    def on_job_end(self, config, job_return, **kwargs):
        logging.getLogger("late_writer").info("the user's callback ran after the job")
        def write():
            time.sleep(0.5)
            Path("late.txt").write_text("written after the run")
        threading.Thread(target=write).start()
"""


def noop_run(tmp_path: Path, cache: Path, *extra: str, env: dict | None = None):
    """A run whose agent submits at once, on the cheapest task (HARNESS_TASK): what is tested is how the
    process ends, whatever the task."""
    tmp_path.mkdir(exist_ok=True)
    with FakeLlmServer([reply(tool("submit", summary="nothing to do"))]) as server:
        return run_cli(
            *store_args(tmp_path, cache),
            *HARNESS_TASK,
            "agent=claude",
            *extra,
            cwd=tmp_path,
            env={"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.anthropic_url, **(env or {})},
        )


def test_a_run_that_ends_at_once_has_its_record_log_and_result_line_complete(tmp_path, cache_dir):
    result = noop_run(tmp_path / "fast", cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    # Standard output is a pipe here, so buffered: the result line is there only if it was flushed.
    last_line = result.stdout.splitlines()[-1]
    assert last_line.startswith(f"{HARNESS_EXPERIMENT}/claude/smoke/0: ") and " mlflow run " in last_line

    client = mlflow_client(tmp_path / "fast")
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and last_line.endswith(f"mlflow run {run.info.run_id}")
    tags, metrics = run.data.tags, run.data.metrics
    assert f"status {tags['mlrb.status']}" in last_line and tags["mlrb.agent_message"] == "nothing to do"
    assert run.data.params["agent.name"] == "claude" and run.data.params["assets.fingerprint"]
    assert metrics["steps"] == 1
    assert {f"stage_time_s.{s}" for s in ("compose", "agent", "recording")} <= set(metrics)
    traces = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    assert len(traces) == 1 and traces[0].info.state == "OK"
    assert {s.name for s in traces[0].data.spans} >= {"step 1", "submit"}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "instructions.md", "trajectory.jsonl", "workspace.patch", "score_report.json"} <= artifacts
    local = client.download_artifacts(run.info.run_id, "trajectory.jsonl", str(tmp_path / "downloaded"))
    assert [json.loads(line)["event"] for line in open(local)][-1] == "end"

    log = (tmp_path / "fast" / "run" / "mlrb.log").read_text()
    assert "agent ended: ok nothing to do" in log and log.endswith("\n")

    # A thread of the user's that is still running when the run ends: the process waits for it.
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "late_writer.py").write_text(LATE_WRITER)
    slow = tmp_path / "slow"
    result = noop_run(slow, cache_dir, "+hydra.callbacks.late._target_=late_writer.LateWriter",
                      env={"PYTHONPATH": str(tmp_path / "user")})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (slow / "late.txt").read_text() == "written after the run"
    assert "the user's callback ran after the job" in (slow / "run" / "mlrb.log").read_text()
