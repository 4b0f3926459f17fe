"""A task folder's scorer, its judge's `score`, in the run's scoring sandbox: MLAgentBench,
`get_score(workspace)` of scripts/eval.py; MLRC-Bench, `main.py -m METHOD -p PHASE` on the
workspace (the test phase with the hidden test split put in place), then `get_score`, with
MLRC-Bench's own improvement metrics. eval.py runs in a child process (scripts.py).

`main.py` is the agent's code: the harness runs it apart, in a sandbox that cannot see the
hidden files (`phase_command`, run by mlrb/scoring/runner.py), and the scoring sandbox then
only reads what it wrote (`phase_ran`). `score` runs it itself (`run_phase`) for the task's
own baseline only: its anchors, measured when the assets are built."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.core.tags import Metric
from mlrb.run_files import workspace
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.submission_command import SubmissionCommand
from mlrb.tasks.anchors import Anchors
from mlrb.tasks.folder.scripts import FolderScripts, last_line

# Run in a child process: import scripts/eval.py from its folder and print get_score(folder) as JSON.
GET_SCORE = """
import json, sys, importlib.util
scripts, folder = sys.argv[1], sys.argv[2]
sys.path.insert(0, scripts)
try:
    spec = importlib.util.spec_from_file_location("eval", scripts + "/eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(json.dumps({"score": float(module.get_score(folder))}))
except BaseException as e:
    print(json.dumps({"error": type(e).__name__ + ": " + " ".join(str(e).split())[:500]}))
"""


@dataclass(frozen=True)
class FolderScorer:
    scripts: FolderScripts
    format: str  # "mlagentbench" or "mlrc" (layout.FORMATS)
    # MLRC: the method `main.py -m` runs, and the split scored ("dev" or "test").
    method: str
    phase: str
    timeout_s: float
    # For MLRC-Bench's metrics, which are measured from the baseline and the reference.
    anchors: Anchors
    # MLRC: the phase ran apart already (phase_command): only its outputs are scored here.
    phase_ran: bool = False

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        hidden = assets / "hidden"
        if self.format == "mlrc" and not self.phase_ran:
            problem = self.run_phase(submission, hidden)
            if problem:
                return ScoreReport.invalid(problem)
        # This sandbox shows the hidden files: a link the agent (or its method) left must not lead eval.py to them.
        note = removed_note(remove_links_out(submission))
        try:
            proc = self.scripts.run(
                ["-c", GET_SCORE, str(hidden), str(submission.resolve())],
                cwd=hidden,
                home=work_dir,
                timeout_s=self.timeout_s,
            )
        except subprocess.TimeoutExpired:
            return ScoreReport.invalid(f"scripts/eval.py took longer than {self.timeout_s:g} s{note}")
        lines = proc.stdout.strip().splitlines()
        result: dict[str, Any] = (
            json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": last_line(proc.stderr)}
        )
        if "error" in result:
            return ScoreReport.invalid(f"scripts/eval.py get_score raised {result['error']}{note}")
        score = result["score"]
        if not math.isfinite(score):
            return ScoreReport.invalid(f"scripts/eval.py get_score returned {score}{note}")
        where = f"{self.phase} split" if self.format == "mlrc" else "the workspace"
        return ScoreReport(
            valid=True,
            reason=f"scored by scripts/eval.py on {where}{note}",
            score=score,
            metrics=self.benchmark_metrics(score, assets),
        )

    @property
    def shown(self) -> str:
        """The phase's command, as a failure names it."""
        return f"`python main.py -m {self.method} -p {self.phase}`"

    def phase_command(self, folder: Path, hidden: Path) -> SubmissionCommand:
        """MLRC: the phase's inputs put in the folder (a copy of the submission), and the command
        that runs it there, for the harness to run where `hidden` cannot be seen."""
        put_inputs_in_place(folder, hidden, self.phase)
        argv = [self.scripts.python, "main.py", "-m", self.method, "-p", self.phase]
        return SubmissionCommand(argv, self.scripts.env(folder), self.shown, self.timeout_s)

    def run_phase(self, folder: Path, hidden: Path) -> str:
        """MLRC: `main.py -m METHOD -p PHASE` in the folder, in a child process (the task's own
        baseline, at asset build); why it failed, or ""."""
        put_inputs_in_place(folder, hidden, self.phase)
        try:
            proc = self.scripts.run(
                ["main.py", "-m", self.method, "-p", self.phase], cwd=folder, home=folder, timeout_s=self.timeout_s
            )
        except subprocess.TimeoutExpired:
            return f"{self.shown} took longer than {self.timeout_s:g} s"
        return f"{self.shown} exited {proc.returncode}: {last_line(proc.stderr)}" if proc.returncode else ""

    def benchmark_metrics(self, score: float, assets: Path) -> dict[str, float]:
        """MLRC-Bench's own names for the two improvements it reports, in percent."""
        if self.format != "mlrc":
            return {}
        anchors = self.anchors.read(assets)
        baseline, reference = anchors[Metric.BASELINE_SCORE], anchors[Metric.REFERENCE_SCORE]
        direction = 1.0 if self.anchors.higher_is_better else -1.0
        metrics: dict[str, float] = {}
        if baseline:
            metrics["absolute_improvement_to_baseline"] = 100.0 * direction * (score - baseline) / abs(baseline)
        if baseline is not None and reference is not None:
            metrics["relative_improvement_to_human"] = 100.0 * (score - baseline) / (reference - baseline)
        return metrics


def remove_links_out(submission: Path) -> list[str]:
    """Remove every symbolic link in the submission (or the submission itself, if one) that
    leads outside it, a link to a link included; their paths, relative to it."""
    if submission.is_symlink():
        submission.unlink()
        return ["."]
    root = os.path.realpath(submission)
    removed = []
    for folder, subfolders, files in os.walk(submission):  # links to folders are listed, never entered
        for name in subfolders + files:
            link = os.path.join(folder, name)
            target = os.path.realpath(link)
            if os.path.islink(link) and target != root and not target.startswith(root + os.sep):
                os.unlink(link)
                removed.append(os.path.relpath(link, submission))
    return removed


def removed_note(removed: list[str]) -> str:
    if not removed:
        return ""
    return f" (links leading outside the submission were removed before scoring: {', '.join(sorted(removed)[:5])})"


def put_inputs_in_place(folder: Path, hidden: Path, phase: str) -> None:
    """The phase's inputs in the folder (test: the hidden split's `test_data/` over `data/`,
    `test_constants.py` over `constants.py`), and no outputs left over: they are the scorer's
    own. The folder is the agent's, copied, and this runs in the harness: a link the agent
    left on the way is replaced, never written through."""
    if phase == "test":
        if (hidden / "test_data").is_dir():
            for source in sorted((hidden / "test_data").rglob("*")):
                if source.is_file():
                    replace_file(folder, Path("data") / source.relative_to(hidden / "test_data"), source)
        if (hidden / "test_constants.py").is_file():
            replace_file(folder, Path("constants.py"), hidden / "test_constants.py")
    workspace.remove(folder / "output")


def replace_file(folder: Path, relative: Path, source: Path) -> None:
    """`source` copied to folder/relative: whatever is there (a file, a folder, a link), and
    anything but a real folder on the way to it, removed first."""
    target = folder
    for part in relative.parts:
        if target != folder and not (target.is_dir() and not target.is_symlink()):
            workspace.remove(target)
            target.mkdir()
        target = target / part
    workspace.remove(target)
    shutil.copyfile(source, target)
