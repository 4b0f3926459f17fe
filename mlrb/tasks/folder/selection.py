"""MLRC-Bench's choice of what to score on the hidden test split: of the workspace's
states at each step, the one with the best dev score (read-only files restored)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlrb.core.tags import Tag
from mlrb.run_files import snapshots


def with_phase(cfg: Any, phase: str) -> Any:
    """The folder task's config, scored on another split (MLRC: the dev scores that choose the step)."""
    return dataclasses.replace(cfg, scales={**cfg.scales, cfg.scale: {**cfg.scales[cfg.scale], "phase": phase}})


def best_dev_snapshot(
    task: Any, root: Path, assets: Path, run_dir: Path, score: Callable[[Any, Path, Path], Any]
) -> dict[str, Any] | None:
    """Score each distinct step state on dev with `score(task, folder, work_dir)` (the run's
    scorer, in its sandbox); the best step's entry with the dev scores as metrics and tags, or
    None when no step scored on dev."""
    from mlrb.core.registry import load_task

    dev_task = load_task(with_phase(task.cfg, "dev"), task.environment)
    globs = task.rules.read_only_globs(assets)
    by_state: dict[str, float | None] = {}
    dev_scores: dict[int, float | None] = {}
    best: dict | None = None
    for entry in snapshots.load_steps(root):
        entry = snapshots.without(entry, globs)
        key = snapshots.state_key(entry)
        if key not in by_state:
            scratch = run_dir / "dev" / f"step-{entry['step']}"
            folder = snapshots.materialise(root, entry, task.start.files(assets), scratch / "workspace")
            report = score(dev_task, folder, scratch / "scoring")
            by_state[key] = report.score if report.valid else None
            shutil.rmtree(scratch / "workspace", ignore_errors=True)
        dev = dev_scores[entry["step"]] = by_state[key]
        best_dev = dev_scores[best["step"]] if best is not None else None
        if dev is not None and (best_dev is None or (dev > best_dev if task.higher_is_better else dev < best_dev)):
            best = entry
    if best is None:
        return None
    return {
        "entry": best,
        "metrics": {"best_dev_score": dev_scores[best["step"]], "best_dev_step": float(best["step"])},
        "tags": {Tag.SCORED_STEP: best["step"], Tag.DEV_SCORES: json.dumps(dev_scores)},
    }
