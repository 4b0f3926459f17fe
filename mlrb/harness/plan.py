"""A run's plan: its config resolved once, before anything runs, into what the run's stages
need. `make(cfg)` names the run, keys it, loads its task (a frozen value, registry.load_task),
its agent and its sandbox class, and works out its limits, tags and the params and config it records; `run.py`'s
stages take the plan and read nothing else of the config.

The naming functions (`experiment_name`, `run_name`, `run_key`) are light: a sweep uses
them for each of its jobs before it launches any (mlrb/sweep.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrb.core.config import (
    BudgetConfig,
    ComputeConfig,
    MlrbConfig,
    RecordConfig,
    ReviewConfig,
    SandboxConfig,
    ScoringConfig,
    TrackingConfig,
)
from mlrb.sandbox.base import Limits
from mlrb.tasks.handling import is_plumbing

if TYPE_CHECKING:  # imported by `make`, when a run is planned
    from mlrb.agents.base import Agent
    from mlrb.sandbox.base import Sandbox
    from mlrb.tasks.base import Task

# Set by the sweep launchers for their jobs (see mlrb/sweep.py).
# Task keys only folder tasks set: left out of other tasks' identity, so their run keys stay as they were.
FOLDER_TASK_KEYS = ("kind", "path", "format", "higher_is_better")
# Budget keys added later whose null is what runs had before: left out of the identity while null, likewise.
LATER_BUDGET_KEYS = ("max_gpu_hours",)


def experiment_name(cfg: MlrbConfig) -> str:
    return cfg.tracking.experiment or cfg.task.name


def run_name(cfg: MlrbConfig) -> str:
    """task/agent/budget/seed, and the values of whatever else its sweep varies (see run_names)."""
    from mlrb.core import run_names

    return run_names.run_name(cfg)


def identity(cfg: MlrbConfig) -> dict[str, Any]:
    """What makes two runs the same experiment (paths and tracking excluded)."""
    task = {
        key: value
        for key, value in dataclasses.asdict(cfg.task).items()
        if cfg.task.kind or key not in FOLDER_TASK_KEYS
    }
    task["scales"] = {cfg.task.scale: task["scales"][cfg.task.scale]}
    return {
        "task": task,
        "agent": dataclasses.asdict(cfg.agent),
        "budget": {
            key: value
            for key, value in dataclasses.asdict(cfg.budget).items()
            if value is not None or key not in LATER_BUDGET_KEYS
        },
        "sandbox": dataclasses.asdict(cfg.sandbox),
        "seed": cfg.seed,
    }


def run_key(cfg: MlrbConfig) -> str:
    return hashlib.sha256(json.dumps(identity(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunPlan:
    """Everything a run does, decided before it starts."""

    experiment: str  # the MLflow experiment
    name: str  # the run's name (run_name)
    key: str  # what makes two runs the same experiment (run_key), a tag
    seed: int
    task: Task  # configured
    agent: Agent  # configured
    sandbox_class: type[Sandbox]  # (mlrb/sandbox/)
    sandbox: SandboxConfig
    limits: Limits  # the agent's sandbox's: the task's hardware, unless the sandbox config says less
    budget: BudgetConfig
    scoring: ScoringConfig  # scoring the workspace during the run too (off unless asked)
    compute: ComputeConfig  # what the agent's hardware costs an hour
    tracking: TrackingConfig
    cache_dir: Path  # where task assets and environments are built
    submission: str  # the file or folder in the workspace that is scored
    tags: dict[str, Any]  # the run's tags when it opens (its folder and the harness's commit are added then)
    params: dict[str, str]  # the resolved config, flattened, as MLflow params
    config_yaml: str  # the same, as the run's config.yaml artifact
    sweep_id: str | None
    record: RecordConfig  # what goes to the tracking store beside the record
    resume: bool  # go on with this run if it was begun before and never ended (mlrb/run_files/resume.py)
    review: ReviewConfig = dataclasses.field(default_factory=ReviewConfig)  # the review at the run's end: its judge


def make(cfg: MlrbConfig) -> RunPlan:
    """The run's plan; the task's, agent's and sandbox's classes are imported here."""
    from omegaconf import OmegaConf

    from mlrb.core import registry
    from mlrb.core.tags import Tag
    from mlrb.sandbox.base import limits_for
    from mlrb.store import tracking

    task = registry.load_task(cfg.task)
    agent = registry.load(registry.AGENTS[cfg.agent.kind])(cfg.agent)
    sandbox_class = registry.load(registry.SANDBOXES[cfg.sandbox.kind])
    budget, sandbox = (
        task.setup.run_settings(cfg.budget, cfg.sandbox) if task.setup.run_settings else (cfg.budget, cfg.sandbox)
    )
    key = run_key(cfg)
    tags: dict[str, Any] = {
        Tag.TASK: cfg.task.name,
        Tag.AGENT: cfg.agent.name,
        Tag.BUDGET: cfg.budget.name,
        Tag.SEED: cfg.seed,
        Tag.SCALE: cfg.task.scale,
        Tag.SANDBOX: cfg.sandbox.kind,
        Tag.CONFINED: str(sandbox_class.confined).lower(),
        Tag.NETWORK: str(cfg.task.network).lower(),
        Tag.NORMALISED_AS: task.setup.normalised_as,
        Tag.UNENFORCED_RULES: ",".join(task.rules.unenforced),
        Tag.PLUMBING: str(is_plumbing(task)).lower(),
        Tag.RUN_KEY: key,
        **task.judge.tags,
    }
    sweep_id, parent_run_id = cfg.sweep.id, cfg.sweep.parent_run_id
    if sweep_id:  # a job of a sweep (run again, it goes on as the same run: run.run_identity)
        tags[Tag.SWEEP_ID] = sweep_id
    if parent_run_id:
        tags[Tag.PARENT_RUN_ID] = parent_run_id
    resolved = identity(cfg)
    # what the run uses: a task's own settings (a Harbor task's timeout and image) in place of the composed ones
    resolved["budget"], resolved["sandbox"] = dataclasses.asdict(budget), dataclasses.asdict(sandbox)
    resolved["tracking"], resolved["paths"] = tracking.masked(cfg.tracking), dataclasses.asdict(cfg.paths)
    resolved["scoring"] = dataclasses.asdict(cfg.scoring)  # recorded, but not what makes the run (identity)
    resolved["compute"] = dataclasses.asdict(cfg.compute)  # likewise: prices
    resolved["record"] = dataclasses.asdict(cfg.record)  # likewise: what the store gets
    resolved["review"] = dataclasses.asdict(cfg.review)  # likewise: its review (the key's variable, never the key)
    return RunPlan(
        experiment=experiment_name(cfg),
        name=run_name(cfg),
        key=key,
        seed=cfg.seed,
        task=task,
        agent=agent,
        sandbox_class=sandbox_class,
        sandbox=sandbox,
        limits=limits_for(task, sandbox),
        budget=budget,
        scoring=cfg.scoring,
        compute=cfg.compute,
        tracking=cfg.tracking,
        cache_dir=Path(cfg.paths.cache_dir),
        submission=cfg.task.submission,
        tags=tags,
        params=tracking.flatten(resolved),
        config_yaml=OmegaConf.to_yaml(OmegaConf.create(resolved)),
        sweep_id=sweep_id,
        record=cfg.record,
        resume=cfg.resume,
        review=cfg.review,
    )
