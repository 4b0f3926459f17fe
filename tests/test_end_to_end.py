"""Whole runs through `python -m mlrb`, asserted on what MLflow holds afterwards: the README's
default run (the calibrated tiny scale), and how failures and budgets move a run (plumbing scale)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PLUMBING, anchors_of, broken_copy_of, mlflow_client, plumbing_llm_merging, run_cli, store_args


def only_run(tmp_path):
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("llm_merging")
    assert experiment is not None, "the experiment is named after the task"
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def plumbing_anchors(cache_dir: Path) -> dict:
    """hidden/calibration.json of llm_merging's plumbing assets in cache_dir: the anchors its build
    measured at one seed (the runs read none of them)."""
    from mlrb.harness.assets import ensure_assets

    assets = ensure_assets(plumbing_llm_merging(), cache_dir)
    return json.loads((assets / "hidden" / "calibration.json").read_text())


# The README's first command as it types it (no override): the calibrated tiny scale, its anchors,
# normalised and counted score. The system tier's.
@pytest.mark.system
def test_default_run_is_recorded_finished_with_score_config_and_patch(tmp_path, cache_dir, monkeypatch):
    result = run_cli(*store_args(tmp_path, cache_dir), cwd=tmp_path, env={"ANTHROPIC_API_KEY": "sk-ant-never-logged"})
    assert result.returncode == 0, result.stderr[-3000:]
    client, run = only_run(tmp_path)

    assert run.info.status == "FINISHED"
    assert run.info.run_name == "llm_merging/baseline/smoke/0"
    tags = run.data.tags
    assert tags["mlrb.status"] == "ok" and tags["mlrb.valid"] == "True"
    assert (tags["mlrb.task"], tags["mlrb.agent"], tags["mlrb.budget"], tags["mlrb.scale"]) == (
        "llm_merging", "baseline", "smoke", "tiny",
    )  # fmt: skip
    assert len(tags["mlrb.run_key"]) == 16

    metrics = run.data.metrics
    assert 0.0 <= metrics["score"] <= 1.0
    # The baseline agent reruns the asset build's baseline (seed 0), so it scores the anchor the
    # build measured, read here from its file; normalised on those anchors, that is 0.
    calibration = anchors_of("llm_merging", cache_dir)
    assert metrics["baseline_score"] == pytest.approx(calibration["baseline_score"], abs=1e-12)
    assert metrics["score"] == pytest.approx(calibration["baseline_score"], abs=1e-6)
    baseline, reference = calibration["baseline_score"], calibration["reference_score"]
    expected = 100 * (metrics["score"] - baseline) / (reference - baseline)
    assert metrics["normalised_score"] == pytest.approx(expected, abs=1e-4)
    # It beats doing nothing (the untouched base model), so it counts as it scored.
    assert metrics["do_nothing_score"] < metrics["baseline_score"]
    assert (metrics["counted_score"], metrics["counted_normalised_score"]) == (
        metrics["score"],
        metrics["normalised_score"],
    )
    assert tags["mlrb.counted_as"] == "score" and tags["mlrb.counted_reason"] == ""
    assert metrics["success"] == 0.0
    assert metrics["steps"] == 1 and metrics["prepare_time_s"] >= 0
    # the run's own time: agent and scoring, not finding or building the task's assets
    assert metrics["agent_time_s"] + metrics["score_time_s"] <= metrics["wall_time_s"]
    assert metrics["wall_time_s"] < metrics["agent_time_s"] + metrics["score_time_s"] + 10
    assert any(name.startswith("score.") for name in metrics)  # per-subject accuracy

    params = run.data.params
    assert params["task.name"] == "llm_merging" and params["budget.wall_time_s"] == "600.0"
    assert params["task.scales.tiny.eval.batch_size"] == "8"

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "workspace.patch", "score_report.json", "trajectory.jsonl", "instructions.md"} <= artifacts
    local = client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts"))
    patch = open(f"{local}/workspace.patch").read()
    assert "Binary file submission/model.safetensors added" in patch
    assert "+++ b/submission/config.json" in patch
    # The baseline's one command, through the run's event sink: in the trajectory and in a trace.
    lines = [json.loads(line) for line in open(f"{local}/trajectory.jsonl")]
    assert [e["event"] for e in lines] == ["start", "tool_call", "tool_result", "submit", "end"]
    assert lines[1]["tool"] == "shell" and "merge.py" in lines[1]["arguments"]["command"]
    assert lines[2]["exit_code"] == 0 and lines[2]["output"].startswith("exit code 0")
    assert lines[-1]["status"] == "ok" and lines[-1]["steps"] == 1
    (trace,) = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    assert [(s.name, s.span_type) for s in sorted(trace.data.spans, key=lambda s: s.start_time_ns)] == [
        ("step 1", "AGENT"), ("shell", "TOOL"),
    ]  # fmt: skip
    report = json.load(open(f"{local}/score_report.json"))
    assert report["valid"] and report["score"] == pytest.approx(metrics["score"])
    instructions = open(f"{local}/instructions.md").read()
    assert "# Task: LLM Merging" in instructions and "## Rules" in instructions
    everything = b" ".join(p.read_bytes() for p in Path(local).rglob("*") if p.is_file())  # step snapshots too
    assert b"sk-ant-never-logged" not in everything and "sk-ant-never-logged" not in json.dumps(params)


@pytest.mark.integration
def test_a_failing_agent_is_recorded_with_its_status_and_no_submission(tmp_path, plumbing_cache):
    result = run_cli(
        *store_args(tmp_path, plumbing_cache),
        PLUMBING,  # which extends tiny: an override of tiny's values is the plumbing run's too
        "seed=5",
        "task.scales.tiny.baseline_command='echo giving up at seed $MLRB_SEED >&2; exit 3'",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = only_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlrb.status"] == "agent_error"
    # the run's seed reaches the agent's commands as $MLRB_SEED (the tasks' anchors pass it as --seed)
    assert "exited 3: giving up at seed 5" in run.data.tags["mlrb.agent_message"]
    assert run.data.tags["mlrb.valid"] == "False"
    assert "no submission" in run.data.tags["mlrb.invalid_reason"]
    metrics = run.data.metrics
    assert metrics["valid"] == 0.0 and "score" not in metrics and "normalised_score" not in metrics
    # A plumbing run counts as nothing, a failed one too (how a failure counts on the calibrated
    # scale: tests/test_scale.py).
    assert run.data.tags["mlrb.scale"] == "plumbing" and run.data.tags["mlrb.counted_as"] == "none"
    assert "plumbing scale" in run.data.tags["mlrb.counted_reason"]
    assert not {"counted_score", "counted_normalised_score", "do_nothing_score"} & set(metrics)


@pytest.mark.integration
def test_the_wall_clock_budget_stops_the_agent_and_its_work_is_still_scored(tmp_path, plumbing_cache):
    # The agent puts a submission in place at once (the base model, copied: no imports
    # that a loaded machine could push past the budget), then overruns its budget.
    command = 'cp -r "$MLRB_DATA/base_model" submission && sleep 120'
    result = run_cli(
        *store_args(tmp_path, plumbing_cache),
        PLUMBING,
        f"task.scales.tiny.baseline_command='{command}'",
        "budget.wall_time_s=15",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = only_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "budget_exhausted"
    assert run.data.tags["mlrb.stop_reason"] == "wall_time"
    assert run.data.metrics["agent_time_s"] < 35
    assert run.data.tags["mlrb.valid"] == "True"
    # the base model, scored: what the asset build measured as doing nothing
    do_nothing = plumbing_anchors(plumbing_cache)["do_nothing_score"]
    assert run.data.metrics["score"] == pytest.approx(do_nothing, abs=1e-6)


# On the default task's plumbing run, not the cheapest task (HARNESS_TASK): there a broken hidden file
# does not make the scorer fail. Whatever scripts/eval.py raises on it, the folder's judge calls the
# submission invalid (mlrb/tasks/folder/scoring.py), so no control is asked and the run is the agent's
# (FINISHED, invalid: "scripts/eval.py get_score raised ..."), not an infrastructure error.
@pytest.mark.integration
def test_a_scorer_failure_is_an_infrastructure_error_not_a_zero(tmp_path, plumbing_cache):
    broken_cache = broken_copy_of(plumbing_cache, tmp_path / "cache", scale="plumbing")  # its test set is not JSON
    # The submission, and the control made beside this cache's assets, a copy of the given base model:
    # what fails is the scoring, whatever is scored (a merge would add two runs of torch's imports).
    valid = "task.scales.tiny.baseline_command='cp -r \"$MLRB_DATA/base_model\" submission'"
    result = run_cli(*store_args(tmp_path, broken_cache), PLUMBING, valid, cwd=tmp_path)
    assert result.returncode == 1
    # One line on the console: the cause and the log file that holds the traceback. The control
    # (the task's baseline submission, mlrb/harness/control.py) failed the same way: the harness's fault.
    assert "Traceback" not in result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("mlrb: run failed (") and "ScorerError: scorer exited 1" in line
    assert "; the control failed too: scorer exited 1" in line
    log_file = Path(line.rsplit("the traceback is in ", 1)[1])
    assert log_file.is_relative_to(tmp_path / "run") and "Traceback" in log_file.read_text()
    # (verbose=true shows the traceback on the console too: tests/test_scoring_blame.py's timeout run)
    _, run = only_run(tmp_path)
    assert run.info.status == "FAILED"
    assert run.data.tags["mlrb.status"] == "infra_error"
    assert "ScorerError" in run.data.tags["mlrb.error"]
    assert "score" not in run.data.metrics
    # reviewed though it was not scored: what its agent tried still counts
    assert (run.data.tags["mlrb.review"], run.data.tags["mlrb.review_findings"]) == ("clean", "0")
