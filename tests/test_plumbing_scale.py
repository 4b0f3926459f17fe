"""The plumbing scale: each task's tiny scale cut down so that its assets build in seconds, for
checking that runs work (an agent, a sandbox, a cluster profile, the harness's own tests). A scale
says only what differs from the one it `extends`; a plumbing run measures nothing, so it carries no
normalised or counted score, the report's means leave it out and mlrb.compare refuses it."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from build_ahead import TINY_TASKS
from conftest import compose_config, empty_store, mlflow_client, run_cli, run_module, store_args, task_from_config
from mlrb.core.config import ConfigError, resolve_scales
from mlrb.tasks.handling import asset_key, is_plumbing


@pytest.mark.fast
def test_a_scale_that_extends_another_takes_its_values_and_overrides_some():
    scales = {
        "tiny": {"max_params": 5, "assets": {"seed": 0, "steps": 600, "skills": ["a", "b"]}, "eval": {"limit": None}},
        "plumbing": {"extends": "tiny", "plumbing": True, "assets": {"steps": 6, "skills": ["a"]}},
        "smaller": {"extends": "plumbing", "assets": {"seed": 1}},
    }
    resolved = resolve_scales(scales)
    assert resolved["plumbing"] == {"max_params": 5, "assets": {"seed": 0, "steps": 6, "skills": ["a"]},
                                    "eval": {"limit": None}, "plumbing": True}  # fmt: skip
    assert resolved["smaller"]["assets"] == {"seed": 1, "steps": 6, "skills": ["a"]}
    assert resolved["tiny"] == scales["tiny"] and "extends" in scales["plumbing"]  # the input is left as it was
    with pytest.raises(ConfigError, match=r"task.scales.plumbing.extends: no scale 'tinny'; valid: tiny"):
        resolve_scales({"tiny": {}, "plumbing": {"extends": "tinny"}})
    with pytest.raises(ConfigError, match="extends itself"):
        resolve_scales({"a": {"extends": "b"}, "b": {"extends": "a"}})


@pytest.mark.fast
def test_every_task_has_a_plumbing_scale_and_an_override_of_tiny_reaches_it():
    for key in TINY_TASKS:
        tiny, plumbing = task_from_config(key), task_from_config(key, scale="plumbing")
        assert is_plumbing(plumbing) and not is_plumbing(tiny), key
        assert plumbing.anchors.seeds == 1 and plumbing.spec.prompt == tiny.spec.prompt, key
        assert asset_key(plumbing) != asset_key(tiny), key
    cfg = compose_config("task=llm_merging", "task.scale=plumbing", "task.scales.tiny.max_params=7")
    assert cfg.task.scales["plumbing"]["max_params"] == 7 and cfg.task.scales["plumbing"]["plumbing"] is True


@pytest.mark.fast
def test_a_bad_extends_is_one_line_naming_the_scales(tmp_path):
    result = run_cli("task=llm_merging", "task.scale=plumbing", "task.scales.plumbing.extends=tinny", "agent=baseline",
                     *store_args(tmp_path, tmp_path / "cache"), cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert "task.scales.plumbing.extends: no scale 'tinny'; valid: tiny, full" in result.stderr
    assert not (tmp_path / "cache").exists()  # nothing built


@pytest.mark.integration
@pytest.mark.parametrize("key", TINY_TASKS)
def test_each_task_s_plumbing_run_scores_and_counts_as_nothing(key, tmp_path, cache_dir):
    """The baseline agent at plumbing scale, from the command line: a valid score that is neither
    normalised nor counted, the run tagged as plumbing; the report shows it and no mean of it."""
    result = run_cli(f"task={key}", "task.scale=plumbing", "agent=baseline", *store_args(tmp_path, cache_dir),
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(key).experiment_id])
    tags, metrics = run.data.tags, run.data.metrics
    assert tags["mlrb.status"] == "ok" and tags["mlrb.valid"] == "True", tags.get("mlrb.invalid_reason")
    assert tags["mlrb.scale"] == "plumbing" and tags["mlrb.plumbing"] == "true"
    assert tags["mlrb.counted_as"] == "none" and "plumbing scale" in tags["mlrb.counted_reason"]
    assert "score" in metrics
    assert not {"normalised_score", "counted_score", "counted_normalised_score", "baseline_score"} & set(metrics)
    if key != "llm_merging":
        return  # the report's reading of a plumbing run: once
    out = tmp_path / "report"
    report = run_module("mlrb.report", "--no-plots", "--out", str(out), cwd=tmp_path, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    (group,) = csv.DictReader((out / "summary.csv").open())
    assert group["scale"] == "plumbing" and group["valid"] == "1"
    assert group["score_mean"] == group["counted_mean"] == group["counted_normalised_mean"] == ""
    assert "## Plumbing runs" in (out / "summary.md").read_text()


@pytest.mark.fast
def test_compare_refuses_plumbing_runs_and_says_how_to_leave_them_out(tmp_path):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    (tmp_path / "mlruns").mkdir()
    shutil.copyfile(empty_store(), tmp_path / "mlruns" / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.create_experiment("llm_merging")
    for agent in ("a", "b"):
        for seed in (1, 2):
            tags = {"mlrb.task": "llm_merging", "mlrb.agent": agent, "mlrb.budget": "smoke", "mlrb.scale": "plumbing",
                    "mlrb.plumbing": "true", "mlrb.seed": str(seed), "mlrb.sandbox": "bwrap", "mlrb.confined": "true",
                    "mlrb.status": "ok", "mlrb.valid": "True", "mlrb.counted_as": "none"}  # fmt: skip
            run = client.create_run(experiment, tags=tags, run_name=f"llm_merging/{agent}/smoke/{seed}").info.run_id
            client.log_batch(run, metrics=[Metric("score", 0.5 + seed / 10, 0, 0)])
            client.set_terminated(run, "FINISHED")
    result = run_module("mlrb.compare", "a", "b", cwd=tmp_path, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "runs at a plumbing scale measure nothing and are not compared: llm_merging (scale plumbing)" in lines[0]
    assert Path(tmp_path / "mlruns" / "mlflow.db").exists()
