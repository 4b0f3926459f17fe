"""A task folder in MLAgentBench's or MLRC-Bench's layout as an mlrb task
(`python -m mlrb task=folder task.path=DIR`; the layouts are in layout.py), made of the
parts every task is made of, each the folder's own:

- the builder's one maker (building.py): the folder's `env/` and `scripts/` copied and
  prepared into `public/` (the agent's starting workspace) and `hidden/` (the scorer's),
  built once, content-keyed and cached like the built-in tasks' assets;
- the anchors: the baseline alone (the given `train.py` run as it is; MLRC: `main.py -m
  METHOD -p dev`), run and scored at build even when the config states its score, so a
  baseline that fails or an `eval.py` that raises stops the run before it is recorded, in
  one line naming the file;
- the rules: the config's read-only files and the layout's `scripts/read_only_files.txt`;
- the judge (scoring.py): scripts/eval.py's `get_score` on the workspace; MLRC, on the test
  split of the step with the best dev score (selection.py), after the agent's `main.py` ran
  on it apart, where the hidden files cannot be seen (the judge's `submission_command`);
- its workspace (the prepared env/) and its prompt (scripts/research_problem.txt).

The folder's scripts run in child processes (scripts.py), so the harness never imports a
task's code.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb.core.config import ConfigError, TaskConfig
from mlrb.tasks.anchors import AnchorFailed
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.base import PromptSpec, ScaleSpec, Setup, Task, anchors, python_of, scale_spec, starting
from mlrb.tasks.builder import AssetBuilder
from mlrb.tasks.folder import building, layout
from mlrb.tasks.folder.scoring import FolderScorer
from mlrb.tasks.folder.scripts import FolderScripts, TaskFolderError, last_line
from mlrb.tasks.judge import Judge

PHASES = ("dev", "test")


@dataclass
class FolderScaleSpec(ScaleSpec):
    description: str = "a task folder in MLAgentBench's or MLRC-Bench's layout"
    time_limit_s: float = 18000.0  # both benchmarks' 5 hours
    # "": the layout's own (MLAgentBench: python train.py; MLRC: python main.py -m METHOD -p dev).
    baseline_command: str = ""
    # MLRC: the method `main.py -m` runs when scoring, and the split the scorer evaluates.
    method: str = "my_method"
    phase: str = "test"
    prepare_timeout_s: float = 3600.0
    prompt: PromptSpec = field(
        default_factory=lambda: PromptSpec(task="", dataset="", dataset_shape="", models="", result="", evaluation="")
    )


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    """The task folder at `cfg.path` as a task, each of its parts the folder's own. Its folder is
    not read here (the scorer's process does not see it), only where a part needs it."""
    # The format is settled here, so the scorer (which does not see the folder) gets it resolved.
    folder_format = cfg.format or layout.detect(Path(cfg.path or "").expanduser())
    cfg = dataclasses.replace(cfg, format=folder_format)  # named as its folder: runs, reports, cache
    folder = Path(cfg.path or "").expanduser().resolve()
    spec = scale_spec(cfg, FolderScaleSpec)
    if spec.phase not in PHASES:
        raise ConfigError(f"unknown task.scales.{cfg.scale}.phase '{spec.phase}'; valid choices: dev, test")
    if not spec.baseline_command:  # the layout's own: the baseline agent runs it, calibration measures it
        dev = f"python main.py -m {spec.method} -p dev"
        spec.baseline_command = "python train.py" if folder_format == "mlagentbench" else dev
    mlrc = folder_format == "mlrc"
    scripts = FolderScripts(folder, python_of(environment), environment)
    # The baseline alone, measured even when the config states it (that is also the check that the
    # folder works), one seed after another: the folder's code may use every core.
    baseline = dataclasses.replace(
        anchors(cfg, spec),
        commands={"baseline": spec.baseline_command},
        always_measured=("baseline",),
        workers=1,
        failed=functools.partial(baseline_failed, folder, spec.baseline_command),
    )
    scorer = FolderScorer(scripts, folder_format, spec.method, spec.phase, spec.score_timeout_s, baseline)
    # scripts/eval.py (scoring.py); MLRC-Bench: the agent's main.py run apart first, then the test
    # split scored on the step snapshot with the best dev score (selection.py).
    judge = Judge(scorer.score, timeout_s=spec.score_timeout_s, device=spec.eval.device)
    if mlrc:
        judge = dataclasses.replace(
            judge,
            submission_command=lambda copy, assets: scorer.phase_command(copy, assets / "hidden"),
            score_after_command=dataclasses.replace(scorer, phase_ran=True).score,
        )

    def copy_and_prepare(out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """The builder's one maker, whatever the scale says: the folder's files, copied and prepared."""
        return {"format": folder_format, **building.copy_and_prepare(scripts, out_dir, spec.prepare_timeout_s)}

    made = Task(
        cfg=cfg,
        spec=spec,
        # The layout's read-only files too, as its scripts/read_only_files.txt lists them.
        rules=Rules(
            cfg.submission,
            cfg.network,
            tuple(cfg.read_only_files),
            "hidden/read_only_files.txt",
            unenforced=dict(spec.unenforced_rules),
        ),
        builder=AssetBuilder(cfg.name, {**spec.assets, "source": "build"}, {"build": copy_and_prepare}),
        anchors=baseline,
        judge=judge,
        start=starting(
            cfg,
            spec,
            Path(__file__).parent,
            workspace=lambda assets: assets / "public",  # the prepared env/
            own_prompt=functools.partial(research_problem, folder, folder_format, spec.method),
        ),
        package_dir=Path(__file__).parent,
        requirements=requirements(folder, cfg),
        key=lambda: {"format": folder_format, "method": spec.method, "folder": building.folder_digest(folder)},
        environment=environment,
        setup=Setup(
            normalisation="gap" if mlrc else "improvement",
            normalised_as="human_gap" if mlrc else "improvement",
            builds_at_preflight=True,  # a folder whose prepare.py, baseline or eval.py fails: one line, no run
            check_config=functools.partial(check_folder, cfg),
        ),
    )
    if not mlrc:
        return made
    from mlrb.tasks.folder import selection

    return dataclasses.replace(
        made, judge=dataclasses.replace(judge, snapshot_chooser=functools.partial(selection.best_dev_snapshot, made))
    )


def check_folder(cfg: TaskConfig) -> None:
    """The folder has what its layout needs (checked when configs are validated)."""
    layout.check(cfg.path or "", cfg.format or "mlagentbench")


def requirements(folder: Path, cfg: TaskConfig) -> tuple[str, ...]:
    """The folder's requirements.txt (at its top, or in scripts/ as MLRC-Bench keeps it), then
    `task.requirements`: the task's own environment, where its code runs with its pins."""
    lines = []
    for path in (folder / "requirements.txt", folder / "scripts" / "requirements.txt"):
        if path.is_file():
            lines += requirement_lines(path.read_text())
    return tuple(dict.fromkeys(lines + list(cfg.requirements)))


def research_problem(folder: Path, folder_format: str, method: str) -> str:
    """The folder's own prompt: scripts/research_problem.txt (MLRC: and how it is scored)."""
    problem = (folder / "scripts" / "research_problem.txt").read_text()
    if folder_format == "mlrc":
        problem += (
            f"\n\nImplement your method behind the entry point `python main.py -m METHOD -p dev` and evaluate it "
            f"on the dev split. After your run, the test split (hidden) is scored with "
            f"`python main.py -m {method} -p test` on the state of your workspace that scored best "
            f"on dev, with the task's read-only files restored."
        )
    return problem


def baseline_failed(folder: Path, command: str, e: AnchorFailed) -> TaskFolderError:
    """A baseline or eval.py that fails at build is the folder's fault: named by its file."""
    if e.ran:
        return TaskFolderError(f"{folder}/scripts/eval.py could not score the baseline: {e.reason}")
    return TaskFolderError(f"{folder}/env: the baseline `{command}` failed at seed {e.seed}: {last_line(e.reason)}")


def requirement_lines(text: str) -> list[str]:
    """A requirements file's requirements: comments and blank lines dropped."""
    lines = (line.split(" #", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
