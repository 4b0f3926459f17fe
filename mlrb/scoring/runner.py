"""Score a submission outside the agent's reach: on a fresh copy, in a separate
Python process started in isolated mode (-I: no PYTHON* variables, no user site,
no current folder on sys.path) so nothing the agent shipped can load itself
into the scorer."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from mlrb.config import SandboxConfig
from mlrb.tasks.base import ScoreReport, Task


class ScorerError(RuntimeError):
    """The scorer itself failed: an infrastructure problem, never a score of 0."""


def score_submission(
    task: Task,
    submission: Path,
    assets: Path,
    work_dir: Path,
    sandbox: Optional[SandboxConfig] = None,
    run_id: str = "",
) -> ScoreReport:
    """Score in a subprocess, or in a fresh container when the run's sandbox is docker."""
    work_dir.mkdir(parents=True, exist_ok=True)
    if not submission.exists():
        return ScoreReport.invalid(f"no submission: the agent left nothing at '{task.cfg.submission}' in its workspace")
    fresh = work_dir / "submission"
    shutil.rmtree(fresh, ignore_errors=True)
    if submission.is_dir():
        shutil.copytree(submission, fresh, symlinks=True)
    else:
        shutil.copy2(submission, fresh, follow_symlinks=False)

    task_cfg = dataclasses.asdict(task.cfg)
    task_cfg["scales"] = {task.cfg.scale: task_cfg["scales"][task.cfg.scale]}  # the scorer needs no other
    request = {
        "task": task_cfg,
        "submission": str(fresh),
        "assets": str(assets),
        "work_dir": str(work_dir),
        "report": str(work_dir / "report.json"),
    }
    request_file = work_dir / "request.json"
    request_file.write_text(json.dumps(request, indent=2))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(work_dir),
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "HF_DATASETS_OFFLINE": os.environ.get("HF_DATASETS_OFFLINE", "1"),
        "HF_HOME": str(work_dir / "hf_home"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-I", "-m", "mlrb.scoring.worker", str(request_file)]
    log_file = work_dir / "scorer.log"
    timeout = task.spec.score_timeout_s
    if sandbox is not None and sandbox.kind == "docker":
        code = run_in_container(task, sandbox, run_id, command, assets, work_dir, env, log_file)
    else:
        code = run_in_process(command, work_dir, env, log_file, timeout)
    if code is None:
        return ScoreReport.invalid(f"scoring took longer than {timeout:g} s")
    report_file = Path(request["report"])
    if code != 0 or not report_file.exists():
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise ScorerError(f"scorer exited {code}: {tail[0]} (log: {log_file})")
    return ScoreReport(**json.loads(report_file.read_text()))


def run_in_process(command, work_dir: Path, env: dict, log_file: Path, timeout: float) -> Optional[int]:
    with open(log_file, "w") as log:
        try:
            return subprocess.run(
                command, cwd=work_dir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return None


def run_in_container(task: Task, sandbox, run_id: str, command, assets: Path, work_dir: Path, env: dict,
                     log_file: Path) -> Optional[int]:  # fmt: skip
    """A fresh container, no network, that sees only the scorer's code, the hidden data
    (read-only) and its own work folder holding the copy of the submission."""
    from mlrb.sandbox import docker as docker_sandbox
    from mlrb.sandbox.base import limits_for

    user = docker_sandbox.run_user(sandbox)
    docker_sandbox.hand_over(work_dir, user)
    mounts = {
        str(work_dir): {"bind": str(work_dir), "mode": "rw"},
        str(assets.resolve()): {"bind": str(assets.resolve()), "mode": "ro"},
    }
    package_root = str(Path(__file__).resolve().parents[2])
    if not package_root.startswith(sys.prefix):  # an editable install: its source tree
        mounts[package_root] = {"bind": package_root, "mode": "ro"}
    limits = dataclasses.replace(limits_for(task, sandbox), network=False)
    container_env = {k: v for k, v in env.items() if k != "PATH"}
    return docker_sandbox.run_to_completion(
        sandbox, limits, run_id, command, mounts, str(work_dir), container_env, task.spec.score_timeout_s, log_file
    )
