"""NeurIPS 2023 "1 LLM + 1 GPU + 1 Day": fine-tune an approved *base* model (not an
instruction-tuned one) on open data, on one GPU within a day; scored on MMLU.

Scoring: rule checks on the files (a plain transformers model of an allowed type), then
the base-model rule, then lm-eval accuracy. The base-model rule has two parts:

- provenance: `provenance.json` in the submission names the starting model; the name
  must match an approved base model and must not be, or be named like, an
  instruction-tuned model (`model_checks.check_base_model`);
- lineage: where the assets hold the declared base model's weights (and those of
  known instruction-tuned siblings), the submission's weights must derive from the
  declared base (same tensor names and shapes) and lie closer to it than to any
  instruction-tuned sibling (`model_checks.weight_distances`). Fine-tuning the base moves
  the weights in a direction unrelated to the sibling's, so it stays nearer the base;
  submitting the sibling, or fine-tuning it further, does not. Nor may the weights lie
  more than `max_share_toward_instruction_tuned` of the way from the base toward a
  sibling (`model_checks.shares_toward`): a blend base + a * (sibling - base) is nearer the base
  for a < 0.5 but carries the sibling's tuning. Each tensor alone may lie at most
  `max_tensor_share_toward_instruction_tuned` of the way, so the sibling's update cannot be
  copied whole into a few tensors that hold little of it. Where the weights are
  not in the assets (other approved models at full scale) the report says lineage was
  not checked.

Calibration, at asset build: 0 = the baseline command (LoRA r=8 on q/v, one epoch on
the Dolly-format data), 100 = the reference command (a stronger fine-tune; see the
config).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.config import TaskConfig
from mlrb.scoring import lmeval
from mlrb.task_kit import hub
from mlrb.tasks import model_checks
from mlrb.tasks.base import ScaleSpec, ScoreReport, Task, packaged_task, scale_spec

TEST_TASK = "mlrb_llm_efficiency_test"


@dataclass
class LlmEfficiencyScale(ScaleSpec):
    # Hugging Face `model_type`s a submission may declare.
    model_types: list[str] = field(default_factory=lambda: ["llama"])
    # Largest parameter count a submission may have (None: no limit).
    max_params: int | None = None
    # Approved base models: hub ids or fnmatch patterns (say "EleutherAI/pythia-*").
    allowed_base_models: list[str] = field(default_factory=list)
    # Known instruction-tuned models (refused by name, and compared by weights when in the assets).
    instruction_tuned_models: list[str] = field(default_factory=list)
    # Largest share of the way from the base toward a known instruction-tuned model that a
    # submission may lie (`model_checks.shares_toward`): honest fine-tunes stay near 0, a blend
    # base + a * (sibling - base) lies at a.
    max_share_toward_instruction_tuned: float = 0.1
    # The same for each tensor alone (those holding a real part of the sibling's update), so the
    # sibling's update cannot be copied whole into a few tensors that hold little of it (they lie
    # at 1). Honest fine-tunes reach 24-56% in their worst tensor at tiny scale
    # (benchmarks/lineage_shares.json): LoRA on the same kind of data moves some q/v tensors
    # toward the sibling, so the limit sits above them.
    max_tensor_share_toward_instruction_tuned: float = 0.8


def model_dir(assets: Path, name: str) -> Path:
    """Where the assets keep a hub-style model id (org/name -> public/models/org__name)."""
    return assets / "public" / "models" / hub.folder_name(name)


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    """Scored with lm-eval, which the scoring process imports while the agent works; the
    instruction-tuned siblings are scored at build too, for the record."""
    code = LlmEfficiency(scale_spec(cfg, LlmEfficiencyScale))
    made = packaged_task(
        cfg, code.spec, environment, module=__name__, score=code.score, download=code.download, imports=lmeval.IMPORTS
    )
    return dataclasses.replace(made, anchors=dataclasses.replace(made.anchors, for_the_record=code.model_scores))


@dataclass(frozen=True)
class LlmEfficiency:
    """The task's own code, which its parts call: its scorer, its maker from the hub and the
    scores its anchors measure for the record."""

    spec: LlmEfficiencyScale

    def download(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Full scale: the baseline's base model and instruction data from the Hugging Face hub."""
        name = params["base_model"]
        hub.copy_model(name, model_dir(out_dir, name))  # makes public/
        rows = hub.load_dataset(params["dataset"], split="train")
        rows.to_json(str(out_dir / "public" / "instructions.jsonl"), lines=True)
        return {"base_model": name, "dataset": params["dataset"], "instructions": len(rows)}

    def model_scores(self, out_dir: Path) -> dict[str, float]:
        """For the record: the forbidden instruction-tuned siblings' accuracy as they are (the
        base as it is is the do_nothing anchor)."""
        scores = {}
        for name in self.spec.instruction_tuned_models:
            path = model_dir(out_dir, name)
            if (path / "config.json").exists():
                result = lmeval.evaluate_spec(self.spec.eval, path, out_dir / "hidden" / "test.jsonl", TEST_TASK)
                scores[f"model_score.{name}"] = result["accuracy"]
        return scores

    # ---- scoring ---------------------------------------------------------------
    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        spec = self.spec
        problem, facts = model_checks.check_model_folder(submission, spec.model_types, spec.max_params)
        if problem:
            return ScoreReport.invalid(problem, **facts)
        declared = read_provenance(submission)
        facts["base_model"] = declared
        problem = model_checks.check_base_model(declared, spec.allowed_base_models, spec.instruction_tuned_models)
        if problem:
            return ScoreReport.invalid(problem, **facts)
        assert declared is not None  # check_base_model refuses a missing one
        problem, lineage = self.check_lineage(submission, assets, declared)
        facts["lineage"] = lineage
        problem = problem or model_checks.check_loadable(submission)
        if problem:
            return ScoreReport.invalid(problem, **facts)

        result = lmeval.evaluate_spec(spec.eval, submission, assets / "hidden" / "test.jsonl", TEST_TASK)
        metrics = {f"score.{subject}": acc for subject, acc in result["per_subject"].items()}
        if lineage.get("distances", {}).get(declared) is not None:
            metrics["weight_distance_to_base"] = lineage["distances"][declared]
        for name, share in lineage.get("share_toward", {}).items():
            if share is not None:
                metrics[f"weight_share_toward.{name}"] = share
        for name, (_, tensor_share) in lineage.get("worst_tensor_toward", {}).items():
            metrics[f"weight_max_tensor_share_toward.{name}"] = tensor_share
        details = {**facts, "n": result["n"], "lm_eval_version": result["lm_eval_version"], "lm_eval": result["raw"]}
        return ScoreReport(True, "ok", score=result["accuracy"], metrics=metrics, details=details)

    def check_lineage(self, submission: Path, assets: Path, declared: str):
        """(problem or "", facts): do the weights derive from the declared base rather than
        from a known instruction-tuned model? Only models whose weights are in the assets count."""
        base_dir = model_dir(assets, declared)
        if not (base_dir / "config.json").exists():
            return "", {"checked": False, "why": f"the weights of {declared} are not in the assets"}
        candidates = {declared: base_dir}
        for name in self.spec.instruction_tuned_models:
            if (model_dir(assets, name) / "config.json").exists():
                candidates[name] = model_dir(assets, name)
        try:
            distances = model_checks.weight_distances(submission, candidates)
        except Exception as e:  # unreadable tensors: the folder check reads headers only
            return f"the weights cannot be compared with {declared}: {type(e).__name__}: {str(e)[:200]}", {}
        facts = {"checked": True, "distances": distances}
        base = distances[declared]
        if base is None:
            return f"the weights do not derive from {declared}: their tensor names or shapes differ", facts
        for name, distance in distances.items():
            if name != declared and distance is not None and distance < base:
                return (
                    f"the weights derive from the instruction-tuned {name} (relative distance {distance:.3g}), "
                    f"not from the declared base {declared} ({base:.3g})",
                    facts,
                )
        # Nearer the base is not enough: base + 0.49 * (sibling - base) is nearer the base too.
        # Nor is a small share over all tensors: the sibling's update copied into a few tensors
        # that hold little of it. So each tensor is judged too.
        limit, tensor_limit = (
            self.spec.max_share_toward_instruction_tuned,
            self.spec.max_tensor_share_toward_instruction_tuned,
        )
        shares: dict[str, float | None] = {}
        worst_tensors: dict[str, list] = {}
        facts["share_toward"], facts["worst_tensor_toward"] = shares, worst_tensors
        for name, path in candidates.items():
            if name == declared or distances[name] is None:
                continue
            measured = model_checks.shares_toward(submission, base_dir, path)
            shares[name] = None if measured is None else measured[0]
            if measured is None:
                continue
            share, per_tensor = measured
            if share > limit:
                return (
                    f"the weights are a blend toward the instruction-tuned {name}: they lie {share:.0%} of the way "
                    f"from {declared} to it (at most {limit:.0%} allowed; fine-tuning the base stays within a few percent)",
                    facts,
                )
            if per_tensor:
                tensor, tensor_share = max(per_tensor.items(), key=lambda item: item[1])
                worst_tensors[name] = [tensor, tensor_share]
                if tensor_share > tensor_limit:
                    return (
                        f"tensor {tensor} carries the instruction-tuned {name}'s update: it lies {tensor_share:.0%} "
                        f"of the way from {declared} to it (each tensor at most {tensor_limit:.0%}; honest fine-tunes "
                        f"stay well below; {share:.1%} over all tensors)",
                        facts,
                    )
        return "", facts


def read_provenance(submission: Path) -> str | None:
    try:
        value = json.loads((submission / "provenance.json").read_text()).get("base_model")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
