"""A task's own Python environment (mlrb/harness/environments.py): tests/folder_tasks/numpy1-mini pins
numpy 1.26.4 (its train.py and eval.py use np.float_, gone in numpy 2, the harness's), and runs
with it: the agent's commands, the baseline at asset build and the folder's eval.py, in each
sandbox, with none of the harness's libraries importable. Building it needs the package index
(PyPI here, as for `install.sh`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import mlflow_client, run_cli, run_module, store_args
from mlrb.tasks.base import python_of
from mlrb.tasks.handling import asset_key
from test_docker_sandbox import docker_problem

NUMPY1 = Path(__file__).parent / "folder_tasks" / "numpy1-mini"
SANDBOXES = [
    pytest.param("bwrap"),
    pytest.param("docker", marks=pytest.mark.skipif(bool(docker_problem()), reason=docker_problem() or "docker ok")),
    pytest.param("unconfined"),
]


def folder_task(path: Path, *requirements: str):
    from mlrb.core import registry
    from mlrb.core.config import TaskConfig

    return registry.load_task(TaskConfig(name=path.name, title=path.name, kind="folder", path=str(path), submission=".",
                                 scales={"folder": {}}, scale="folder", requirements=list(requirements)))  # fmt: skip


@pytest.mark.fast
def test_requirements_come_from_the_folder_then_the_config_comments_dropped(tmp_path):
    from mlrb.harness import environments

    folder = tmp_path / "task"
    shutil.copytree(NUMPY1, folder)
    (folder / "scripts" / "requirements.txt").write_text("scipy==1.11.4  # MLRC-Bench keeps it here\nnumpy==1.26.4\n")
    task = folder_task(folder, "pandas==2.1.4")
    assert task.requirements == ("numpy==1.26.4", "scipy==1.11.4", "pandas==2.1.4")
    # the environment is keyed by them: another pin is another environment, the same pins the same one
    assert environments.key(list(task.requirements)) == environments.key(list(task.requirements))
    assert environments.key(["numpy==1.26.4"]) != environments.key(["numpy==1.26.3"])
    assert environments.ensure("t", [], tmp_path) is None  # nothing declared: the harness's libraries


@pytest.mark.fast
def test_a_packaged_task_without_requirements_keeps_its_asset_key_and_the_harness_libraries():
    from conftest import tiny_llm_merging

    task = tiny_llm_merging()
    assert task.requirements == () and "requirements" not in asset_key(task)  # fingerprints unchanged
    assert python_of(task.environment) == sys.executable
    pinned = folder_task(NUMPY1)
    assert asset_key(pinned)["requirements"] == ["numpy==1.26.4"]  # the anchors were measured in it


@pytest.mark.system
@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_folder_that_pins_numpy_1_runs_its_baseline_and_eval_in_its_own_environment(tmp_path, cache_dir, sandbox):
    from mlrb.harness import environments

    result = run_cli(*store_args(tmp_path, cache_dir), "task=folder", f"task.path={NUMPY1}", "task.higher_is_better=false",
                     f"sandbox={sandbox}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "numpy1-mini/baseline/smoke/0: score" in result.stdout and "(valid)" in result.stdout

    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("numpy1-mini").experiment_id])
    # eval.py ran with numpy 1 (np.float_), so the score is valid; the run names its environment
    assert run.data.tags["mlrb.status"] == "ok" and run.data.tags["mlrb.valid"] == "True"
    root = environments.location(["numpy==1.26.4"], cache_dir)
    assert run.data.tags["mlrb.environment"] == root.name
    assert environments.installed(root) == ["numpy==1.26.4"]  # the task's libraries, nothing of the harness

    # what the agent's train.py saw: numpy 1, and no harness library at all (mlrb, torch, mlflow)
    (workspace,) = (tmp_path / "run").glob("**/workspace")
    seen = json.loads((workspace / "submission.json").read_text())
    assert seen["numpy"] == "1.26.4"
    assert seen["importable"] == {"numpy": True, "mlrb": False, "torch": False, "mlflow": False}


@pytest.mark.system
def test_requirements_pip_cannot_install_are_one_line_and_leave_no_environment_or_run(tmp_path):
    folder = tmp_path / "broken-pins"
    shutil.copytree(NUMPY1, folder)
    (folder / "requirements.txt").write_text("mlrb-no-such-package==1.0\n")
    cache = tmp_path / "cache"
    result = run_cli(*store_args(tmp_path, cache), "task=folder", f"task.path={folder}", cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("mlrb: error: broken-pins: its Python environment (mlrb-no-such-package==1.0) could not "
                           "be built: ERROR: No matching distribution found for mlrb-no-such-package==1.0")  # fmt: skip
    assert "python -m mlrb.prefetch" in line
    assert not [p for p in (cache / "environments").iterdir() if p.is_dir()]  # no half-built venv
    assert not (cache / "broken-pins").exists()  # no assets built on top of it
    client = mlflow_client(tmp_path)
    assert [e.name for e in client.search_experiments()] == ["Default"]  # nothing recorded


@pytest.mark.system
def test_prefetch_builds_the_environment_ahead_and_check_says_whether_it_is_there(tmp_path):
    from mlrb.harness import environments

    cache = tmp_path / "cache"
    args = ["task=folder", f"task.path={NUMPY1}", f"paths.cache_dir={cache}"]

    def prefetch(*extra: str) -> subprocess.CompletedProcess:
        return run_module("mlrb.prefetch", *extra, *args, cwd=tmp_path)

    root = environments.location(["numpy==1.26.4"], cache)
    missing = prefetch("--check")
    assert (
        missing.returncode == 1
        and f"missing: numpy1-mini: its Python environment (numpy==1.26.4) in {root}" in missing.stdout
    )
    built = prefetch()
    assert built.returncode == 0, built.stderr
    assert f"numpy1-mini: its Python environment is built ({root})" in built.stdout
    assert environments.installed(root) == ["numpy==1.26.4"]
    assert prefetch("--check").returncode == 0
