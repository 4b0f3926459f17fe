"""The typed schema every composed config is checked against, and the checks
that a type alone cannot express (positive budgets, known registry names).

Only omegaconf/hydra are imported here: composing and validating a config must
stay cheap (no torch, no mlflow).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, cast

from omegaconf import MISSING, DictConfig, OmegaConf

from mlrb.core.messages import ConfigError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # the configs ship inside the package


@dataclass
class TaskConfig:
    # The task's name: its folder's, the MLflow experiment's (unless tracking.experiment), the run names' first part.
    name: str = MISSING
    # The competition it comes from, as its page names it.
    title: str = MISSING
    # Which entry of `scales` this run uses ("tiny" runs on a CPU, "full" is the paper's).
    scale: str = "tiny"
    # Folder, relative to the workspace, that the scorer collects.
    submission: str = "submission"
    # Whether the agent's sandbox may reach the network.
    network: bool = False
    # Globs of workspace files the agent must not change (checked before scoring).
    read_only_files: list[str] = field(default_factory=list)
    # scale name -> settings; each task checks its own against a dataclass of its own.
    scales: dict[str, Any] = field(default_factory=dict)
    # Which implementation (mlrb/core/registry.py TASKS); None: the task's name. Folder tasks
    # (task=folder) are named after their folder and implemented by `folder`.
    kind: str | None = None
    # Folder tasks only: the task folder, its layout (mlagentbench, mlrc; None: detected)
    # and whether a higher score is better (MLAgentBench keeps this per task in its code).
    path: str | None = None
    format: str | None = None
    # Whether a higher score is better (folder tasks: MLAgentBench keeps it per task in its code).
    higher_is_better: bool = True
    # pip requirements of the task's own Python environment (mlrb/harness/environments.py), where the
    # agent, the anchors and a folder's scripts run; empty: the harness's libraries, mlrb hidden.
    # A task folder's requirements.txt adds to them.
    requirements: list[str] = field(default_factory=list)


@dataclass
class AgentConfig:
    # The agent's name in run names and reports (its file's name).
    name: str = MISSING
    # Which implementation (mlrb/core/registry.py AGENTS): baseline, llm, command or human.
    kind: str = MISSING
    # The kind's own settings, checked against its options dataclass (see mlrb/agents/).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class BudgetConfig:
    # The budget's name in run names and reports (its file's name).
    name: str = MISSING
    # The agent's wall time in seconds (the clock stands still while the harness scores the workspace
    # mid-run or writes the run's record).
    wall_time_s: float = MISSING
    # Steps the agent may take: each model turn of an LLM agent (kind llm); the baseline's run and a
    # person's session are one step each.
    max_steps: int = MISSING
    # None means no cap (a scripted agent spends no tokens).
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    # The most the agent's model calls may cost, in US dollars, as the metering proxy prices them (None: no cap).
    max_usd: float | None = None
    # The most GPU-hours the agent's sandbox may hold: its GPUs times the wall time from its start (None: no cap).
    max_gpu_hours: float | None = None
    # How long the run's end waits for the agent's model calls still open (each read from the provider to
    # its end, for its usage); a call still open after that is charged what it held, as an estimate.
    open_calls_wait_s: float = 120.0


@dataclass
class SandboxConfig:
    # Which implementation (mlrb/core/registry.py SANDBOXES): bwrap (default), docker, unconfined.
    kind: str = "bwrap"
    # Longest a single command may run before it is killed (the budget may cut it shorter).
    command_timeout_s: float = 1800.0
    # Limits; None takes the task's hardware spec at the chosen scale.
    cpus: float | None = None
    memory_gb: float | None = None
    # The most processes the agent may have at once (a fork bomb stops there).
    pids_limit: int = 512
    # The most its workspace and its state folder may hold on disk, in GiB; past it (or once the disk has
    # less free than the harness keeps), the agent is stopped and what it wrote past the limit removed.
    disk_gb: float = 100.0
    # GPU device ids for the run; None: the run's allocation ($CUDA_VISIBLE_DEVICES),
    # as many as the task asks for. Never all GPUs unless listed.
    gpu_ids: list[str] | None = None
    # The kind's own settings, checked against its options dataclass (see mlrb/sandbox/).
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrackingConfig:
    """Where runs are recorded: the config group `tracking` (sqlite, the default, or server)."""

    # Which store: "sqlite" (this machine's file, or whatever `uri` names) or "server"
    # (an MLflow tracking server; `uri` or $MLFLOW_TRACKING_URI must be its http(s) address).
    kind: str = "sqlite"
    # None: $MLFLOW_TRACKING_URI if set, else an SQLite store inside `dir`.
    uri: str | None = None
    # The folder of the SQLite store (mlflow.db) and its artifacts, when no uri is given.
    dir: str = "mlruns"
    # None: the task's name.
    experiment: str | None = None
    # How long writes to a tracking server are retried (MLflow's HTTP retries, growing
    # pauses) while it does not answer, before the run is an infra error.
    retry_for_s: float = 300.0
    # A SLURM sweep refuses an SQLite store (one file on a shared filesystem loses writes
    # under concurrent jobs) unless this is true.
    allow_sqlite_on_slurm: bool = False

    def named_uri(self) -> str | None:
        """The store's URI: `uri`, else $MLFLOW_TRACKING_URI; None for the SQLite store in `dir`.
        The one place this is worked out."""
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI")


# The longest MLflow's HTTP retries can last (10 retries, pauses of at most 120 s; see tracking.py).
MAX_RETRY_FOR_S = 1080


@dataclass
class ScoringConfig:
    """Scoring the workspace during the run too, for the report's anytime curves (mlrb/harness/step_scoring.py):
    after every `every_steps` steps, or the first step that ends `every_minutes` or more after the
    last scoring (on the agent's clock); null: not by that rule. Off the agent's clock, in the scorer's
    own sandbox; the run's final score is unchanged."""

    # Score the workspace after every this many of the agent's steps (null: not by steps).
    every_steps: int | None = None
    # Or at the first step that ends this many minutes after the last scoring (null: not by time).
    every_minutes: float | None = None


@dataclass
class ComputeConfig:
    """What the hardware a run's agent holds costs (mlrb/core/compute.py): US dollars per GPU-hour and per
    CPU-hour (a CPU core held for an hour); null: not priced (the run still records its hours)."""

    # US dollars per GPU held for an hour by the agent's sandbox (null: not priced).
    price_per_gpu_hour: float | None = None
    # US dollars per CPU core held for an hour (the sandbox's CPU limit; null: not priced).
    price_per_cpu_hour: float | None = None


@dataclass
class ReviewConfig:
    """The review every run gets as it ends (mlrb/review/): the rules always, and a model judge when
    `judge` names a model. The judge reads the run's trajectory by a rubric (mlrb/review/rubric.md) and
    may add findings, never remove one; it calls its model through a metering proxy of its own, under
    its own budget, and what it costs is recorded apart from the agent's cost (review_judge_cost_usd)."""

    # A model that reads each run's trajectory as a judge, after the rules (e.g. claude-sonnet-5, gpt-4o):
    # any model the price table knows for anthropic or openai. null: the rules alone.
    judge: str | None = None
    # The judge's API: anthropic (Messages) or openai (Chat Completions); null: the provider whose
    # price table lists the model.
    judge_provider: str | None = None
    # null: the SDK's own variable ($ANTHROPIC_BASE_URL, $OPENAI_BASE_URL), else the provider's API.
    judge_base_url: str | None = None
    # The environment variable holding the judge's API key; null: the provider's ($ANTHROPIC_API_KEY,
    # $OPENAI_API_KEY). Checked before the run starts; the key itself is never recorded.
    judge_api_key_env: str | None = None
    # The judge's own budget for one run's review, apart from the agent's, in US dollars (null: no cap).
    # The trajectory is cut to what the budget can pay for.
    judge_max_usd: float | None = 1.0
    # The most input tokens the judge may read for one run (null: no cap): the trajectory is cut to fit.
    judge_max_input_tokens: int | None = None
    # The most tokens the judge may write for one run: its answer's cap (null: 4096).
    judge_max_output_tokens: int | None = 4096
    # USD per million tokens, for a model the price table lacks (a server of your own): both, or null
    # for the table's.
    judge_price_input_per_mtok: float | None = None
    judge_price_output_per_mtok: float | None = None
    # The most of the trajectory the judge reads, in characters (about 4 a token); past it, long outputs
    # are cut and then the middle steps left out, and the judge is told what was.
    judge_context_chars: int = 200_000
    # The longest the judge's call may take, in seconds.
    judge_timeout_s: float = 180.0


# What of the step snapshots goes to the tracking store (mlrb/run_files/snapshots.py `recorded`).
SNAPSHOT_RECORDS = ("manifest", "small", "all")


@dataclass
class RecordConfig:
    """What of a run goes to the tracking store beside its record (mlrb/run_files/snapshots.py)."""

    # The step snapshots: "manifest" (each step's list of files and their digests), "small" (and the
    # contents of files up to 8 MiB), "all" (every content, checkpoints too). What is not sent stays in
    # the run folder, named by its digest, where `python -m mlrb.rescore` finds it.
    snapshots: str = "small"


@dataclass
class PathsConfig:
    # Built task assets (models, data) are cached here and shared between runs.
    cache_dir: str = "${oc.env:MLRB_CACHE_DIR,${oc.env:HOME,/tmp}/.cache/mlrb}"


@dataclass
class SweepFacts:
    """What a sweep tells each of its jobs (set by the launcher, not by hand): the sweep's id, its
    parent run in the store, and the varying keys each run's name ends with."""

    # The sweep's id (a hash of its jobs' run keys): the tag mlrb.sweep_id of its runs.
    id: str | None = None
    # The sweep's parent run in the tracking store, under which each job's run is nested.
    parent_run_id: str | None = None
    # The keys the sweep varies besides task, agent, budget and seed: each run's name ends with them.
    name_keys: list[str] = field(default_factory=list)


@dataclass
class MlrbConfig:
    task: TaskConfig = MISSING
    agent: AgentConfig = MISSING
    budget: BudgetConfig = MISSING
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    review: ReviewConfig = field(default_factory=ReviewConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    # The run's seed: the model API's sampling seed where the API takes one, and $MLRB_SEED in the
    # agent's sandbox, which the tasks' baseline and reference commands pass on as --seed.
    seed: int = 0
    # A run begun before with this config whose process ended before it was recorded (a time limit,
    # a pre-emption, SIGKILL) goes on where it was (mlrb/run_files/resume.py); false: start over.
    resume: bool = True
    verbose: bool = False  # libraries' progress bars and warnings on the console too (always in the run's log)
    sweep: SweepFacts = field(default_factory=SweepFacts)


def register_schema() -> None:
    """Make the schema and every task's config (mlrb/core/task_configs.py: `task.yaml` in its folder)
    available to Hydra, and the resolver that names a folder task after its folder
    (mlrb/tasks/folder/task.yaml)."""
    from hydra.core.config_store import ConfigStore

    from mlrb.core import task_configs

    ConfigStore.instance().store(name="mlrb_schema", node=MlrbConfig)
    task_configs.register()
    if not OmegaConf.has_resolver("mlrb.folder_name"):
        OmegaConf.register_new_resolver("mlrb.folder_name", folder_name)


def packaged_task(name: str) -> dict[str, Any]:
    """Task NAME's config (its folder's task.yaml) as a plain dict, composed (its defaults list
    applied, as `python -m mlrb task=NAME` applies it: tasks compose shared values)."""
    from hydra import compose, initialize_config_dir

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose(config_name=f"task/{name}")  # the task's config alone, as its file holds it
    raw = cast(dict[str, Any], OmegaConf.to_container(composed.task))
    raw["scales"] = resolve_scales(raw.get("scales") or {})
    return raw


EXTENDS = "extends"  # a scale's key that names the scale whose values it starts from


def resolve_scales(scales: dict[str, Any]) -> dict[str, Any]:
    """Each scale as a run reads it: one with `extends: OTHER` is OTHER's values (resolved the
    same way) with its own on top, mappings merged key by key and anything else replaced. So a
    scale that differs from another in a few values (a task's `plumbing` from its `tiny`) says
    only those, and an override of the other (task.scales.tiny.max_params=...) reaches it too."""
    resolved: dict[str, Any] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> Any:
        if name in resolved:
            return resolved[name]
        own = scales[name]
        base = own.get(EXTENDS) if isinstance(own, dict) else None
        if base is None:
            resolved[name] = own
            return own
        if base not in scales or base in chain:
            why = (
                f"scale '{base}' extends itself through {' -> '.join(chain)}" if base in chain else f"no scale '{base}'"
            )
            raise ConfigError(
                f"task.scales.{name}.{EXTENDS}: {why}; valid: {', '.join(s for s in scales if s != name)}"
            )
        mine = {key: value for key, value in own.items() if key != EXTENDS}
        resolved[name] = merge_over(resolve(base, (*chain, name)), mine)
        return resolved[name]

    for name in scales:
        resolve(name, ())
    return resolved


def merge_over(base: Any, top: Any) -> Any:
    """TOP over BASE: mappings merged key by key (recursively), anything else replaced by TOP."""
    if not (isinstance(base, dict) and isinstance(top, dict)):
        return top
    return {**base, **{key: merge_over(base.get(key), value) for key, value in top.items()}}


def folder_name(path: Any) -> str:
    """A folder task's name: its folder's name ("house-price" for /tasks/house-price/)."""
    return PurePosixPath(str(path).rstrip("/")).name or str(path)


SEED_OVERRIDE = re.compile(r"seed=(\d+)")  # a job's own seed, as a sweep over seeds gives it


def split_seed(overrides: Sequence[str]) -> tuple[tuple[str, ...], int | None]:
    """A job's overrides less its own `seed=N`, and N (None when it gives none, or more than one)."""
    seeds = [int(found.group(1)) for override in overrides if (found := SEED_OVERRIDE.fullmatch(override))]
    return tuple(o for o in overrides if not SEED_OVERRIDE.fullmatch(o)), seeds[0] if len(seeds) == 1 else None


def names_the_seed(cfg: DictConfig) -> bool:
    """Whether a value of the composed config (Hydra's own aside) is an interpolation that names the seed:
    then setting the seed after composing does not change it as composing with the seed does. Where none
    does, jobs that differ only in their seed are composed once (a composition takes most of a second)."""
    plain = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict | list):
            for item in value.values() if isinstance(value, dict) else value:
                yield from strings(item)

    return any(re.search(r"\$\{[^}]*\bseed\b", text) for text in strings(plain))


def to_typed(cfg: DictConfig) -> MlrbConfig:
    """Resolve, type-check and rule-check a composed config."""
    from omegaconf.errors import OmegaConfBaseException

    plain = {k: v for k, v in cfg.items() if k != "hydra"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(MlrbConfig), plain)
        # Only the chosen scale must be complete (its task checks it); the others may
        # keep values a user fills in when choosing them, so they stay as plain data.
        scales = OmegaConf.to_container(merged.task.scales, resolve=False, throw_on_missing=False)
        merged.task.scales = {}
        typed = cast(MlrbConfig, OmegaConf.to_object(merged))
        typed.task.scales = resolve_scales(cast(dict[str, Any], scales))
    except OmegaConfBaseException as e:
        raise ConfigError(describe_omegaconf_error(e)) from None
    check_rules(typed)
    return typed


def check_submission_path(submission: str) -> None:
    """The folder or file the scorer collects: a relative path inside the workspace."""
    if submission == ".":  # the whole workspace (folder tasks: eval.py scores the work folder)
        return
    parts = PurePosixPath(submission).parts
    if not submission.strip() or PurePosixPath(submission).is_absolute() or ".." in parts or parts in ((), (".",)):
        raise ConfigError(
            f"task.submission must be a path inside the workspace, relative to it (e.g. submission or "
            f"submission.jsonl, or . for the whole workspace), got '{submission}'"
        )


def describe_omegaconf_error(e: Exception, prefix: str = "") -> str:
    key = getattr(e, "full_key", None)
    key = f"{prefix}{key}" if key else key
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "Missing mandatory value" in first and key:
        return f"missing value for '{key}': set it in the config or as {key}=..."
    return f"invalid value for '{key}': {first}" if key else first


def check_positive(key: str, value: Any) -> None:
    """A budget or limit: a finite number above 0 (NaN would compare false with every
    limit and so remove it; infinity is no limit either: leave an optional one null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key} must be positive, got {value}: give a finite number above 0")


def check_price(key: str, value: Any) -> None:
    """A price: a finite number, 0 or more (0: free, say hardware of one's own)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{key} must be a price in US dollars, 0 or more, got {value}: give a finite number or null")


def check_tracking_kind(cfg: TrackingConfig) -> None:
    """tracking=server needs the server's address (http or https)."""
    if cfg.kind not in ("sqlite", "server"):
        raise ConfigError(
            f"tracking.kind must be sqlite or server, got '{cfg.kind}' (choose with tracking=sqlite or tracking=server)"
        )
    uri = cfg.named_uri()
    if cfg.kind == "server" and not (uri or "").startswith(("http://", "https://")):
        got = f"got '{uri}'" if uri else "got none"
        raise ConfigError(
            f"tracking=server needs the MLflow server's address: tracking.uri=http://HOST:PORT ({got}; "
            "`python -m mlrb.tracking serve` starts a server and prints it)"
        )


def check_review(cfg: ReviewConfig) -> None:
    """The review's settings; with a judge, its model: a provider that serves it, a price, and its
    API key in the environment (mlrb/models/judge_model.py), so that a judge that cannot run is
    refused before the run starts, not found at its end."""
    from mlrb.core import registry

    for key in (
        "judge_max_usd",
        "judge_max_input_tokens",
        "judge_max_output_tokens",
        "judge_context_chars",
        "judge_timeout_s",
    ):
        value = getattr(cfg, key)
        if value is not None:
            check_positive(f"review.{key}", value)
    for key in ("judge_price_input_per_mtok", "judge_price_output_per_mtok"):
        value = getattr(cfg, key)
        if value is not None:
            check_price(f"review.{key}", value)
    if cfg.judge is None:
        return
    if not cfg.judge.strip():
        raise ConfigError(
            "review.judge is empty: name a model (e.g. review.judge=claude-sonnet-5), or null for the rules alone"
        )
    registry.load(registry.REVIEW_JUDGE)(cfg)


def check_record(cfg: RecordConfig) -> None:
    if cfg.snapshots not in SNAPSHOT_RECORDS:
        raise ConfigError(f"record.snapshots must be one of {', '.join(SNAPSHOT_RECORDS)}, got '{cfg.snapshots}'")


def check_rules(cfg: MlrbConfig) -> None:
    from mlrb.core import registry

    for key in (
        "wall_time_s",
        "max_steps",
        "max_input_tokens",
        "max_output_tokens",
        "max_usd",
        "max_gpu_hours",
        "open_calls_wait_s",
    ):
        value = getattr(cfg.budget, key)
        if value is not None:
            check_positive(f"budget.{key}", value)
    for key in ("command_timeout_s", "cpus", "memory_gb", "pids_limit", "disk_gb"):
        value = getattr(cfg.sandbox, key)
        if value is not None:
            check_positive(f"sandbox.{key}", value)
    for key in ("every_steps", "every_minutes"):
        value = getattr(cfg.scoring, key)
        if value is not None:
            check_positive(f"scoring.{key}", value)
    for key in ("price_per_gpu_hour", "price_per_cpu_hour"):
        value = getattr(cfg.compute, key)
        if value is not None:
            check_price(f"compute.{key}", value)
    check_positive("tracking.retry_for_s", cfg.tracking.retry_for_s)
    if cfg.tracking.retry_for_s > MAX_RETRY_FOR_S:
        raise ConfigError(
            f"tracking.retry_for_s must be at most {MAX_RETRY_FOR_S} (MLflow's client retries a request "
            f"at most 10 times, 2 minutes apart), got {cfg.tracking.retry_for_s}"
        )
    check_submission_path(cfg.task.submission)
    check_record(cfg.record)
    for key, value in (("paths.cache_dir", cfg.paths.cache_dir), ("tracking.dir", cfg.tracking.dir)):
        if not str(value).strip():
            raise ConfigError(f"{key} is empty: give a folder (e.g. {key}=~/.cache/mlrb)")
    if cfg.tracking.uri is not None and not cfg.tracking.uri.strip():
        raise ConfigError("tracking.uri is empty: give a URI (sqlite:///PATH, http://HOST:PORT) or null")
    check_tracking_kind(cfg.tracking)
    check_review(cfg.review)
    registry.check_choice("agent kind", cfg.agent.kind, registry.AGENTS)
    agent_class = registry.load(registry.AGENTS[cfg.agent.kind])
    agent_class.check_config(cfg.agent)
    registry.check_choice("sandbox kind", cfg.sandbox.kind, registry.SANDBOXES)
    registry.load(registry.SANDBOXES[cfg.sandbox.kind]).parse_options(cfg.sandbox)  # a misspelt option: one line
    task = registry.load_task(cfg.task)  # raises ConfigError on an unknown scale or bad key
    task.builder.check_params(cfg.task.scale)  # a tiny builder's parameters (unknown skills, sub-tasks...)
    if task.setup.check_config is not None:  # say, a folder task's folder has the files its layout needs
        task.setup.check_config()
