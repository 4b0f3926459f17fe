"""A task folder's scorer, its judge's `score`, in the run's scoring sandbox: MLAgentBench,
`get_score(workspace)` of scripts/eval.py; MLRC-Bench, `main.py -m METHOD -p PHASE` on the
workspace (the test phase with the hidden test split put in place), then `get_score`, with
MLRC-Bench's own improvement metrics. eval.py runs in a child process (scripts.py)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.scoring.report import ScoreReport
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

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        hidden = assets / "hidden"
        if self.format == "mlrc":
            problem = self.run_phase(submission, hidden)
            if problem:
                return ScoreReport.invalid(problem)
        try:
            proc = self.scripts.run(["-c", GET_SCORE, str(hidden), str(submission.resolve())], cwd=hidden,
                                    home=work_dir, timeout_s=self.timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            return ScoreReport.invalid(f"scripts/eval.py took longer than {self.timeout_s:g} s")
        lines = proc.stdout.strip().splitlines()
        result: dict[str, Any] = (
            json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": last_line(proc.stderr)}
        )
        if "error" in result:
            return ScoreReport.invalid(f"scripts/eval.py get_score raised {result['error']}")
        score = result["score"]
        if not math.isfinite(score):
            return ScoreReport.invalid(f"scripts/eval.py get_score returned {score}")
        where = f"{self.phase} split" if self.format == "mlrc" else "the workspace"
        return ScoreReport(valid=True, reason=f"scored by scripts/eval.py on {where}", score=score,
                           metrics=self.benchmark_metrics(score, assets))  # fmt: skip

    def run_phase(self, folder: Path, hidden: Path) -> str:
        """MLRC: `main.py -m METHOD -p PHASE` in the folder (test: the hidden split put in place
        first); why it failed, or ""."""
        if self.phase == "test":
            if (hidden / "test_data").is_dir():
                shutil.copytree(hidden / "test_data", folder / "data", dirs_exist_ok=True)
            if (hidden / "test_constants.py").is_file():
                shutil.copyfile(hidden / "test_constants.py", folder / "constants.py")
        shutil.rmtree(folder / "output", ignore_errors=True)  # results are the scorer's own, never left over
        shown = f"`python main.py -m {self.method} -p {self.phase}`"
        try:
            proc = self.scripts.run(["main.py", "-m", self.method, "-p", self.phase], cwd=folder, home=folder,
                                    timeout_s=self.timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"{shown} took longer than {self.timeout_s:g} s"
        return f"{shown} exited {proc.returncode}: {last_line(proc.stderr)}" if proc.returncode else ""

    def benchmark_metrics(self, score: float, assets: Path) -> dict[str, float]:
        """MLRC-Bench's own names for the two improvements it reports, in percent."""
        if self.format != "mlrc":
            return {}
        anchors = self.anchors.read(assets)
        baseline, reference = anchors["baseline_score"], anchors["reference_score"]
        direction = 1.0 if self.anchors.higher_is_better else -1.0
        metrics: dict[str, float] = {}
        if baseline:
            metrics["absolute_improvement_to_baseline"] = 100.0 * direction * (score - baseline) / abs(baseline)
        if baseline is not None and reference is not None:
            metrics["relative_improvement_to_human"] = 100.0 * (score - baseline) / (reference - baseline)
        return metrics
