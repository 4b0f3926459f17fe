"""NeurIPS 2024 Edge-Device LLM competition, compression track: compress a pretrained
model (microsoft/phi-2 at full scale, a tiny Phi at tiny scale) so it runs within a
memory limit, in FP16/FP32, without quantization, distillation or training.

Scoring: rule checks on the files (a plain transformers model of the base's type;
FP16/FP32 weights only, no quantization config or modules; weights alone within the
limit), then lm-eval accuracy while the evaluation's peak memory is measured and held
to the limit. "No training / no extra data" cannot be proven from the weights: the
report gives the share of parameters that are not (pruned, dropped or shared) base
weights as `weights_changed_share`, for review.

Calibration, at asset build: 0 = the baseline command (magnitude pruning, weight sharing
and layer dropping; at tiny scale its naive sharing of the output head with the input
embedding leaves it at about chance), 100 = the reference command (at tiny scale,
structured MLP pruning that keeps every layer, within a limit the untouched base does not meet; at full
scale, as in the competition, phi-2 in FP16 fits 12 GB, so the reference is the
uncompressed model and doing nothing scores 100).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.config import TaskConfig
from mlrb.scoring import lmeval
from mlrb.task_kit import hub
from mlrb.tasks import model_checks
from mlrb.tasks.base import ScaleSpec, ScoreReport, Task, packaged_task, scale_spec

TEST_TASK = "mlrb_edge_llm_compression_test"
MB = 1e6


@dataclass
class EdgeCompressionScale(ScaleSpec):
    # Peak memory (decimal MB) the model may use while it is evaluated, weights included.
    memory_limit_mb: float = 12_000.0
    # Hugging Face `model_type`s a submission may declare (the base model's).
    model_types: list[str] = field(default_factory=lambda: ["phi"])


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    """Scored with lm-eval, which the scoring process imports while the agent works."""
    code = EdgeLlmCompression(scale_spec(cfg, EdgeCompressionScale))
    return packaged_task(
        cfg,
        code.spec,
        environment,
        module=__name__,
        score=code.score,
        download=code.download,
        imports=lmeval.IMPORTS,
        key=lambda: {"memory_limit_mb": code.spec.memory_limit_mb},
    )


@dataclass(frozen=True)
class EdgeLlmCompression:
    """The task's own code, which its parts call: its scorer and its maker from the hub."""

    spec: EdgeCompressionScale

    def download(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Full scale: the base model from the Hugging Face hub."""
        hub.copy_model(params["base_model"], out_dir / "public" / "base_model")
        return {"base_model": params["base_model"]}

    # ---- scoring ---------------------------------------------------------------
    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        spec, limit = self.spec, self.spec.memory_limit_mb
        problem, facts = model_checks.check_model_folder(submission, spec.model_types)
        problem = problem or model_checks.check_fp16_fp32(submission)
        if problem:
            return ScoreReport.invalid(problem, **facts)
        facts["memory_limit_mb"] = limit
        if facts["weight_bytes"] / MB > limit:
            return ScoreReport.invalid(
                f"the weights alone take {facts['weight_bytes'] / MB:.3f} MB, over the memory limit of {limit:g} MB",
                **facts,
            )
        problem = model_checks.check_loadable(submission)
        if problem:
            return ScoreReport.invalid(problem, **facts)

        meters: list[model_checks.PeakMemory] = []

        def measure(model):
            meters.append(model_checks.PeakMemory(model, spec.eval.device))
            return meters[0]

        result = lmeval.evaluate_spec(
            spec.eval, submission, assets / "hidden" / "test.jsonl", TEST_TASK, around_model=measure
        )
        peak_mb, weights_mb = meters[0].peak_bytes / MB, meters[0].weight_bytes / MB
        metrics = {f"score.{subject}": acc for subject, acc in result["per_subject"].items()}
        metrics.update(peak_memory_mb=peak_mb, weight_memory_mb=weights_mb)
        if meters[0].allocator_peak_bytes is not None:  # on CUDA, for the record (library workspaces included)
            metrics["cuda_allocator_peak_mb"] = meters[0].allocator_peak_bytes / MB
        details = {
            **facts,
            "n": result["n"],
            "lm_eval_version": result["lm_eval_version"],
            "lm_eval": result["raw"],
            "memory_method": model_checks.MEMORY_METHOD,
        }
        details.update(self.training_check(submission, assets, metrics))
        if peak_mb > limit:
            details["accuracy_not_counted"] = result["accuracy"]
            return ScoreReport(
                False,
                f"peak memory {peak_mb:.3f} MB during evaluation exceeds the limit of {limit:g} MB",
                metrics=metrics,
                details=details,
            )
        return ScoreReport(True, "ok", score=result["accuracy"], metrics=metrics, details=details)

    @staticmethod
    def training_check(submission: Path, assets: Path, metrics: dict[str, float]) -> dict[str, Any]:
        """What can be said about the no-training / no-extra-data rule (reported, not enforced)."""
        base = assets / "public" / "base_model"
        note = (
            "Training and extra data cannot be ruled out from the files. No training data is given "
            "and the sandbox has no network. weights_changed_share is the share of parameters "
            "that are not base weights (up to FP16 rounding), pruned base weights or copies of a base layer; "
            "training or distillation raise it, and so do training-free transforms such as low-rank factorisation."
        )
        try:
            comparison = model_checks.compare_to_base(submission, base)
        except Exception as e:  # an unreadable tensor was already rejected; anything else is only a report
            return {"training_check": f"{note} Not measured: {type(e).__name__}: {str(e)[:200]}"}
        metrics.update({f"weights_{key}": value for key, value in comparison.items()})
        return {"training_check": note}
