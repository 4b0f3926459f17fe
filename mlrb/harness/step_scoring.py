"""Scoring the agent's workspace during its run, for the report's anytime curves:
`scoring.every_steps=N` (after every Nth step) and `scoring.every_minutes=M` (after the first
step that ends M minutes or more, on the agent's clock, after the last scoring); off by default.

After a step whose turn it is, the step's snapshot (mlrb/run_files/snapshots.py) is rebuilt outside the
agent's workspace, the task's read-only files restored, and its submission scored as the run's
final one is: a copy, in a fresh sandbox of the scorer's own (mlrb/scoring/runner.py). The
step's anytime metrics (mlrb/analysis/anytime.py) are logged at that step, as `python -m mlrb.rescore
RUN_ID --all-steps` logs them afterwards. Meanwhile the agent waits and its wall-time clock
stands still (Budget.paused): the scoring is not its time. What it left running in its sandbox
goes on. When the run has been scored, its own score is logged as the anytime metrics of its
last step (`ended`), so that the curve ends where the run did.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from mlrb.analysis import anytime
from mlrb.core.budget import Budget
from mlrb.core.config import SandboxConfig, ScoringConfig
from mlrb.core.tags import Metric
from mlrb.run_files import snapshots, workspace
from mlrb.scoring.runner import ScorerError, score_submission
from mlrb.tasks.handling import run_anchors

log = logging.getLogger(__name__)


class StepScoring:
    """One run's scoring during its steps; does nothing when `cfg` asks for none."""

    def __init__(
        self,
        cfg: ScoringConfig,
        task: Any,
        asset_path: Path,
        work: Path,
        start_files: Path,
        snapshots_root: Path,
        sandbox: SandboxConfig,
        recorder: Any,
        run_dir: Path,
        budget: Budget,
    ):
        self.cfg, self.task, self.asset_path, self.work, self.start_files = cfg, task, asset_path, work, start_files
        self.snapshots_root, self.sandbox, self.recorder, self.budget = snapshots_root, sandbox, recorder, budget
        self.folder = run_dir / "anytime"  # each scoring's report (its workspace copy is removed once scored)
        self.anchors: dict[str, float | None] = run_anchors(task, asset_path) if self.on else {}
        self.last_s: float | None = None  # the agent's clock at the last scoring; None: none yet
        self.scored: dict[str, Any] = {}  # a workspace's state -> its ScoreReport

    @property
    def on(self) -> bool:
        return self.cfg.every_steps is not None or self.cfg.every_minutes is not None

    def due(self, step: int, agent_s: float) -> bool:
        every_steps, every_minutes = self.cfg.every_steps, self.cfg.every_minutes
        if every_steps is not None and step % every_steps == 0:
            return True
        return every_minutes is not None and agent_s - (self.last_s or 0.0) >= every_minutes * 60

    def after(self, entry: dict) -> None:
        """After a step's snapshot line: score its workspace if it is its turn."""
        if not self.on:
            return
        step, agent_s = entry["step"], entry.get("agent_s", self.budget.elapsed_s())
        if not self.due(step, agent_s):
            return
        usd = self.budget.usd
        with self.budget.paused():
            if self.last_s is None:  # the curve starts from the starting files: doing nothing
                self.log(0, None, 0.0, 0.0)
            self.last_s = agent_s
            self.log(
                step,
                self.score(snapshots.without(entry, self.task.rules.read_only_globs(self.asset_path))),
                agent_s,
                usd,
            )

    def score(self, entry: dict) -> Any:
        """The step's workspace's ScoreReport (once per distinct workspace); None when the scorer failed."""
        key = snapshots.state_key(entry)
        if key in self.scored:
            return self.scored[key]
        folder = self.folder / f"step-{entry['step']}"
        shutil.rmtree(folder, ignore_errors=True)
        work = snapshots.materialise(self.snapshots_root, entry, self.start_files, folder / "workspace", link=True)
        read_only = self.task.rules.read_only_globs(self.asset_path)
        for rel in entry.get("too_large", {}):  # too large for a snapshot: taken as it is now, the agent waiting
            if (self.work / rel).is_file() and not any(fnmatch.fnmatch(rel, glob) for glob in read_only):
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                workspace.remove(work / rel)  # never written through: it may be a link to the store's object
                shutil.copyfile(self.work / rel, work / rel)
        workspace.collect(work, self.task.rules.submission, folder / "submission")
        try:
            report = score_submission(
                self.task,
                folder / "submission",
                self.asset_path,
                folder / "scoring",
                self.sandbox,
                self.recorder.run_id,
            )
        except ScorerError as e:  # not the agent's doing, and the run's final scoring decides: say so, go on
            log.warning(
                "step %d: scoring the workspace mid-run failed (%s); the step is left off the curve", entry["step"], e
            )
            return None
        finally:  # a copy of the workspace per scoring would fill the disk
            shutil.rmtree(folder / "workspace", ignore_errors=True)
            shutil.rmtree(folder / "submission", ignore_errors=True)
            (folder / "submission").unlink(missing_ok=True)
        (folder / "score_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=float))
        self.scored[key] = report
        return report

    def ended(self, step: int, report: Any, spent: dict) -> None:
        """The run's own final ScoreReport, at its last step (its workspace after the agent ended)."""
        if not self.on:
            return
        if self.last_s is None:
            self.log(0, None, 0.0, 0.0)
        self.log(step, report, spent[Metric.AGENT_TIME_S], spent[Metric.COST_USD])

    def log(self, step: int, report: Any, agent_s: float, usd: float) -> None:
        if step and report is None:
            return
        valid = bool(report and report.valid)
        score = report.score if report is not None and report.score is not None else None
        score = score if score is not None and math.isfinite(score) else None
        metrics = anytime.step_metrics(
            valid, score, self.anchors, self.task.higher_is_better, self.task.setup.normalisation, agent_s, usd
        )
        self.recorder.log_metrics(metrics, step=step)
