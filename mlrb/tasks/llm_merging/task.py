"""NeurIPS 2024 LLM Merging: merge expert adapters into one generalist model.

Tiny scale builds its models and data locally (see assets.py); full scale
downloads the competition's models. Both then run the same calibration
(the baseline merge and a stronger reference merge, each scored) and the same
scorer: validity checks on the submitted model, then lm-eval accuracy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.config import TaskConfig
from mlrb.scoring import lmeval
from mlrb.task_kit import hub
from mlrb.task_kit.warm_python import WarmPython, starter_imports
from mlrb.tasks import model_checks
from mlrb.tasks.anchors import anchor_problem
from mlrb.tasks.base import ScaleSpec, ScoreReport, Task, packaged_task, scale_spec
from mlrb.tasks.llm_merging.lineage import check_is_merge

TEST_TASK = "mlrb_llm_merging_test"


@dataclass
class LlmMergingScale(ScaleSpec):
    # Largest parameter count a submission may have.
    max_params: int = 8_000_000_000
    # Hugging Face `model_type`s a submission may declare.
    model_types: list[str] = field(default_factory=lambda: ["llama"])
    # Least |cosine|, in EACH tensor the experts update, between the submission's change of
    # the base (on the entries it changes) and the span of the experts' updates there, for it
    # to count as a merge (see lineage.py: averaging 1, DARE p=0.9 about 0.6, noise 3x 0.32).
    min_merge_cosine: float = 0.5


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    """Scored with lm-eval, which the scoring process imports while the agent works. Its anchors
    have no commands: calibration merges the adapters itself (LlmMerging.calibrate), so the
    assets do not depend on the baseline command, and runs that override it share one build."""
    code = LlmMerging(scale_spec(cfg, LlmMergingScale), cfg.higher_is_better, Path(__file__).parent / "starter")
    made = packaged_task(
        cfg,
        code.spec,
        environment,
        module=__name__,
        score=code.score,
        download=code.download,
        imports=lmeval.IMPORTS,
        key=lambda: given_anchors(code.spec),
    )
    return dataclasses.replace(made, anchors=dataclasses.replace(made.anchors, commands={}, measured_by=code.calibrate))


def given_anchors(spec: LlmMergingScale) -> dict[str, Any]:
    """Both anchors given in the config: nothing is measured, so the assets depend on them."""
    if spec.baseline_score is not None and spec.reference_score is not None:
        return {"given_anchors": [spec.baseline_score, spec.reference_score]}
    return {}


def merge_environment() -> dict[str, str]:
    """This process's environment with its interpreter's folder first on PATH: `python` there is
    this interpreter, which a warm merge must run on."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@dataclass(frozen=True)
class LlmMerging:
    """The task's own code, which its parts call: its scorer, its maker from the hub and its
    calibration (its anchors' own measurement)."""

    spec: LlmMergingScale
    higher_is_better: bool
    starter: Path  # the starter files, whose merge.py calibration runs

    # ---- assets and calibration ------------------------------------------------
    def download(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Full scale: the base model and adapters from the Hugging Face hub."""
        hub.copy_model(params["base_model"], out_dir / "public" / "base_model")
        for repo in params["adapters"]:
            hub.copy_model(repo, out_dir / "public" / "adapters" / hub.folder_name(repo))
        return {"base_model": params["base_model"], "adapters": list(params["adapters"])}

    def calibrate(self, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Anchor the normalised score on the hidden test set.

        0 = the baseline (parameter averaging). 100 = the experts' ceiling: each
        subject answered by the adapter trained on it, i.e. a merge that lost
        nothing; where the experts are not named after the test's subjects (full
        scale), the best single expert, and when that does not beat the baseline
        there is no normalised score (`normalisation_refused` says why). The unmerged
        base model is scored too, for the record (`do_nothing_score`).
        """
        public, hidden = out_dir / "public", out_dir / "hidden"
        scratch = out_dir / "calibration"
        hidden.mkdir(exist_ok=True)
        if self.spec.baseline_score is not None and self.spec.reference_score is not None:
            # Both anchors given in the config (say measured once on a GPU): nothing to measure.
            (hidden / "calibration.json").write_text(json.dumps({"anchors": "from the config"}, indent=2))
            return {"anchors": "from the config"}
        experts = sorted(p.name for p in (public / "adapters").iterdir() if p.is_dir())
        n = len(experts)
        # Doing nothing: the unmerged base submitted as it is.
        scores: dict[str, Any] = {
            **(extra or {}),
            "do_nothing_score": self.evaluate(public / "base_model", out_dir)["accuracy"],
        }
        per_expert = {}
        with self.warm_merges(scratch) as warm:
            baseline = self.evaluate(self.merge(public, scratch / "baseline", [1.0 / n] * n, warm), out_dir)
            scores["baseline_score"] = baseline["accuracy"]
            for i, name in enumerate(experts):
                one_hot = [1.0 if j == i else 0.0 for j in range(n)]
                result = self.evaluate(self.merge(public, scratch / name, one_hot, warm), out_dir)
                per_expert[name] = result
                scores[f"expert_score.{name}"] = result["accuracy"]
        subjects = baseline["per_subject"]
        if set(subjects) <= set(experts):  # experts named after the subjects they know
            counts = self.subject_counts(out_dir)
            total = sum(counts[s] for s in subjects)
            ceiling = sum(per_expert[s]["per_subject"][s] * counts[s] for s in subjects) / total
        else:  # full scale: the best single expert, which may not beat averaging
            ceiling = max(result["accuracy"] for result in per_expert.values())
        scores["reference_score"] = ceiling
        problem = anchor_problem(scores["baseline_score"], ceiling, self.higher_is_better)
        if problem:  # the anchors part then gives no reference: no normalised score
            scores["normalisation_refused"] = problem
        shutil.rmtree(scratch)
        (hidden / "calibration.json").write_text(json.dumps(scores, indent=2))
        return scores

    @contextlib.contextmanager
    def warm_merges(self, scratch: Path) -> Iterator[WarmPython | None]:
        """An interpreter that has done merge.py's imports (warm_python.py), for calibration's
        merges: a fresh `python merge.py` spent most of its 4 CPU s importing torch and
        transformers. None where `python` on the PATH it is given would not be this interpreter."""
        env = merge_environment()
        python = shutil.which("python", path=env["PATH"])
        ours = Path(sys.executable).parent / "python"  # a venv's; not another folder's link to the same binary
        if python != str(ours) or not os.path.samefile(python, sys.executable):
            yield None
            return
        with WarmPython(python, env, starter_imports(self.starter), scratch / "warm") as warm:
            yield warm

    def merge(self, public: Path, out: Path, weights: list[float], warm: WarmPython | None = None) -> Path:
        """Run the starter merge script, as the baseline agent does: `python merge.py ...`, in
        `warm` where given, else in a new interpreter."""
        argv = ["python", str(self.starter / "merge.py"), "--data", str(public), "--output", str(out)]
        argv += ["--weights", *map(str, weights)]
        ran = warm.run(shlex.join(argv), Path.cwd(), merge_environment()) if warm else None
        if ran is None:
            proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True)
            ran = proc.returncode, proc.stderr
        if ran[0] != 0:
            raise RuntimeError(f"merge.py failed with weights {weights}: {ran[1].strip()[-2000:]}")
        return out

    @staticmethod
    def subject_counts(out_dir: Path) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in (out_dir / "hidden" / "test.jsonl").read_text().splitlines():
            subject = json.loads(line)["subject"]
            counts[subject] = counts.get(subject, 0) + 1
        return counts

    # ---- scoring ---------------------------------------------------------------
    def evaluate(self, model_dir: Path, assets: Path) -> dict[str, Any]:
        return lmeval.evaluate_spec(self.spec.eval, model_dir, assets / "hidden" / "test.jsonl", TEST_TASK)

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        problem, facts = self.check_submission(submission)
        if problem:
            return ScoreReport.invalid(problem, **facts)
        problem, facts["merge_check"] = check_is_merge(submission, assets / "public", self.spec.min_merge_cosine)
        if problem:
            return ScoreReport.invalid(problem, **facts)
        result = self.evaluate(submission, assets)
        metrics = {f"score.{subject}": acc for subject, acc in result["per_subject"].items()}
        details = {**facts, "n": result["n"], "lm_eval_version": result["lm_eval_version"], "lm_eval": result["raw"]}
        return ScoreReport(True, "ok", score=result["accuracy"], metrics=metrics, details=details)

    def check_submission(self, submission: Path):
        """The competition's rules that can be checked on the files: (problem or "", facts)."""
        problem, facts = model_checks.check_model_folder(submission, self.spec.model_types, self.spec.max_params)
        return problem or model_checks.check_loadable(submission), facts
