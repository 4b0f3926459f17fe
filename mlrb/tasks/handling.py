"""What mlrb does with a task, beside what its competition defines (base.Task): keys and builds
its assets, reads the anchors a run is normalised on, runs a solution's command, makes the task
again with its parts in its own Python environment, and lists what it needs from the Hugging
Face hub. Each is a function of the task; how mlrb runs it beyond these is the task's `setup`
(base.Setup).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from mlrb.core import registry
from mlrb.task_kit import sources
from mlrb.task_kit.hub import DEFAULT_CONFIG, TOKENIZER_FILES, HubItem, lm_eval_datasets
from mlrb.tasks.base import Task
from mlrb.tasks.solutions import Solutions


def is_plumbing(task: Task) -> bool:
    """Whether the task's scale only checks the harness's plumbing (ScaleSpec.plumbing)."""
    return bool(task.spec.plumbing)


def run_anchors(task: Task, assets: Path) -> dict[str, Any]:
    """The anchors a run's score is normalised and counted on: the built ones, or none at a
    plumbing scale, whose runs must never be read as results."""
    return {} if is_plumbing(task) else task.anchors.read(assets)


def solutions_of(task: Task, public: Path) -> Solutions:
    """The part that runs a solution's command as the scripted baseline agent does, on the
    assets' `public` folder (mlrb/tasks/solutions.py)."""
    return Solutions(task.start.files(Path(public).parent), Path(public), task.environment)


def in_environment(task: Task, environment: Path | None) -> Task:
    """The task with its parts running in `environment` (the loader makes it again)."""
    if environment == task.environment:
        return task
    return registry.load_task(task.cfg, environment)


def asset_key(task: Task) -> dict[str, Any]:
    """Everything that determines the task's built assets (hashed into the cache key); the
    calibration stored with them depends on how models are evaluated and on the anchors."""
    key = {
        "task": task.name,
        "assets": task.spec.assets,
        "eval": dataclasses.asdict(task.spec.eval),
        "anchors": task.anchors.commands,
        "anchor_seeds": task.anchors.seeds,
        "sources": sources.digest(task.package_dir),  # the builder's and the scorer's code
        # the anchors run in the task's environment (absent when it has none: keys stay as they were)
        **({"requirements": list(task.requirements)} if task.requirements else {}),
        **(task.key() if task.key else {}),
    }
    # The calibrations mlrb ships for such assets, one of which a build takes when its seed 0 holds here.
    shipped = task.anchors.shipped(key)
    if not shipped:
        return key
    return {**key, "shipped": hashlib.sha256(json.dumps(shipped, sort_keys=True).encode()).hexdigest()[:16]}


def build_assets(task: Task, out_dir: Path) -> dict[str, Any]:
    """Write `public/` (the agent may read it) and `hidden/` (it never may) into out_dir with
    the task's builder, then measure the normalisation anchors on them. Returns facts for the
    assets' manifest; a build that fails leaves nothing behind."""
    try:
        facts = task.builder.make(out_dir)
        measuring = solutions_of(task, out_dir / "public")
        facts["calibration"] = task.anchors.calibrate(out_dir, measuring, task.judge, key=asset_key(task))
        return facts
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)  # nothing half-built is left in the cache
        raise


def hub_needs(task: Task) -> list[HubItem]:
    """The hub items a task at its scale needs: the models and datasets its assets name
    (`assets.source: hub`) and the datasets of the lm-eval tasks it is scored with."""
    spec = task.spec
    assets = dict(spec.assets)
    if assets.get("source") != "hub":
        return []
    prefix = f"task.scales.{task.scale}"
    items: list[HubItem] = []
    for key in ("base_model",):
        if assets.get(key):
            items.append(HubItem("model", assets[key], why=f"{prefix}.assets.{key}"))
    if assets.get("tokenizer"):
        items.append(
            HubItem("model", assets["tokenizer"], files=tuple(TOKENIZER_FILES), why=f"{prefix}.assets.tokenizer")
        )
    for repo in assets.get("adapters") or []:
        items.append(HubItem("model", repo, why=f"{prefix}.assets.adapters"))
    for repo in getattr(spec, "known_checkpoints", None) or []:
        items.append(HubItem("model", repo, why=f"{prefix}.known_checkpoints"))
    if assets.get("dataset"):
        for subset in assets.get("subsets") or [None]:
            items.append(HubItem("dataset", assets["dataset"], subset, why=f"{prefix}.assets.dataset"))
    for path, configs in lm_eval_datasets(list(spec.eval.tasks)).items():
        for config in configs:
            items.append(
                HubItem(
                    "dataset",
                    path,
                    None if config == DEFAULT_CONFIG else config,
                    why=f"lm-eval {', '.join(spec.eval.tasks)}",
                )
            )
    unique: dict[tuple, HubItem] = {}
    for item in items:
        unique.setdefault((item.kind, item.repo, item.config, item.files), item)
    return list(unique.values())
