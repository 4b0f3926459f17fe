"""Whose fault a failed scoring is, decided by a control rather than assumed.

When the scorer fails on a submission (it raises, runs out of time or memory), the harness
scores a control with the same scorer, in the same kind of sandbox: the task's own baseline
submission, made by the task's baseline command (as the scripted baseline agent runs it) and
kept beside the task's assets, once per asset build. If the control scores, the scorer and the
machine work, so the failure is the submission's: the run is `invalid`, counted as doing
nothing. Only a failure the control shares is the harness's (`infra_error`). A task with no
baseline command has no control: its scoring failures are the submission's too, since nothing
proves otherwise.
"""

from __future__ import annotations

import fcntl
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlrb.core.config import SandboxConfig
from mlrb.harness import assets as assets_lib
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.runner import Scorer, ScorerError
from mlrb.tasks.base import Task
from mlrb.tasks.handling import solutions_of

log = logging.getLogger(__name__)

CONTROL_SUFFIX = ".control"  # <asset folder>.control/<fingerprint>/: the control beside the assets


@dataclass(frozen=True)
class Verdict:
    """What the control said: `shared` when it failed too (the harness's fault), with what it
    scored or how it failed."""

    shared: bool
    detail: str


def control_submission(task: Task, asset_path: Path) -> Path:
    """The task's baseline submission for these assets, made once (under a lock: a sweep's jobs
    may fail at once) and kept beside them. Raises ScorerError when the baseline command fails:
    then nothing proves the scorer works."""
    home = asset_path.parent / f"{asset_path.name}{CONTROL_SUFFIX}"
    kept = home / assets_lib.fingerprint(asset_path)
    submission = kept / "submission" / task.rules.submission
    if (kept / "done").exists():
        return submission
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept / "done").exists():
            return submission
        staging = home / "making"
        shutil.rmtree(staging, ignore_errors=True)
        log.info("making %s's control (its baseline submission) in %s", task.name, kept)
        try:
            work = solutions_of(task, asset_path / "public").run(task.baseline_command(), staging / "workspace", seed=0)
        except RuntimeError as e:
            raise ScorerError(f"the control (the task's baseline command) failed: {e}") from None
        if not (work / task.rules.submission).exists():
            raise ScorerError(f"the control (the task's baseline command) left nothing at '{task.rules.submission}'")
        (staging / "submission").mkdir()
        (work / task.rules.submission).rename(staging / "submission" / task.rules.submission)
        shutil.rmtree(work, ignore_errors=True)
        (staging / "done").touch()
        shutil.rmtree(kept, ignore_errors=True)
        staging.rename(kept)
    return submission


def score_control(task: Task, asset_path: Path, work_dir: Path, sandbox: SandboxConfig, run_id: str = "") -> Verdict:
    """Score the task's control in a fresh scorer of the run's sandbox kind, in `work_dir`."""
    if not task.baseline_command():
        return Verdict(False, "the task has no baseline command, so no control could show the scorer at fault")
    try:
        submission = control_submission(task, asset_path)
        with Scorer(task, asset_path, work_dir, sandbox, run_id, ahead=False) as scorer:  # it scores at once
            report = scorer.score(submission)
    except ScorerError as e:
        return Verdict(True, f"the control failed too: {e}")
    if not report.valid:
        return Verdict(
            True, f"the control failed too: the task's baseline submission was judged invalid: {report.reason}"
        )
    return Verdict(False, f"the task's baseline submission scored {report.score} in the same scorer")


def blame(
    failure: ScorerError, task: Task, asset_path: Path, work_dir: Path, sandbox: SandboxConfig, run_id: str = ""
) -> ScoreReport:
    """The report of a submission whose scoring failed with `failure`: invalid when the control
    scores; raises ScorerError (the harness's fault) when the control fails as well."""
    verdict = score_control(task, asset_path, work_dir, sandbox, run_id)
    if verdict.shared:
        raise ScorerError(f"{failure}; {verdict.detail}") from failure
    log.warning("scoring the submission failed (%s); %s: the failure is the submission's", failure, verdict.detail)
    return ScoreReport.invalid(
        f"scoring failed on this submission ({failure}); {verdict.detail}",
        scorer_error=str(failure)[:1000],
        control=verdict.detail,
    )
