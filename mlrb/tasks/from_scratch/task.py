"""What MLRB's three train-from-scratch tasks share (BabyLM, MiniPile, Edge-LLM training):
the agent pretrains a language model on the given text only, and is scored with lm-eval
on a hidden suite (BLiMP or SuperGLUE; at tiny scale, local sets in their formats).

Scoring, in order, each failure an invalid submission with its reason:
1. the folder is a plain transformers model of an allowed type, within `max_params`
   (`model_checks.check_model_folder`: no pickles, custom code or links; a tokenizer);
2. where the task says so, FP16/FP32 weights only, no quantization (`model_checks.check_fp16_fp32`);
3. where there is a memory limit, the weights alone fit in it;
4. no pretrained weights: no weight matrix may come from a known public checkpoint
   (`model_checks.check_not_known_checkpoint`; the checkpoints are in the hidden assets);
5. transformers can load it;
6. lm-eval on the hidden suite, measuring peak memory when there is a limit (over it:
   invalid). The score is the unweighted mean over sub-tasks (as BLiMP's own aggregate
   and the SuperGLUE score), each sub-task reported as `score.<name>`.

"Only the given data" cannot be checked from the weights; the report says so.

Calibration at asset build runs three commands the way the baseline agent would and
scores what they leave: `do_nothing_command` (the baseline's model before training, for
the record: a model at chance), `baseline_command` (0) and `reference_command` (100).
"""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core import registry
from mlrb.core.config import TaskConfig
from mlrb.scoring import lmeval
from mlrb.task_kit import hub
from mlrb.tasks import model_checks
from mlrb.tasks.base import ScaleSpec, ScoreReport, Task, builder_module, packaged_task, scale_spec
from mlrb.tasks.solutions import Solutions

MB = 1e6
SUITE_FILE = "suite.json"  # in hidden/: {"group": ..., "subtasks": {name: format}}
CHECKPOINTS_DIR = "known_checkpoints"  # in hidden/: one folder per known public checkpoint
DATA_RULE_NOTE = (
    "Whether only the given data was used cannot be checked from the weights; the sandbox "
    "has no network and holds no other data."
)


@dataclass
class FromScratchScale(ScaleSpec):
    # Hugging Face `model_type`s a submission may declare.
    model_types: list[str] = field(default_factory=lambda: ["gpt2"])
    # Largest parameter count (None: no limit).
    max_params: int | None = None
    # Peak memory (decimal MB) the model may use while evaluated, weights included (None: no limit).
    memory_limit_mb: float | None = None
    # Weights must be FP16 or FP32, without quantization.
    fp16_fp32_only: bool = False
    # Public pretrained checkpoints (hub ids) whose weights a submission must not contain.
    known_checkpoints: list[str] = field(default_factory=list)
    # |cosine similarity| from which a weight matrix counts as taken from a checkpoint.
    copy_similarity: float = 0.5


def checkpoint_dir(assets: Path, name: str) -> Path:
    return assets / "hidden" / CHECKPOINTS_DIR / hub.folder_name(name)


def from_scratch_task(cfg: TaskConfig, environment: Path | None, module: str, suite_group: str) -> Task:
    """The task of `module` (a from-scratch task's task.py), scored on the local suite of the
    lm-eval group `suite_group` (at tiny scale) with lm-eval, which the scoring process imports
    while the agent works. Its builder module's maker also takes the suite group:
    build_tiny_assets(out_dir, params, suite_group) writes the public data and the hidden suite
    (hidden/suite.json + hidden/suite/<sub-task>.jsonl) and returns manifest facts."""
    starter = Path(importlib.import_module(module).__file__ or "").parent / "starter"
    code = FromScratch(scale_spec(cfg, FromScratchScale), module, suite_group, starter, environment, cfg.submission)
    return packaged_task(
        cfg,
        code.spec,
        environment,
        module=module,
        score=code.score,
        build=code.build_tiny,
        download=code.download,
        imports=lmeval.IMPORTS,
        key=code.key,
    )


@dataclass(frozen=True)
class FromScratch:
    """The from-scratch tasks' own code, which their parts call: the scorer and the makers."""

    spec: FromScratchScale
    module: str  # the task's task.py, beside its assets.py
    suite_group: str  # the lm-eval group name of the local suite
    starter: Path  # the task's starter files, which its known checkpoints' command runs on
    environment: Path | None
    submission: str

    def key(self) -> dict[str, Any]:
        spec = self.spec  # the rules decide which solutions calibration accepts
        return {
            "rules": [
                spec.model_types,
                spec.max_params,
                spec.memory_limit_mb,
                spec.fp16_fp32_only,
                spec.known_checkpoints,
                spec.copy_similarity,
            ]
        }

    # ---- assets ----------------------------------------------------------------
    def build_tiny(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        facts = registry.load(f"{builder_module(self.module)}:build_tiny_assets")(out_dir, params, self.suite_group)
        facts["known_checkpoints"] = self.train_known_checkpoints(out_dir, params)
        return facts

    def download(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Full scale: the task's dataset (each subset and split as public/data/[<subset>/]<split>.jsonl),
        the tokenizer the baseline uses (files only, no weights) and the known public checkpoints
        (hidden, for the pretrained-weights check), from the Hugging Face hub."""
        public = out_dir / "public"
        facts: dict[str, Any] = {"dataset": params["dataset"], "rows": {}}
        for subset in params.get("subsets") or [None]:
            data = hub.load_dataset(params["dataset"], subset)
            for split, rows in data.items():
                path = public / "data" / (subset or "") / f"{split}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                rows.to_json(str(path), lines=True)
                facts["rows"][f"{subset or ''}/{split}".lstrip("/")] = len(rows)
        hub.copy_model(params["tokenizer"], public / "tokenizer", hub.TOKENIZER_FILES)
        for name in self.spec.known_checkpoints:
            hub.copy_model(name, checkpoint_dir(out_dir, name), ["*.json", "*.safetensors", "*.txt", "*.model"])
        facts.update(tokenizer=params["tokenizer"], known_checkpoints=list(self.spec.known_checkpoints))
        return facts

    def train_known_checkpoints(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """Tiny scale's stand-in for public checkpoints such as distilgpt2: a model of the
        baseline's shape, pretrained by `params["checkpoint_command"]` (run like a solution,
        on the public data) and kept where the agent cannot see it."""
        command = params.get("checkpoint_command")
        if not command:
            return {}
        facts = {}
        for name in self.spec.known_checkpoints:
            solutions = Solutions(self.starter, out_dir / "public", self.environment)
            workspace = solutions.run(command, out_dir / "calibration" / "checkpoint")
            target = checkpoint_dir(out_dir, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(workspace / self.submission), target)
            facts[name] = {"path": str(target.relative_to(out_dir)), "command": command}
        shutil.rmtree(out_dir / "calibration", ignore_errors=True)
        return facts

    # ---- scoring ---------------------------------------------------------------
    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        spec = self.spec
        problem, facts = model_checks.check_model_folder(submission, spec.model_types, spec.max_params)
        if not problem and spec.fp16_fp32_only:
            problem = model_checks.check_fp16_fp32(submission)
        if not problem and spec.memory_limit_mb is not None:
            facts["memory_limit_mb"] = spec.memory_limit_mb
            if facts["weight_bytes"] / MB > spec.memory_limit_mb:
                problem = (
                    f"the weights alone take {facts['weight_bytes'] / MB:.3f} MB, over the memory limit of "
                    f"{spec.memory_limit_mb:g} MB"
                )
        if not problem:
            checkpoints = {
                name: checkpoint_dir(assets, name)
                for name in spec.known_checkpoints
                if (checkpoint_dir(assets, name) / "config.json").exists()
            }
            problem, facts["pretrained_check"] = model_checks.check_not_known_checkpoint(
                submission, checkpoints, spec.copy_similarity
            )
        problem = problem or model_checks.check_loadable(submission)
        if problem:
            return ScoreReport.invalid(problem, **facts)

        result, peak = self.evaluate(submission, assets, work_dir)
        subtasks = result["subtasks"]
        if not subtasks:
            raise RuntimeError(f"lm-eval reported no sub-task scores for {result['tasks']}")
        metrics = {f"score.{name}": value for name, value in subtasks.items()}
        details = {
            **facts,
            "lm_eval_tasks": result["tasks"],
            "lm_eval_version": result["lm_eval_version"],
            "lm_eval": result["raw"],
            "data_rule": DATA_RULE_NOTE,
        }
        score = sum(subtasks.values()) / len(subtasks)
        if peak is not None:
            metrics.update(peak_memory_mb=peak.peak_bytes / MB, weight_memory_mb=peak.weight_bytes / MB)
            if peak.allocator_peak_bytes is not None:  # on CUDA, for the record (library workspaces included)
                metrics["cuda_allocator_peak_mb"] = peak.allocator_peak_bytes / MB
            details["memory_method"] = model_checks.MEMORY_METHOD
            if peak.peak_bytes / MB > spec.memory_limit_mb:
                details["score_not_counted"] = score
                reason = (
                    f"peak memory {peak.peak_bytes / MB:.3f} MB during evaluation exceeds the limit of "
                    f"{spec.memory_limit_mb:g} MB"
                )
                return ScoreReport(False, reason, metrics=metrics, details=details)
        return ScoreReport(True, "ok", score=score, metrics=metrics, details=details)

    def evaluate(self, model_dir: Path, assets: Path, work_dir: Path):
        """lm-eval on the scale's tasks, or the hidden local suite when it names none.
        Returns (result with per-sub-task scores, PeakMemory or None)."""
        from mlrb.tasks.from_scratch import suites

        ev: Any = self.spec.eval  # (its tasks are names here; lm-eval takes configs too)
        include = None
        tasks = list(ev.tasks)
        if not tasks:
            suite = json.loads((assets / "hidden" / SUITE_FILE).read_text())
            include = Path(work_dir) / "lm_eval_tasks"
            suites.write_suite(include, suite["group"], assets / "hidden" / "suite", suite["subtasks"])
            tasks = [suite["group"]]
        meters: list[model_checks.PeakMemory] = []

        def measure(model):
            meters.append(model_checks.PeakMemory(model, ev.device))
            return meters[-1]

        around = measure if self.spec.memory_limit_mb is not None else None
        result = lmeval.evaluate(
            model_dir,
            tasks,
            include,
            batch_size=ev.batch_size,
            device=ev.device,
            limit=ev.limit,
            dtype=ev.dtype,
            around_model=around,
        )
        result["tasks"] = tasks
        result["subtasks"] = suites.subtask_scores(result["raw"], tasks[0])
        return result, (meters[-1] if meters else None)
