"""`pip install .` (a wheel, not editable) into a fresh virtual environment, then
`python -m mlrb` from a folder that is not the repository: the configs, launcher
profiles, task starters and the sweep launchers all come from the installed package."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, mlflow_client
from test_confinement import Attack, Targets, attempts, guarded, outputs

pytestmark = pytest.mark.system

# What a wheel is built from: the repository's files, without what runs leave behind.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "mlruns", "outputs", "multirun", "build", "dist", "*.egg-info",
                                     "__pycache__", ".pytest_cache", "reports", "test-artifacts")  # fmt: skip


def harness_attacks() -> dict[str, Attack]:
    """test_confinement's attacks on the harness itself (importing it, its metadata, its text in
    any file); the others need a run's targets, which these do not read."""
    nowhere = Path("/nonexistent")
    every = attempts(Targets(nowhere, "", "", nowhere, nowhere, 0))
    return {name: every[name] for name in ("import_harness", "harness_metadata", "harness_text")}


def pip(python, *args, cwd):
    """`pip install ARGS`, without compiling what it installs (pip's default, a CPU minute or two
    here, most of it for modules no run imports): `compile_what_runs_import` compiles the rest."""
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", *args], cwd=cwd,
                            capture_output=True, text=True, timeout=1500)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def compile_what_runs_import(python):
    """What pip would have compiled of what the runs import (mlrb/core/bytecode.py, as install.sh
    runs it): a sandbox mounts the venv read-only, where a module without its bytecode is
    compiled again at every import."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(python), "-m", "mlrb.core.bytecode"],
        cwd=python.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # the venv's mlrb, not a checkout's
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_wheel_in_a_fresh_venv_runs_the_benchmark_from_any_folder(tmp_path, built_cache):
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(wheels), str(source)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("mlrb-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # no system site packages
    python = venv / "bin" / "python"
    pip(python, "torch==2.13.0", cwd=tmp_path)  # the CPU build, from the local wheel folder pip is configured with
    pip(python, str(wheel), cwd=tmp_path)
    shutil.rmtree(source)  # nothing may come from the sources
    compile_what_runs_import(python)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "MLRB_CACHE_DIR": str(built_cache)}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(python), "-c", "import mlrb; print(mlrb.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True)  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    help_text = subprocess.run(
        [str(python), "-m", "mlrb", "--help"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert "task: baby_lm, edge_llm_compression" in help_text.stdout, help_text.stderr[-2000:]

    # Planning seeds before any run reads the calibration that ships inside the package.
    plan = subprocess.run([str(python), "-m", "mlrb.compare", "--plan", "--effect", "10"], cwd=elsewhere, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert plan.returncode == 0 and f"Noise from {venv}" in plan.stdout, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert "| llm_efficiency | calibration: baseline and reference at 5 seeds × √2 |" in plan.stdout, plan.stdout

    run = subprocess.run(
        [str(python), "-m", "mlrb"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "llm_merging/baseline/smoke/0: score" in run.stdout
    client = mlflow_client(elsewhere)
    (recorded,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert recorded.info.status == "FINISHED" and recorded.data.tags["mlrb.valid"] == "True"

    # A sweep goes through the installed launchers (hydra_plugins) and cluster profiles. Its
    # agent tries to reach the harness, which this venv holds whole: it is hidden from the sandbox.
    probe = "\n".join(guarded(name, attack.command) for name, attack in harness_attacks().items())
    probe = base64.b64encode(probe.encode()).decode()
    sweep = subprocess.run([str(python), "-m", "mlrb", "-m", "seed=7",
                            f"task.scales.tiny.baseline_command='echo {probe} | base64 -d | bash'"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    assert "[sweep " in sweep.stdout and "parent run 'sweep llm_merging/baseline/smoke'" in sweep.stdout
    results = [json.loads(line) for trajectory in elsewhere.rglob("trajectory.jsonl")
               for line in trajectory.read_text().splitlines()]  # fmt: skip
    tried = outputs("".join(e["output"] for e in results if e["event"] == "tool_result"))
    for name, attack in harness_attacks().items():  # each refused by the sandbox, none got what it was after
        assert re.search(attack.refused, tried[name]) and not any(g in tried[name] for g in attack.gets), tried
    profile = subprocess.run([str(python), "-c", "from mlrb.sweep import load_profile; print(load_profile('local_single_node')['partition'])"],
                             cwd=elsewhere, env=env, capture_output=True, text=True)  # fmt: skip
    assert profile.stdout.strip() == "debug", profile.stderr[-2000:]

    # Without the repository's build script, a missing sandbox image is one line with the command to run.
    docker = subprocess.run([str(python), "-m", "mlrb", "sandbox=docker", "sandbox.options.image=mlrb-never-built:1"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert docker.returncode == 2
    (line,) = docker.stderr.strip().splitlines()
    assert line.startswith("mlrb: error: sandbox=docker: ") and ("IMAGE=mlrb-never-built:1 bash docker/build.sh" in line
                                                                  or "Docker daemon" in line)  # fmt: skip
