"""A task folder in Harbor's format (Terminal-Bench's harness) as an mlrb task
(`python -m mlrb task=harbor task.path=DIR`), made of the parts every task is made of:

- the prompt: the folder's `instruction.md`;
- the limits: task.toml's `[agent] timeout_sec` (the run's wall time unless the command line
  names a budget), `[environment]` cpus and memory (the hardware) and `[verifier] timeout_sec`
  (the scorer's time);
- the builder's one maker: `public/` = the Docker build context `environment/` (less its
  Dockerfile: the agent's starting workspace) and `hidden/` = `tests/` and `solution/`, which
  the agent never sees;
- the judge: `tests/test.sh`, run after the agent stopped on a copy of its workspace in a
  fresh sandbox of the run's kind where `/tests` holds the tests and `/logs/verifier` is a
  folder the harness made empty (verifier.py); the reward it writes there is the score. A
  verifier that writes no reward, or one that pytest's own reports do not back, is a scoring
  failure, which the task's own solution settles (mlrb/harness/control.py): the submission's
  fault when the solution scores, else the task's. Tests that run the agent's own code tag its
  runs' rewards as forgeable;
- the baseline: `solution/solve.sh` (agent=baseline runs it; it is the control);
- with sandbox=docker, the image built from `environment/Dockerfile` (run_settings), on
  this machine: nothing is pulled that the Dockerfile does not name.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shlex
import shutil
from pathlib import Path
from typing import Any

from mlrb.core.config import BudgetConfig, ConfigError, SandboxConfig, TaskConfig
from mlrb.core.tags import Tag
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.base import (
    HardwareSpec,
    PromptSpec,
    ScaleSpec,
    Setup,
    Task,
    TaskStep,
    anchors,
    scale_spec,
    starting,
)
from mlrb.tasks.builder import AssetBuilder
from mlrb.tasks.folder.building import folder_digest
from mlrb.tasks.harbor import layout, own_settings, verifier
from mlrb.tasks.judge import Judge

log = logging.getLogger(__name__)

# Files of environment/ that build the image and are not the agent's starting files.
BUILD_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore")


@dataclasses.dataclass
class HarborScaleSpec(ScaleSpec):
    description: str = "a task folder in Harbor's format"
    time_limit_s: float = 0.0  # 0: task.toml's [agent] timeout_sec
    baseline_command: str = ""  # "": solution/solve.sh
    score_timeout_s: float = 0.0  # 0: task.toml's [verifier] timeout_sec
    # The Dockerfile's last WORKDIR (read from the folder): where the verifier also sees the workspace.
    workdir: str = ""
    # task.toml's [verifier] env (read from the folder): test.sh's own variables.
    verifier_env: dict[str, str] = dataclasses.field(default_factory=dict)
    # [[steps]] (read from the folder): each step's name, verifier's time and env, and solution.
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # The step this task is (its prompt, verifier and solution); "": the whole task, judged by its last step.
    step: str = ""
    # The prompt is instruction.md (MLRB's template fields are unused).
    prompt: PromptSpec = dataclasses.field(
        default_factory=lambda: PromptSpec(task="", dataset="", dataset_shape="", models="", result="", evaluation="")
    )


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    """The Harbor folder at `cfg.path` as a task. The scorer's process does not see the folder:
    what it needs of it (the verifier's time, the Dockerfile's WORKDIR) is read here only when
    the folder is there, and the config it is handed carries it resolved."""
    folder = Path(cfg.path or "").expanduser().resolve()
    spec = scale_spec(cfg, HarborScaleSpec)
    settings = layout.read_settings(folder) if (folder / layout.TASK_TOML).is_file() else None
    if settings is not None:  # task.toml's values where the config leaves them to it
        # a task of steps: their agent timeouts together, which the run's budget spans
        spec.time_limit_s = (
            spec.time_limit_s
            or sum(step.agent_timeout_s or settings.agent_timeout_s for step in settings.steps)
            or settings.agent_timeout_s
        )
        spec.score_timeout_s = spec.score_timeout_s or settings.verifier_timeout_s
        spec.hardware = HardwareSpec(
            gpus=spec.hardware.gpus or settings.gpus,
            gpu_type=spec.hardware.gpu_type,
            cpus=spec.hardware.cpus if spec.hardware.cpus is not None else settings.cpus,
            memory_gb=spec.hardware.memory_gb if spec.hardware.memory_gb is not None else settings.memory_gb,
        )
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in settings.solution_env.items())
        spec.steps = [step_entry(folder, step, settings, exports) for step in settings.steps]
        if not spec.baseline_command and spec.steps:  # every step's solution in turn (the control of the last)
            spec.baseline_command = "\n".join(f"(\n{entry['baseline_command']}\n) || exit 1" for entry in spec.steps)
        elif not spec.baseline_command and (folder / layout.SOLVE).is_file():  # with [solution] env's variables
            spec.baseline_command = exports + (folder / layout.SOLVE).read_text()
        # resolved into the config, so the scorer's process (which does not see the folder) has them
        # (solve.sh's text escaped: a `${VAR}` of its shell is no interpolation of the config's)
        own = {
            **cfg.scales[cfg.scale],
            "time_limit_s": spec.time_limit_s,
            "score_timeout_s": spec.score_timeout_s,
            "baseline_command": spec.baseline_command.replace("${", "\\${"),
            "workdir": settings.workdir,
            "verifier_env": settings.verifier_env,
            "steps": [
                {**entry, "baseline_command": entry["baseline_command"].replace("${", "\\${")} for entry in spec.steps
            ],
        }
        cfg = dataclasses.replace(cfg, scales={**cfg.scales, cfg.scale: own})
    spec.score_timeout_s = spec.score_timeout_s or 600.0
    workdir = settings.workdir if settings else spec.workdir
    env, tests = dict(settings.verifier_env if settings else spec.verifier_env), "tests"
    if spec.steps:  # judged as its step (the whole task: as its last)
        names = [entry["name"] for entry in spec.steps]
        if spec.step and spec.step not in names:
            raise ConfigError(f"task.scales.{cfg.scale}.step = {spec.step!r}; the task's steps: {', '.join(names)}")
        entry = spec.steps[names.index(spec.step) if spec.step else -1]
        env, tests = dict(entry["verifier_env"]), f"{STEP_FILES}/{entry['name']}/tests"
        spec.score_timeout_s = float(entry["score_timeout_s"])
        if spec.step:
            spec.baseline_command = entry["baseline_command"]
    check = verifier.HarborVerifier(spec.score_timeout_s, layout.workspace_at(workdir), env, tests)
    files = StartingFiles(layout.workspace_at(workdir))
    judge = Judge(
        check.score_unrun,
        timeout_s=spec.score_timeout_s,
        device="cpu",
        submission_command=check.command,
        score_after_command=check.score,
        tags=forgeable_tags(folder) if settings is not None else {},
    )
    return Task(
        cfg=cfg,
        spec=spec,
        rules=Rules(cfg.submission, cfg.network, tuple(cfg.read_only_files), unenforced=dict(spec.unenforced_rules)),
        builder=AssetBuilder(
            cfg.name, {**spec.assets, "source": "build"}, {"build": functools.partial(copy_folder, folder)}
        ),
        anchors=anchors(cfg, spec),
        judge=judge,
        start=starting(
            cfg,
            spec,
            Path(__file__).parent,
            workspace=files.of,
            own_prompt=functools.partial(prompt_of, folder, spec),
        ),
        package_dir=Path(__file__).parent,
        requirements=tuple(cfg.requirements),
        key=lambda: {"folder": folder_digest(folder)},
        environment=environment,
        steps=tuple(
            TaskStep(entry["name"], functools.partial(as_step, cfg, environment, entry["name"]), entry["min_reward"])
            for entry in spec.steps
        )
        if not spec.step
        else (),
        step_reward=settings.reward_strategy if settings and settings.steps else "mean",
        setup=Setup(
            # Harbor's reward: 0 doing nothing (the scale's baseline too), 100 the task's own solution
            normalisation="reward",
            normalised_as="reward",
            check_config=functools.partial(check_folder, cfg.path or "", cfg.network),
            run_settings=functools.partial(run_settings, folder, spec, files, cfg.network),
            workspace_at=files.workdir,
        ),
    )


STEP_FILES = "steps"  # hidden/steps/<name>/: a step's tests (laid over the task's) and its solution


def step_entry(folder: Path, step: Any, settings: layout.Settings, exports: str) -> dict[str, Any]:
    """What the task's config carries of a step, for the scorer's process (which does not see the folder)."""
    solve = folder / STEP_FILES / step.name / layout.SOLVE
    solution = (
        exports + solve.read_text() if solve.is_file() else f"echo 'step {step.name} has no solve.sh' >&2; exit 1"
    )
    return {
        "name": step.name,
        "min_reward": dict(step.min_reward),
        "baseline_command": solution,
        "score_timeout_s": step.verifier_timeout_s or settings.verifier_timeout_s,
        "verifier_env": {**settings.verifier_env, **step.verifier_env},
        "agent_timeout_s": step.agent_timeout_s or settings.agent_timeout_s,
    }


def as_step(cfg: TaskConfig, environment: Path | None, name: str) -> Task:
    """The task as its step NAME: the step's instruction, verifier and solution."""
    own = {**cfg.scales[cfg.scale], "step": name}
    return task(dataclasses.replace(cfg, scales={**cfg.scales, cfg.scale: own}), environment)


def prompt_of(folder: Path, spec: HarborScaleSpec) -> str:
    """instruction.md; a step's: its own, told which step of how many it is."""
    if not spec.steps:
        return (folder / layout.INSTRUCTION).read_text()
    names = [entry["name"] for entry in spec.steps]
    step = spec.step or names[0]  # the whole task's prompt: its first step's
    k = names.index(step) + 1
    return (
        f"This task comes in {len(names)} steps, given to you one at a time in the same environment: what you "
        f"did in the steps before is still there. This is step {k} of {len(names)} ({step}). The budget "
        "below is shared by all the steps.\n\n" + (folder / STEP_FILES / step / layout.INSTRUCTION).read_text()
    )


def forgeable_tags(folder: Path) -> dict[str, str]:
    """The run's tags on its reward: whether the task's tests run the agent's own code, and why."""
    why = verifier.forgeable(folder)
    return {Tag.FORGEABLE_REWARD: str(bool(why)).lower(), Tag.FORGEABLE_REASON: why}


def check_folder(path: str, network: bool) -> None:
    """The folder has what a Harbor task needs, its task.toml reads, and the run's network does not
    contradict it (checked with the config)."""
    folder = layout.check(path)
    own_settings.network_note(layout.read_settings(folder).network_mode, network, folder / layout.TASK_TOML)


def copy_folder(folder: Path, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The builder's one maker: environment/ (less what builds the image) as the agent's starting
    files, tests/ and solution/ hidden."""
    skip = shutil.ignore_patterns("__pycache__", *BUILD_FILES)
    shutil.copytree(folder / "environment", out_dir / "public", symlinks=True, ignore=skip)
    (out_dir / "hidden").mkdir(parents=True)
    for part in ("tests", "solution"):
        if (folder / part).is_dir():
            shutil.copytree(folder / part, out_dir / "hidden" / part, symlinks=True)
    for step in layout.read_settings(folder).steps:  # each step's tests laid over the task's, and its solution
        own, hidden = folder / STEP_FILES / step.name, out_dir / "hidden" / STEP_FILES / step.name
        for part in ("tests", "solution"):
            for source in (folder / part, own / part) if part == "tests" else (own / part,):
                if source.is_dir():
                    shutil.copytree(source, hidden / part, symlinks=True, dirs_exist_ok=True)
    return {"folder": str(folder)}


@dataclasses.dataclass
class StartingFiles:
    """The agent's starting files, where its sandbox shows them (`workdir`: the task's WORKDIR, ""
    for /workspace): environment/ as the assets hold it, or, once the run chose sandbox=docker
    (run_settings), what the task's image holds at its WORKDIR, copied out of it beside the assets."""

    workdir: str
    image: str = ""

    def of(self, assets: Path) -> Path:
        if not (self.image and self.workdir):
            return assets / "public"
        return layout.image_files(self.image, self.workdir, assets.parent / f"{assets.name}{IMAGE_FILES_SUFFIX}")


IMAGE_FILES_SUFFIX = ".image"  # <asset folder>.image/<image id>/files: what the task's image has at its WORKDIR


def run_settings(
    folder: Path,
    spec: HarborScaleSpec,
    starting: StartingFiles,
    network: bool,
    budget: BudgetConfig,
    sandbox: SandboxConfig,
) -> tuple[BudgetConfig, SandboxConfig]:
    """The run's budget and sandbox with the task's own settings: task.toml's agent timeout as the
    wall time unless the command line names a budget; with sandbox=docker, the task's container
    as Harbor makes it (its image, built here from environment/Dockerfile, its WORKDIR's files the
    workspace, its file system writable by its root user, the agent's container kept for the
    verifier); with bwrap, environment/ at the WORKDIR and one warning line naming what of the
    Dockerfile is not reproduced."""
    if spec.time_limit_s and not budget_named_by_user():
        budget = dataclasses.replace(budget, wall_time_s=float(spec.time_limit_s))
    settings = layout.read_settings(folder)
    note = own_settings.network_note(settings.network_mode, network, folder / layout.TASK_TOML)
    if note:
        log.warning("harbor task %s: %s", folder.name, note)
    if sandbox.kind == "docker":
        image = layout.build_image(folder)
        starting.image = image
        user = sandbox.options.get("user", "auto")  # the command line's, else the task's, else root (Harbor's)
        if user == "auto":
            user = layout.numeric_user(image, settings.agent_user) if settings.agent_user else "0:0"
        options = {"image": image, "writable_root": True, "keep_state": True, "user": user}
        sandbox = dataclasses.replace(sandbox, options={**sandbox.options, **options})
    elif sandbox.kind in ("bwrap", "unconfined"):
        if sandbox.kind == "bwrap" and layout.within(starting.workdir, layout.HOST_SYSTEM):
            raise ConfigError(
                f"harbor task {folder.name}: its WORKDIR {starting.workdir} lies in this machine's "
                "system folders, which sandbox=bwrap shows read-only: use sandbox=docker"
            )
        where = (
            f"environment/'s files at {starting.workdir or '/workspace'}"
            if sandbox.kind == "bwrap"
            else "environment/'s files in the run's workspace folder"
        )
        missing = layout.not_reproduced(folder / layout.DOCKERFILE, starting.workdir)
        missing += [f"[agent] user {settings.agent_user}"] if settings.agent_user else []
        lost = f"; not reproduced: {'; '.join(missing)}" if missing else ""
        log.warning(
            "harbor task %s: sandbox=%s does not build environment/Dockerfile: the agent and the verifier "
            "run on this machine's own tools, %s%s (use sandbox=docker for the task's image)",
            folder.name,
            sandbox.kind,
            where,
            lost,
        )
    return budget, sandbox


def budget_named_by_user() -> bool:
    """Whether this run's command line chose a budget (`budget=...` or `budget.KEY=...`)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    except (ImportError, ValueError):
        overrides = []
    return any(o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] == "budget" for o in overrides)
