"""What every task is: a frozen value, `Task`, of its config (a scale spec, data) and its
parts: the rules of an attempt (attempt_rules.py), the asset builder (builder.py), the
anchors (anchors.py), the judge, its scorer (judge.py), the agent's starting workspace and
its prompt. The solutions part (solutions.py) runs an anchor's command.

A task folder's task.py has a function `task(cfg, environment) -> Task` (`load_task`, in
mlrb/core/registry.py, the one loader, calls it): a packaged task adds its own fields to
`ScaleSpec` (`scale_spec(cfg, its class)`), writes its own code (its scorer, and its makers
`build` on this machine, by default its assets.py's `build_tiny_assets`, and `hub`) and gives
them to `packaged_task`, which makes the parts it does not give; a task whose parts differ
(a task folder) gives its own. No task subclasses `Task`. Nothing here imports torch: configs
are checked with these values.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from mlrb.core import registry
from mlrb.core.config import ConfigError, TaskConfig, describe_omegaconf_error, resolve_scales
from mlrb.scoring.report import ScoreReport  # noqa: F401 (every task's scorer returns one; tasks take it from here)
from mlrb.tasks.anchors import ANCHORS, DEFAULT_SEEDS, Anchors
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.builder import AssetBuilder, Maker
from mlrb.tasks.judge import Judge, Score


@dataclass
class HardwareSpec:
    # GPUs a run of this scale is given (a SLURM job asks for them; a local sweep gives each job its own).
    gpus: int = 0
    # The GPU the scale assumes (say "A100-40GB"): the prompt names it; nothing enforces it.
    gpu_type: str | None = None
    # CPU cores and memory the sandbox is limited to (None: no limit of the task's; sandbox.cpus and
    # sandbox.memory_gb override them).
    cpus: int | None = None
    # Memory in GB, as cpus: the sandbox's limit unless sandbox.memory_gb says otherwise.
    memory_gb: float | None = None


@dataclass
class PromptSpec:
    """MLRB's prompt fields, rendered by instructions.md."""

    # What the agent is asked to do, in a sentence or two.
    task: str = MISSING
    # The data the agent gets: what it is, and its files' shape.
    dataset: str = MISSING
    dataset_shape: str = MISSING
    # The models the agent starts from.
    models: str = MISSING
    # What the agent must leave, and where (the submission).
    result: str = MISSING
    # How the submission is scored.
    evaluation: str = MISSING
    # The rules the agent must keep, one sentence each.
    rules: list[str] = field(default_factory=list)
    # Anything else the agent should know ("": nothing).
    additional_info: str = ""


@dataclass
class EvalSpec:
    # lm-eval task names; empty means the task's own held-out set.
    tasks: list[str] = field(default_factory=list)
    # The evaluation's batch size, and where and in what precision it runs ("cpu" or "cuda").
    batch_size: int = 8
    # "cpu" or "cuda": where the held-out evaluation runs.
    device: str = "cpu"
    # The precision it runs in: "float32", "bfloat16" or "float16".
    dtype: str = "float32"
    # Examples evaluated per task (None: all): a smaller evaluation, for checks only.
    limit: int | None = None


@dataclass
class ScaleSpec:
    # What this scale is, in a line (shown by the task's page and `--cfg job`).
    description: str = MISSING
    # The competition's time limit for the agent at this scale, in seconds (the budget's wall
    # time is the run's; this is the task's, for the prompt and the paper's setup).
    time_limit_s: float = MISSING
    # What a run of this scale needs: its GPUs, CPU cores and memory.
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    # How to obtain models and data; task-specific keys besides `source`.
    assets: dict[str, Any] = field(default_factory=dict)
    # How the held-out evaluation runs (lm-eval tasks, batch size, device).
    eval: EvalSpec = field(default_factory=EvalSpec)
    # Shell command the scripted baseline agent runs in the workspace.
    baseline_command: str = MISSING
    # Shell command, run like the baseline, whose submission anchors 100 on the normalised
    # scale ("": the task measures its reference another way, or not at all).
    reference_command: str = ""
    # Shell command that submits the starting point unchanged (the untouched base model,
    # an untrained model), scored at asset build for the record: it must score below the
    # baseline or be invalid, else doing nothing would beat the baseline.
    do_nothing_command: str = ""
    # Normalisation anchors; None means measured on the built assets. do_nothing_score is the
    # floor a failed attempt counts as (mlrb/analysis/counting.py): state it where doing nothing cannot
    # be measured (no do_nothing_command, or its submission is invalid), say chance accuracy.
    do_nothing_score: float | None = None
    baseline_score: float | None = None
    reference_score: float | None = None
    # Who or what scored the reference (say "the competition's winner"), for the pages and reports.
    reference_name: str = ""
    # Longest the scorer may take on one submission, in seconds.
    score_timeout_s: float = 1800.0
    # Rules the prompt states that no check enforces (and known shortcuts), id -> why: every run
    # records the ids (tag mlrb.unenforced_rules) and the report marks its score with them.
    unenforced_rules: dict[str, str] = field(default_factory=dict)
    # A scale whose runs check that the harness works (sandboxes, agents, sweeps, records) and
    # measure nothing: its assets build in seconds, its anchors at one seed serve the harness only
    # (the control of a failed scoring), and its runs get no anchors, normalised or counted score.
    plumbing: bool = False
    # The prompt's fields, which instructions.md renders for the agent.
    prompt: PromptSpec = field(default_factory=PromptSpec)


def scale_spec(cfg: TaskConfig, scale_class: type = ScaleSpec) -> Any:
    """The task's scale, checked against its scale class: a ConfigError on an unknown scale or key."""
    if cfg.scale not in cfg.scales:
        raise ConfigError(
            f"unknown scale '{cfg.scale}' for task {cfg.name}; valid choices: {', '.join(sorted(cfg.scales))}"
        )
    from omegaconf.errors import OmegaConfBaseException

    try:
        own = resolve_scales(cfg.scales)[cfg.scale]  # a scale that extends another: its values too
        node = OmegaConf.merge(OmegaConf.structured(scale_class), own)
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise ConfigError(describe_omegaconf_error(e, prefix=f"task.scales.{cfg.scale}.")) from None


@dataclass(frozen=True)
class TaskStep:
    """One step of a task run as several in one environment (a Harbor task's [[steps]]): the
    harness gives the agent the step's task's prompt, then scores what it left with that task's
    judge (mlrb/harness/task_steps.py)."""

    name: str
    # The task as this step: its prompt the step's instruction, its judge the step's verifier, its
    # baseline command the step's own solution.
    task: Callable[[], Task]
    # Reward key -> the least the step's reward may be for the run to go on ({}: no floor).
    min_reward: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Start:
    """The agent's start (a part): what its prompt says and the files it starts from."""

    title: str
    # MLRB's prompt fields, which instructions.md renders for the agent.
    prompt: PromptSpec
    # The competition's own time limit, in seconds: the prompt states it (the budget sets the run's).
    time_limit_s: float
    # The task's starter/ folder, copied into the agent's workspace unless `workspace` says otherwise.
    starter: Path
    # The assets -> the agent's starting files; None: the starter folder.
    workspace: Callable[[Path], Path] | None = None
    # The task's own prompt text instead of MLRB's template fields; None: the template.
    own_prompt: Callable[[], str] | None = None

    def files(self, assets: Path) -> Path:
        """The agent's starting workspace: the starter files (a folder task: its prepared env/)."""
        return self.workspace(assets) if self.workspace else self.starter

    def instructions(self) -> str | None:
        """The task's own prompt text instead of MLRB's template fields (None: the template)."""
        return self.own_prompt() if self.own_prompt else None


def starting(cfg: TaskConfig, spec: Any, package_dir: Path, **own: Any) -> Start:
    """A task's start from its config and scale, with its starter/ folder; `own`: its own
    `workspace` or `own_prompt`."""
    return Start(cfg.title, spec.prompt, spec.time_limit_s, package_dir / "starter", **own)


@dataclass(frozen=True)
class Setup:
    """How mlrb runs a task, beside what its competition defines: set by the kind of task (a task
    folder, a Harbor task), never by a task's own code; a packaged task takes these defaults.
    What mlrb does with a task (builds its assets, reads its anchors for a run...) is in
    handling.py."""

    # How the normalised score is made: "gap" (MLRC-Bench: the share of the baseline-to-
    # reference gap closed), "improvement" (MLAgentBench: percent better than the baseline) or
    # "reward" (Harbor: a gap whose baseline is doing nothing, so a failure counts as nothing).
    normalisation: str = "gap"
    # What a normalised score means, by name (the run's tag `mlrb.normalised_as`; reports name
    # it when tasks differ): "gap" (0 = baseline, 100 = reference), "improvement" (MLAgentBench),
    # "human_gap" (MLRC-Bench: 100 = the top human entry) or "reward" (Harbor's).
    normalised_as: str = "gap"
    # The assets are built (once) and checked before the run is recorded, so that a broken task
    # is one line (a ConfigError of its builder) and no run: a task folder's own code may fail.
    builds_at_preflight: bool = False
    # Checked with the config, after the scale (a folder: it has the files its layout needs).
    check_config: Callable[[], None] | None = None
    # (budget, sandbox) -> the run's own: a task that brings its settings (a Harbor task: its agent
    # timeout as the wall time, its image for sandbox=docker), called once, when the run is planned.
    run_settings: Callable[[Any, Any], tuple[Any, Any]] | None = None
    # Where a confined sandbox shows the agent its workspace ("": /workspace): a Harbor task's WORKDIR,
    # which its instruction names.
    workspace_at: str = ""


@dataclass(frozen=True)
class Task:
    """A task: what its competition defines, its config and its parts, made once by its folder's
    `task(cfg, environment)` (through registry.load_task) and never changed; the harness reads
    these, not its config. How mlrb runs it is its `setup`; what mlrb does with it, handling.py."""

    cfg: TaskConfig  # its name is its folder's (mlrb/core/registry.py), or a folder task's folder's
    spec: Any  # the scale's ScaleSpec (a task's own subclass of it)
    # ---- the parts -------------------------------------------------------------------
    # What is scored, what the agent may not change, whether it may reach the network and what
    # nothing enforces (mlrb/tasks/attempt_rules.py).
    rules: Rules
    # What makes the assets (mlrb/tasks/builder.py): the maker that the scale's `assets.source` names.
    builder: AssetBuilder
    # What measures the anchors at build and reads them back (mlrb/tasks/anchors.py).
    anchors: Anchors
    # What scores a submission (mlrb/tasks/judge.py): its scorer, its process's imports, time limit, device.
    judge: Judge
    # What the agent's prompt says and the files it starts from.
    start: Start
    # The task's code: the package whose code keys its assets (mlrb/task_kit/sources.py).
    package_dir: Path
    # The pip requirements of the task's own Python environment; none: the harness's libraries.
    requirements: tuple[str, ...] = ()
    # What else determines the built assets, beside what every task's key holds (handling.asset_key).
    key: Callable[[], Mapping[str, Any]] | None = None
    # The task's own Python environment (mlrb/harness/environments.py) its parts run in, as the assets'
    # build returned it (assets.prepare); None: the harness's libraries.
    environment: Path | None = None
    # Steps run in turn in the run's one environment, each with its prompt and judge (a Harbor
    # task's [[steps]]); (): the task is one step, this task's prompt and judge.
    steps: tuple[TaskStep, ...] = ()
    # How the steps' rewards make the run's score: "mean" (over the steps scored) or "final".
    step_reward: str = "mean"
    # How mlrb runs it: its normalisation, what is checked before a run, its own run settings.
    setup: Setup = field(default_factory=Setup)

    # ---- what the harness reads of a task: these, not its config (`cfg`, `spec`) ----------

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def scale(self) -> str:
        return self.cfg.scale

    @property
    def hardware(self) -> HardwareSpec:
        return self.spec.hardware

    @property
    def higher_is_better(self) -> bool:
        return self.cfg.higher_is_better

    def baseline_command(self) -> str:
        """The shell command the scripted baseline agent runs in the workspace."""
        return self.spec.baseline_command

    def scorer_config(self) -> dict[str, Any]:
        """The config the scorer's process loads the task from (mlrb/scoring/worker.py): this
        one, with its own scale only."""
        cfg = dataclasses.asdict(self.cfg)
        cfg["scales"] = {self.scale: cfg["scales"][self.scale]}
        return cfg


def python_of(environment: Path | None) -> str:
    """The interpreter of a task's environment, else the harness's."""
    return str(environment / "bin" / "python") if environment else sys.executable


def builder_module(module: str) -> str:
    """The module that makes a packaged task's tiny assets, beside its task.py (`module`): its
    assets.py (it imports torch only inside its functions)."""
    return f"{module.rpartition('.')[0]}.assets"


def packaged_task(
    cfg: TaskConfig,
    spec: Any,
    environment: Path | None,
    *,
    module: str,
    score: Score,
    build: Maker | None = None,
    download: Maker | None = None,
    imports: tuple[str, ...] = (),
    key: Callable[[], Mapping[str, Any]] | None = None,
) -> Task:
    """A packaged task of `module` (its task.py's `__name__`), its parts made from its config and
    its code: `score` (its judge's scorer, whose process imports `imports` ahead), its makers
    `build` (source `build`; by default `build_tiny_assets(out_dir, params)` of its assets.py,
    imported only then) and `download` (source `hub`), and `key`, what else its assets depend on."""
    check = f"{builder_module(module)}:check_params"
    makers = {"build": build or functools.partial(build_tiny, module), **({"hub": download} if download else {})}
    rules = Rules(cfg.submission, cfg.network, tuple(cfg.read_only_files), unenforced=dict(spec.unenforced_rules))
    package_dir = Path(importlib.import_module(module).__file__ or "").parent
    return Task(
        cfg=cfg,
        spec=spec,
        rules=rules,
        builder=AssetBuilder(cfg.name, dict(spec.assets), makers, check=check),
        anchors=anchors(cfg, spec),
        judge=Judge(score, imports=imports, timeout_s=spec.score_timeout_s, device=spec.eval.device),
        start=starting(cfg, spec, package_dir),
        package_dir=package_dir,
        requirements=tuple(cfg.requirements),
        key=key,
        environment=environment,
    )


def build_tiny(module: str, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The builder's default maker for source `build`: `build_tiny_assets(out_dir, params)` of
    the task's assets.py -> the manifest's facts."""
    return registry.load(f"{builder_module(module)}:build_tiny_assets")(out_dir, params)


def anchors(cfg: TaskConfig, spec: Any) -> Anchors:
    """A task's anchors part, from its scale: its commands are the solutions measured at build,
    do_nothing (for the record), baseline (0 on the normalised scale) and reference (100), those
    the scale has, each at `assets.anchor_seeds` seeds (DEFAULT_SEEDS unless set)."""
    commands = {
        "do_nothing": spec.do_nothing_command,
        "baseline": spec.baseline_command,
        "reference": spec.reference_command,
    }
    stated = {f"{anchor}_score": getattr(spec, f"{anchor}_score") for anchor in ANCHORS}
    seeds = spec.assets.get("anchor_seeds", DEFAULT_SEEDS)  # not a number: refused by the builder's check_params
    return Anchors(
        {anchor: command for anchor, command in commands.items() if command},
        seeds if isinstance(seeds, int) else DEFAULT_SEEDS,
        stated,
        higher_is_better=cfg.higher_is_better,
        submission=cfg.submission,
        task_name=cfg.name,
    )
