"""A task folder in MLAgentBench's or MLRC-Bench's layout as an mlrb task
(`python -m mlrb task=folder task.path=DIR`; the layouts are in layout.py), made of the
parts every task is made of, each the folder's own:

- the builder's one maker (building.py): the folder's `env/` and `scripts/` copied and
  prepared into `public/` (the agent's starting workspace) and `hidden/` (the scorer's),
  built once, content-keyed and cached like the built-in tasks' assets;
- the anchors: the baseline alone (the given `train.py` run as it is; MLRC: `main.py -m
  METHOD -p dev`), run and scored at build even when the config states its score, so a
  baseline that fails or an `eval.py` that raises stops the run before it is recorded, in
  one line naming the file;
- the rules: the config's read-only files and the layout's `scripts/read_only_files.txt`;
- the judge (scoring.py): scripts/eval.py's `get_score` on the workspace; MLRC, on the test
  split of the step with the best dev score (selection.py), after the agent's `main.py` ran
  on it apart, where the hidden files cannot be seen (`submission_command`).

The folder's scripts run in child processes (scripts.py), so the harness never imports a
task's code.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb import environments
from mlrb.config import ConfigError, TaskConfig
from mlrb.scoring.submission_command import SubmissionCommand
from mlrb.tasks.anchors import AnchorFailed, Anchors
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.base import PromptSpec, ScaleSpec, ScoreReport, Task
from mlrb.tasks.builder import AssetBuilder
from mlrb.tasks.folder import building, layout
from mlrb.tasks.folder.scoring import FolderScorer
from mlrb.tasks.folder.scripts import FolderScripts, TaskFolderError, last_line
from mlrb.tasks.judge import Judge

PHASES = ("dev", "test")


@dataclass
class FolderScaleSpec(ScaleSpec):
    description: str = "a task folder in MLAgentBench's or MLRC-Bench's layout"
    time_limit_s: float = 18000.0  # both benchmarks' 5 hours
    # "": the layout's own (MLAgentBench: python train.py; MLRC: python main.py -m METHOD -p dev).
    baseline_command: str = ""
    # MLRC: the method `main.py -m` runs when scoring, and the split the scorer evaluates.
    method: str = "my_method"
    phase: str = "test"
    prepare_timeout_s: float = 3600.0
    prompt: PromptSpec = field(
        default_factory=lambda: PromptSpec(task="", dataset="", dataset_shape="", models="", result="", evaluation="")
    )


class FolderTask(Task):
    scale_class = FolderScaleSpec
    builds_at_preflight = True  # a folder whose prepare.py, baseline or eval.py fails: one line, no run

    def __init__(self, cfg: TaskConfig):
        # The format is settled here, so the scorer (which does not see the folder) gets it resolved.
        folder_format = cfg.format or layout.detect(Path(cfg.path or "").expanduser())
        super().__init__(dataclasses.replace(cfg, format=folder_format))  # named as its folder: runs, reports, cache
        self.folder = Path(cfg.path or "").expanduser().resolve()
        self.format = folder_format
        self.normalisation = "gap" if self.format == "mlrc" else "improvement"
        self.normalised_as = "human_gap" if self.format == "mlrc" else "improvement"
        self.phase_ran = False  # MLRC: in the scorer's process, once the phase ran apart (submission_command)
        if not self.spec.baseline_command:  # the layout's own: the baseline agent runs it, calibration measures it
            mlrc = f"python main.py -m {self.spec.method} -p dev"
            self.spec.baseline_command = "python train.py" if self.format == "mlagentbench" else mlrc

    @classmethod
    def check_config(cls, cfg: TaskConfig) -> None:
        """The folder has what its layout needs (checked when configs are validated)."""
        folder_format = cfg.format
        if folder_format is None and cfg.path and Path(cfg.path).expanduser().is_dir():
            folder_format = layout.detect(Path(cfg.path).expanduser())
        layout.check(cfg.path or "", folder_format or "mlagentbench")

    @classmethod
    def scale_spec(cls, cfg: TaskConfig) -> Any:
        spec = super().scale_spec(cfg)
        if spec.phase not in PHASES:
            raise ConfigError(f"unknown task.scales.{cfg.scale}.phase '{spec.phase}'; valid choices: dev, test")
        return spec

    def with_phase(self, phase: str) -> FolderTask:
        """This task, scored on another split (MLRC: the dev scores that choose the step)."""
        scales = {**self.cfg.scales, self.cfg.scale: {**self.cfg.scales[self.cfg.scale], "phase": phase}}
        task = FolderTask(dataclasses.replace(self.cfg, scales=scales))
        task.environment = self.environment
        return task

    def submission_command(self, submission: Path, assets: Path) -> SubmissionCommand | None:
        """MLRC: the agent's `main.py -m METHOD -p PHASE`, its inputs put in the submission's copy
        first, for the harness to run in a sandbox of its own before the copy is scored
        (mlrb/scoring/runner.py): the agent's code never runs where the hidden files are."""
        if self.format != "mlrc":
            return None
        return self.folder_scorer.phase_command(submission, assets / "hidden")

    def after_submission_command(self) -> FolderTask:
        """This task as the scorer's process makes it once the phase ran apart: its scorer reads
        the phase's outputs and runs none of the agent's code."""
        task = copy.copy(self)
        task.phase_ran = True
        return task

    def requirements(self) -> list[str]:
        """The folder's requirements.txt (at its top, or in scripts/ as MLRC-Bench keeps it), then
        `task.requirements`: the task's own environment, where its code runs with its pins."""
        lines = []
        for path in (self.folder / "requirements.txt", self.folder / "scripts" / "requirements.txt"):
            if path.is_file():
                lines += environments.requirement_lines(path.read_text())
        return list(dict.fromkeys(lines + list(self.cfg.requirements)))

    def workspace_files(self, assets: Path) -> Path:
        return assets / "public"

    def own_instructions(self) -> str | None:
        problem = (self.folder / "scripts" / "research_problem.txt").read_text()
        if self.format == "mlrc":
            problem += (
                f"\n\nImplement your method behind the entry point `python main.py -m METHOD -p dev` and evaluate it "
                f"on the dev split. After your run, the test split (hidden) is scored with "
                f"`python main.py -m {self.spec.method} -p test` on the state of your workspace that scored best "
                f"on dev, with the task's read-only files restored."
            )
        return problem

    # ---- its parts ---------------------------------------------------------------------

    @property
    def scripts(self) -> FolderScripts:
        """How the folder's own scripts run: on the task's Python, in its environment."""
        return FolderScripts(self.folder, self.python, self.environment)

    @property
    def rules(self) -> Rules:
        """The layout's read-only files too, as its scripts/read_only_files.txt lists them."""
        return dataclasses.replace(super().rules, read_only_listed_in="hidden/read_only_files.txt")

    @property
    def builder(self) -> AssetBuilder:
        """One maker, whatever the scale says: the folder's files, copied and prepared."""

        def copy_and_prepare(out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
            return {"format": self.format,
                    **building.copy_and_prepare(self.scripts, out_dir, self.spec.prepare_timeout_s)}  # fmt: skip

        return AssetBuilder(self.name, {"source": "build"}, {"build": copy_and_prepare})

    @property
    def anchors(self) -> Anchors:
        """The baseline alone, measured even when the config states it (that is also the check
        that the folder works), one seed after another: the folder's code may use every core."""
        return dataclasses.replace(super().anchors, commands={"baseline": self.baseline_command()},
                                   always_measured=("baseline",), workers=1)  # fmt: skip

    @property
    def folder_scorer(self) -> FolderScorer:
        spec = self.spec
        return FolderScorer(self.scripts, self.format, spec.method, spec.phase, spec.score_timeout_s, self.anchors,
                            phase_ran=self.phase_ran)  # fmt: skip

    @property
    def judge(self) -> Judge:
        """scripts/eval.py (scoring.py); MLRC-Bench: the test split scored on the step snapshot
        with the best dev score (selection.py), every distinct one scored on dev first."""
        spec = self.spec
        judge = Judge(self.folder_scorer.score, timeout_s=spec.score_timeout_s, device=spec.eval.device)
        if self.format != "mlrc":
            return judge
        from mlrb.tasks.folder import selection

        return dataclasses.replace(judge, snapshot_chooser=functools.partial(selection.best_dev_snapshot, self))

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        return self.judge.score(submission, assets, work_dir)

    # ---- its assets --------------------------------------------------------------------

    def asset_key(self) -> dict[str, Any]:
        return {**super().asset_key(), "format": self.format, "method": self.spec.method,
                "folder": building.folder_digest(self.folder)}  # fmt: skip

    def calibrate(self, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the baseline on the prepared files at `anchor_seeds` seeds and score each: their
        mean is the anchor when the config gives none. A baseline or eval.py that fails here is
        the folder's fault."""
        try:
            return super().calibrate(out_dir, extra)
        except AnchorFailed as e:
            if e.ran:
                raise TaskFolderError(
                    f"{self.folder}/scripts/eval.py could not score the baseline: {e.reason}"
                ) from None
            raise TaskFolderError(
                f"{self.folder}/env: the baseline `{self.baseline_command()}` failed at seed {e.seed}: "
                f"{last_line(e.reason)}"
            ) from None
