"""A task's scorer, as the harness sees it: the part that judges a submission.

The harness reads scoring from here: the scoring process imports `imports` ahead while the
agent works and is given `timeout_s` (mlrb/scoring/runner.py); it calls `score`
(mlrb/scoring/worker.py); an asset build whose `device` is a GPU calibrates in a child
process (mlrb/harness/assets.py); and after the run `choose_snapshot` says which state of the
workspace is scored (None: the final one). The anchors part scores its anchor solutions with
the same `score`.

A packaged task's judge scores with its own scorer (importing lm-eval ahead where it
evaluates with lm-eval: `imports` is a field, set by the task's code); a task folder's runs
its scripts/eval.py and, in MLRC-Bench's layout, runs the agent's main.py apart first
(`submission_command`) and chooses the step with the best dev score. What a submission must be (format, size,
lineage) is checked inside `score`, with the checks of rules.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.scoring.report import ScoreReport
from mlrb.scoring.submission_command import SubmissionCommand

# (submission, assets, work_dir) -> the report: scores the submission at the given path
# against the assets' hidden data, working in the given folder.
Score = Callable[[Path, Path, Path], ScoreReport]
# (task, folder, work_dir) -> the report: the run's own scorer, in the run's sandbox.
ScoreFolder = Callable[[Any, Path, Path], ScoreReport]
# (snapshots_root, assets, run_dir, score_folder) -> {"entry", "metrics", "tags"} or None.
ChooseSnapshot = Callable[[Path, Path, Path, ScoreFolder], dict[str, Any] | None]


@dataclass(frozen=True)
class Judge:
    score: Score
    # Modules the scoring process imports before there is anything to score.
    imports: tuple[str, ...] = ()
    # Seconds scoring may take, counted from the hand-over of the submission.
    timeout_s: float = 1800.0
    # Where models are evaluated ("cpu", "cuda", "cuda:1"), the scale's eval.device.
    device: str = "cpu"
    # After the run, the step snapshot to score instead of the final workspace; None: the final one.
    snapshot_chooser: ChooseSnapshot | None = None
    # A task whose scoring runs the submission's own code (MLRC-Bench's main.py): (the submission's
    # copy, the assets) -> the command the harness runs apart, where the hidden files cannot be
    # seen, before the copy is scored (mlrb/scoring/runner.py); None: none.
    submission_command: Callable[[Path, Path], SubmissionCommand | None] | None = None
    # ...and the scorer the scoring process scores with once that command ran (it reads what the
    # command left and runs none of the agent's code).
    score_after_command: Score | None = None
    # What the run's tags say of this judge, set as the run opens (a Harbor verifier whose tests run
    # the agent's own code: its reward could be forged, mlrb.core.tags.Tag.FORGEABLE_REWARD).
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def after_command(self) -> Judge:
        """This judge as the scoring process has it once the submission's command ran apart."""
        return dataclasses.replace(self, score=self.score_after_command or self.score, submission_command=None)

    def choose_snapshot(
        self, snapshots_root: Path, assets: Path, run_dir: Path, score_folder: ScoreFolder
    ) -> dict[str, Any] | None:
        """The snapshot to score ({"entry": its line, "metrics": {...}, "tags": {...}}), or None
        for the final workspace. `score_folder(task, folder, work_dir)` scores a folder as the
        run's scorer does (its sandbox)."""
        if self.snapshot_chooser is None:
            return None
        return self.snapshot_chooser(snapshots_root, assets, run_dir, score_folder)
