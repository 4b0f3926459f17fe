"""What every task is: its config (a scale spec, data), its starting files and instructions,
and the parts the harness reads: the rules of an attempt (attempt_rules.py), the asset
builder (builder.py), the anchors (anchors.py), the solutions that run an anchor's command
(solutions.py) and the judge, its scorer (judge.py).

A packaged task adds its own fields to `ScaleSpec` and writes its own code: `score` (its
judge's), `build_tiny` (its builder's maker on this machine; by default its assets.py's
`build_tiny_assets`) and `download` (its maker from the hub), where it has them. A task whose
parts differ otherwise gives its own part (a task folder gives all of them). Nothing here
imports torch: configs are checked with these classes.
"""

from __future__ import annotations

import abc
import dataclasses
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING, OmegaConf

from mlrb import registry
from mlrb.config import ConfigError, TaskConfig, describe_omegaconf_error, resolve_scales
from mlrb.scoring.report import ScoreReport  # every task's scorer returns one
from mlrb.tasks import sources
from mlrb.tasks.anchors import ANCHORS, DEFAULT_SEEDS, Anchors
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.builder import AssetBuilder
from mlrb.tasks.judge import Judge
from mlrb.tasks.solutions import Solutions


@dataclass
class HardwareSpec:
    gpus: int = 0
    gpu_type: str | None = None
    cpus: int | None = None
    memory_gb: float | None = None


@dataclass
class PromptSpec:
    """MLRB's prompt fields, rendered by instructions.md."""

    task: str = MISSING
    dataset: str = MISSING
    dataset_shape: str = MISSING
    models: str = MISSING
    result: str = MISSING
    evaluation: str = MISSING
    rules: list[str] = field(default_factory=list)
    additional_info: str = ""


@dataclass
class EvalSpec:
    # lm-eval task names; empty means the task's own held-out set.
    tasks: list[str] = field(default_factory=list)
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    limit: int | None = None


@dataclass
class ScaleSpec:
    description: str = MISSING
    time_limit_s: float = MISSING
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    # How to obtain models and data; task-specific keys besides `source`.
    assets: dict[str, Any] = field(default_factory=dict)
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
    # floor a failed attempt counts as (mlrb/counting.py): state it where doing nothing cannot
    # be measured (no do_nothing_command, or its submission is invalid), say chance accuracy.
    do_nothing_score: float | None = None
    baseline_score: float | None = None
    reference_score: float | None = None
    reference_name: str = ""
    score_timeout_s: float = 1800.0
    # Rules the prompt states that no check enforces (and known shortcuts), id -> why: every run
    # records the ids (tag mlrb.unenforced_rules) and the report marks its score with them.
    unenforced_rules: dict[str, str] = field(default_factory=dict)
    # A scale whose runs check that the harness works (sandboxes, agents, sweeps, records) and
    # measure nothing: its assets build in seconds, its anchors at one seed serve the harness only
    # (the control of a failed scoring), and its runs get no anchors, normalised or counted score.
    plumbing: bool = False
    prompt: PromptSpec = field(default_factory=PromptSpec)


class Task(abc.ABC):
    """A task: its config and its parts. A subclass sets `scale_class` and writes `score`."""

    scale_class: ClassVar[type] = ScaleSpec
    # Bump when the asset builder changes, so caches built by older code are not reused.
    assets_version: ClassVar[int] = 1
    # The assets are built (once) and checked before the run is recorded, so that a broken task
    # is one line (a ConfigError of its builder) and no run: a task folder's own code may fail.
    builds_at_preflight: ClassVar[bool] = False
    # How the normalised score is made: "gap" (MLRC-Bench: the share of the baseline-to-
    # reference gap closed) or "improvement" (MLAgentBench: percent better than the baseline).
    normalisation: str = "gap"
    # What a normalised score means, by name (the run's tag `mlrb.normalised_as`; reports name
    # it when tasks differ): "gap" (0 = baseline, 100 = reference), "improvement" (MLAgentBench)
    # or "human_gap" (MLRC-Bench: 100 = the top human entry).
    normalised_as: str = "gap"

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self.name = cfg.name  # its folder's (mlrb/registry.py), or a folder task's folder's
        self.spec = self.scale_spec(cfg)
        # The task's own Python environment (mlrb/environments.py), set once it is built
        # (assets.ensure_assets); None: the harness's libraries.
        self.environment: Path | None = None

    @classmethod
    def scale_spec(cls, cfg: TaskConfig) -> Any:
        if cfg.scale not in cfg.scales:
            raise ConfigError(
                f"unknown scale '{cfg.scale}' for task {cfg.name}; valid choices: {', '.join(sorted(cfg.scales))}"
            )
        from omegaconf.errors import OmegaConfBaseException

        try:
            own = resolve_scales(cfg.scales)[cfg.scale]  # a scale that extends another: its values too
            node = OmegaConf.merge(OmegaConf.structured(cls.scale_class), own)
            return OmegaConf.to_object(node)
        except OmegaConfBaseException as e:
            raise ConfigError(describe_omegaconf_error(e, prefix=f"task.scales.{cfg.scale}.")) from None

    @classmethod
    def check_assets(cls, cfg: TaskConfig) -> None:
        """The scale's asset params, checked when the config is (before a task is made), so
        that a bad one is one line (ConfigError) before anything is built or recorded: the
        anchors' seeds, and a scale built on this machine (source `build`) by the builder
        module's `check_params(params)`, which raises ValueError naming the bad key and what
        is valid."""
        params = dict(cls.scale_spec(cfg).assets)
        check = f"{cls.builder_module()}:check_params"
        AssetBuilder(cfg.name, params, makers={}, check=check).check_params(cfg.scale)

    # ---- what the harness reads of a task: these, not its config (`cfg`, `spec`) ----------

    @property
    def scale(self) -> str:
        return self.cfg.scale

    @property
    def title(self) -> str:
        return self.cfg.title

    @property
    def hardware(self) -> HardwareSpec:
        return self.spec.hardware

    @property
    def prompt(self) -> PromptSpec:
        return self.spec.prompt

    @property
    def time_limit_s(self) -> float:
        """The competition's own time limit (the prompt states it; the budget sets the run's)."""
        return self.spec.time_limit_s

    @property
    def higher_is_better(self) -> bool:
        return self.cfg.higher_is_better

    def baseline_command(self) -> str:
        """The shell command the scripted baseline agent runs in the workspace."""
        return self.spec.baseline_command

    def scorer_config(self) -> dict[str, Any]:
        """The config the scorer's process makes the task from (mlrb/scoring/worker.py): this
        one, with its own scale only."""
        cfg = dataclasses.asdict(self.cfg)
        cfg["scales"] = {self.scale: cfg["scales"][self.scale]}
        return cfg

    def requirements(self) -> list[str]:
        """The pip requirements of the task's own environment; none: the harness's libraries."""
        return list(self.cfg.requirements)

    @property
    def python(self) -> str:
        """The interpreter the task's own code runs on (its environment's, else the harness's)."""
        return str(self.environment / "bin" / "python") if self.environment else sys.executable

    @property
    def package_dir(self) -> Path:
        import inspect

        return Path(inspect.getfile(type(self))).parent

    def starter_dir(self) -> Path:
        """Files copied into the agent's workspace."""
        return self.package_dir / "starter"

    def workspace_files(self, assets: Path) -> Path:
        """The agent's starting workspace: the starter files (a folder task: its prepared env/)."""
        return self.starter_dir()

    def own_instructions(self) -> str | None:
        """The task's own prompt text instead of MLRB's template fields (None: the template)."""
        return None

    @property
    def plumbing(self) -> bool:
        """Whether this scale only checks the harness's plumbing (ScaleSpec.plumbing)."""
        return bool(self.spec.plumbing)

    def run_anchors(self, assets: Path) -> dict[str, Any]:
        """The anchors a run's score is normalised and counted on: the built ones, or none at a
        plumbing scale, whose runs must never be read as results."""
        return {} if self.plumbing else self.anchors.read(assets)

    @property
    def anchor_seeds(self) -> int:
        """How many seeds (0, 1, ...) each anchor command runs at build: the anchors are their
        means (`assets.anchor_seeds` of the scale, DEFAULT_SEEDS unless set)."""
        return int(self.spec.assets.get("anchor_seeds", DEFAULT_SEEDS))

    # ---- the parts -------------------------------------------------------------------

    @property
    def rules(self) -> Rules:
        """The part that says what is scored, what the agent may not change, whether it may
        reach the network and what nothing enforces (mlrb/tasks/attempt_rules.py)."""
        return Rules(self.cfg.submission, self.cfg.network, tuple(self.cfg.read_only_files),
                     unenforced=dict(self.spec.unenforced_rules))  # fmt: skip

    @property
    def builder(self) -> AssetBuilder:
        """The part that makes the assets (mlrb/tasks/builder.py): `build_tiny` for source
        `build` (models and data made on this machine), `download` for `hub` (fetched through
        the Hugging Face cache), where the task has them."""
        makers = {"build": self.build_tiny, **({"hub": self.download} if hasattr(self, "download") else {})}
        return AssetBuilder(self.name, dict(self.spec.assets), makers, check=f"{self.builder_module()}:check_params")

    @property
    def anchors(self) -> Anchors:
        """The part that measures the anchors at build and reads them back (mlrb/tasks/anchors.py):
        its commands are the solutions measured at build, do_nothing (for the record), baseline
        (0 on the normalised scale) and reference (100), those the scale has."""
        spec = self.spec
        commands = {"do_nothing": spec.do_nothing_command, "baseline": self.baseline_command(),
                    "reference": spec.reference_command}  # fmt: skip
        stated = {f"{anchor}_score": getattr(spec, f"{anchor}_score") for anchor in ANCHORS}
        return Anchors({anchor: command for anchor, command in commands.items() if command}, self.anchor_seeds,
                       stated, higher_is_better=self.higher_is_better, submission=self.rules.submission,
                       task_name=self.name)  # fmt: skip

    def solutions(self, public: Path) -> Solutions:
        """The part that runs a solution's command as the scripted baseline agent does, on the
        assets' `public` folder (mlrb/tasks/solutions.py)."""
        return Solutions(self.workspace_files(Path(public).parent), Path(public), self.environment)

    @property
    def judge(self) -> Judge:
        """The part that scores a submission (mlrb/tasks/judge.py): this task's `score`, its
        time limit and device; a task that evaluates with lm-eval adds lm-eval's imports."""
        return Judge(self.score, timeout_s=self.spec.score_timeout_s, device=self.spec.eval.device)

    # ---- the assets, made and measured by the parts ---------------------------------

    def asset_key(self) -> dict[str, Any]:
        """Everything that determines the built assets (hashed into the cache key); the
        calibration stored with them depends on how models are evaluated and on the anchors."""
        return {
            "task": self.name,
            "version": self.assets_version,
            "assets": self.spec.assets,
            "eval": dataclasses.asdict(self.spec.eval),
            "anchors": self.anchors.commands,
            "anchor_seeds": self.anchor_seeds,
            "sources": sources.digest(self.package_dir),  # the builder's and the scorer's code
            # the anchors run in the task's environment (absent when it has none: keys stay as they were)
            **({"requirements": self.requirements()} if self.requirements() else {}),
        }

    def build_assets(self, out_dir: Path) -> dict[str, Any]:
        """Write `public/` (the agent may read it) and `hidden/` (it never may) into out_dir
        with the builder, then measure the normalisation anchors on them. Returns facts for
        the assets' manifest; a build that fails leaves nothing behind."""
        try:
            facts = self.builder.make(out_dir)
            facts["calibration"] = self.calibrate(out_dir)
            return facts
        except BaseException:
            shutil.rmtree(out_dir, ignore_errors=True)  # nothing half-built is left in the cache
            raise

    def calibrate(self, out_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Measure the anchors on the built assets (hidden/calibration.json), with `extra` scores
        for the record: the anchors part runs each command with the solutions part (in a warm
        interpreter) and scores it with the judge."""
        solutions = self.solutions(out_dir / "public")
        with solutions.warm() as warm:
            return self.anchors.measure(
                out_dir,
                run=lambda command, workspace, seed: solutions.run(command, workspace, seed, warm),
                score=lambda submission, work_dir: self.judge.score(submission, out_dir, work_dir),
                extra=extra,
            )

    # ---- the task's own code, which its parts call ------------------------------------

    @classmethod
    def builder_module(cls) -> str:
        """The module that makes the tiny scale's assets: the task package's assets.py (it
        imports torch only inside its functions)."""
        return f"{cls.__module__.rpartition('.')[0]}.assets"

    def build_tiny(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """The builder's maker for source `build`: `build_tiny_assets(out_dir, params)` of
        `builder_module()` -> the manifest's facts."""
        return registry.load(f"{self.builder_module()}:build_tiny_assets")(out_dir, params)

    @abc.abstractmethod
    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        """Check the submission's validity, then score it against hidden data (the judge's
        `score`: the harness calls it through `judge`)."""
