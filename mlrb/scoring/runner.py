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

from mlrb.tasks.base import ScoreReport, Task


class ScorerError(RuntimeError):
    """The scorer itself failed: an infrastructure problem, never a score of 0."""


def score_submission(task: Task, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
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
    log_file = work_dir / "scorer.log"
    with open(log_file, "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-m", "mlrb.scoring.worker", str(request_file)],
                cwd=work_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=task.spec.score_timeout_s,
            )
        except subprocess.TimeoutExpired:
            return ScoreReport.invalid(f"scoring took longer than {task.spec.score_timeout_s:g} s")
    report_file = Path(request["report"])
    if proc.returncode != 0 or not report_file.exists():
        tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise ScorerError(f"scorer exited {proc.returncode}: {tail[0]} (log: {log_file})")
    return ScoreReport(**json.loads(report_file.read_text()))
