"""Whole runs with sandbox=docker: the same score path as the default sandbox, and the
wall-clock budget enforced on a container. (Escapes: test_confinement.py.)"""

from __future__ import annotations

import pytest

from conftest import compose_config, mlflow_client, run_cli, store_args
from test_docker_sandbox import needs_docker

pytestmark = [pytest.mark.system, needs_docker]


def client_and_run(tmp_path):
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    return client, run


def no_containers_left(run_id: str) -> bool:
    import docker

    return not docker.from_env().containers.list(all=True, filters={"label": f"mlrb.run_id={run_id}"})


def test_default_run_in_docker_scores_like_the_default_sandbox(tmp_path, built_cache):
    result = run_cli(*store_args(tmp_path, built_cache), "sandbox=docker", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = client_and_run(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.sandbox"] == "docker"
    assert run.data.tags["mlrb.status"] == "ok"
    assert run.data.metrics["score"] == pytest.approx(run.data.metrics["baseline_score"], abs=1e-6)
    assert no_containers_left(run.info.run_id)


def test_the_wall_clock_budget_stops_the_container_and_the_work_is_scored(tmp_path, built_cache):
    from mlrb import run as run_lib

    # The submission (the base model, copied: no imports, so a loaded machine cannot
    # push it past the budget) is in place at once; then the command overruns.
    cfg = compose_config(*store_args(tmp_path, built_cache)[:2], "sandbox=docker", "budget.wall_time_s=15")
    cfg.task.scales["tiny"]["baseline_command"] = 'cp -r "$MLRB_DATA/base_model" submission && sleep 600'
    result = run_lib.execute(cfg, tmp_path / "run")
    _, run = client_and_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "budget_exhausted"
    assert run.data.tags["mlrb.stop_reason"] == "wall_time"
    assert run.data.metrics["agent_time_s"] < 35
    assert result.valid and run.data.metrics["score"] == run.data.metrics["do_nothing_score"]
    assert no_containers_left(run.info.run_id)
