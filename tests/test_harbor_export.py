"""`python -m mlrb.export harbor TASK --scale tiny --out DIR`: llm_merging as a Harbor task folder.
Harbor's own task loader (the `harbor` package, in its side environment `.venv-harbor`) accepts
it with the scale's limits; its environment/ holds none of the task's hidden files; and run back
through mlrb's Harbor route (`task=harbor task.path=DIR agent=baseline sandbox=docker`: the image
built from its Dockerfile, tests/test.sh scoring with mlrb's judge) its baseline scores what the
native task's baseline scores. Bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import mlflow_client, run_cli, run_module, store_args
from test_docker_sandbox import docker_problem

REPO = Path(__file__).resolve().parent.parent
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
needs_docker = pytest.mark.skipif(bool(docker_problem()), reason=docker_problem() or "docker ok")


def export(*args: str, cwd: Path, cache: Path | None = None) -> subprocess.CompletedProcess:
    extra = ["--cache-dir", str(cache)] if cache else []
    return run_module("mlrb.export", "harbor", *args, *extra, cwd=cwd, timeout=600)


ONE_EXPORTED = pytest.mark.xdist_group("harbor_export")  # one process, so the task is exported once


@pytest.fixture(scope="module")
def exported(built_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("harbor-export") / "llm_merging"
    result = export("llm_merging", "--scale", "tiny", "--out", str(out), cwd=out.parent, cache=built_cache)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


def assets_of(cache: Path) -> Path:
    from conftest import tiny_llm_merging
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(tiny_llm_merging(), cache)


@pytest.mark.fast
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    unknown = export("llm_mergin", "--out", str(tmp_path / "a"), cwd=tmp_path)
    assert unknown.returncode == 2 and not (tmp_path / "a").exists()
    assert unknown.stderr.strip().splitlines() == [
        "mlrb.export harbor: error: unknown task 'llm_mergin': the packaged tasks are baby_lm, edge_llm_compression, "
        "edge_llm_training, llm_efficiency, llm_merging, math_reasoning, mini_pile"
    ]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    full = export("llm_merging", "--out", str(taken), cwd=tmp_path)
    assert full.returncode == 2 and sorted(p.name for p in taken.iterdir()) == ["notes.txt"]
    assert "is a folder that is not empty" in full.stderr and len(full.stderr.strip().splitlines()) == 1
    scale = export("llm_merging", "--scale", "huge", "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert scale.returncode == 2 and not (tmp_path / "b").exists()
    assert "task llm_merging has no scale 'huge': its scales are tiny, plumbing, full" in scale.stderr


@pytest.mark.system
@ONE_EXPORTED
def test_harbor_s_own_loader_reads_the_folder_with_the_scale_s_limits(exported):
    code = ("import json, sys; from harbor.models.task.task import Task; t = Task(sys.argv[1]); c = t.config; "
            "print(json.dumps({'valid': Task.is_valid_dir(sys.argv[1]), 'agent': c.agent.timeout_sec, "
            "'verifier': c.verifier.timeout_sec, 'cpus': c.environment.cpus, 'memory_mb': c.environment.memory_mb, "
            "'gpus': c.environment.gpus, 'network': c.environment.network_mode.value, 'instruction': t.instruction}))")  # fmt: skip
    proc = subprocess.run([str(HARBOR_PYTHON), "-c", code, str(exported)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    # tiny: 600 s, 2 cpus, 4 GB, no GPU, no network; the scorer's 600 s
    assert seen | {"instruction": ""} == {"valid": True, "agent": 600.0, "verifier": 600.0, "cpus": 2,
                                           "memory_mb": 4096, "gpus": None, "network": "no-network",
                                           "instruction": ""}  # fmt: skip
    assert seen["instruction"].startswith("# Task: LLM Merging") and "$MLRB_DATA/base_model" in seen["instruction"]
    assert "Your workspace (the only place you may write): /app" in seen["instruction"]


@pytest.mark.system
@ONE_EXPORTED
def test_the_environment_holds_no_hidden_file_and_the_tests_hold_them_all(exported, built_cache):
    hidden = assets_of(built_cache) / "hidden"
    hidden_names = {p.name for p in hidden.rglob("*") if p.is_file()}
    assert hidden_names >= {"test.jsonl", "calibration.json"}
    shown = [p for p in (exported / "environment").rglob("*")]
    assert not {p.name for p in shown} & hidden_names
    test_rows = (hidden / "test.jsonl").read_text().splitlines()
    for path in (p for p in shown if p.is_file()):  # nor a hidden row under another name
        assert not any(row in path.read_text(errors="replace") for row in test_rows[:20]), path
    assert {p.name for p in (exported / "tests" / "assets" / "hidden").rglob("*")} == hidden_names
    dockerfile = (exported / "environment" / "Dockerfile").read_text()
    assert "FROM mlrb-sandbox:latest" in dockerfile and "COPY base_model /app/base_model" in dockerfile


@pytest.mark.system
@needs_docker
@ONE_EXPORTED
def test_the_exported_folder_run_through_mlrb_s_harbor_route_scores_the_native_baseline(exported, built_cache,
                                                                                        tmp_path):  # fmt: skip
    native = json.loads((assets_of(built_cache) / "hidden" / "calibration.json").read_text())["baseline_score"]
    result = run_cli(*store_args(tmp_path, built_cache), "task=harbor", f"task.path={exported}", "agent=baseline",
                     "sandbox=docker", cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert run.data.metrics["valid"] == 1.0
    assert run.data.metrics["score"] == pytest.approx(native, abs=1e-9)  # 0.5625 on this machine
    assert run.data.metrics["reward.valid"] == 1.0
