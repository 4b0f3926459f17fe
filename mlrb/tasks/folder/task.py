"""A task folder in MLAgentBench's or MLRC-Bench's layout as an mlrb task
(`python -m mlrb task=folder task.path=DIR`; the layouts are in layout.py).

Assets (built once, content-keyed and cached like the built-in tasks'): the
folder's `env/` and `scripts/` copied, `scripts/prepare.py` run on the copy, then
`public/` = the prepared env/ (the agent's starting workspace, also at /data) and
`hidden/` = the prepared scripts/ (only the scorer sees it). The baseline (the given
`train.py` run as it is; MLRC: `main.py -m METHOD -p dev`) is run and scored then,
so a baseline that fails or an `eval.py` that raises stops the run before it is
recorded, in one line naming the file; its score is the cached anchor.

Scoring, in the run's scoring sandbox: MLAgentBench, `get_score(workspace)` of
scripts/eval.py; MLRC, `main.py -m METHOD -p test` on the workspace with the hidden
test split put in place, then `get_score`. `eval.py` runs in a child process, so
the harness never imports a task's code.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrb import environments
from mlrb.config import ConfigError, TaskConfig
from mlrb.sandbox.base import sandbox_environment
from mlrb.tasks.anchors import AnchorFailed, Anchors
from mlrb.tasks.attempt_rules import Rules
from mlrb.tasks.base import PromptSpec, ScaleSpec, ScoreReport, Task
from mlrb.tasks.builder import AssetBuilder
from mlrb.tasks.folder import layout
from mlrb.tasks.judge import Judge

PHASES = ("dev", "test")
# Files larger than this enter the folder's content key by size and mtime, not by content.
HASH_LIMIT_BYTES = 64 * 1024 * 1024

# Run in a child process: import scripts/eval.py from its folder and print get_score(folder) as JSON.
GET_SCORE = """
import json, sys, importlib.util
scripts, folder = sys.argv[1], sys.argv[2]
sys.path.insert(0, scripts)
try:
    spec = importlib.util.spec_from_file_location("eval", scripts + "/eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(json.dumps({"score": float(module.get_score(folder))}))
except BaseException as e:
    print(json.dumps({"error": type(e).__name__ + ": " + " ".join(str(e).split())[:500]}))
"""


class TaskFolderError(ConfigError):
    """The task folder itself is broken (its prepare.py, baseline or eval.py fails): found when
    its assets are built, before a run is recorded (`builds_at_preflight`), it is one line."""


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


class FolderTask(Task):
    scale_class = FolderScaleSpec
    builds_at_preflight = True  # a folder whose prepare.py, baseline or eval.py fails: one line, no run

    def __init__(self, cfg: TaskConfig):
        # The format is settled here, so the scorer (which does not see the folder) gets it resolved.
        cfg = dataclasses.replace(cfg, format=cfg.format or layout.detect(Path(cfg.path or "").expanduser()))
        super().__init__(cfg)  # its name is the folder's: experiments, the report and the cache go by it
        self.folder = Path(cfg.path or "").expanduser().resolve()
        self.format = cfg.format
        self.normalisation = "gap" if self.format == "mlrc" else "improvement"
        self.normalised_as = "human_gap" if self.format == "mlrc" else "improvement"
        if not self.spec.baseline_command:  # the layout's own: the baseline agent runs it, calibration measures it
            mlrc = f"python main.py -m {self.spec.method} -p dev"
            self.spec.baseline_command = "python train.py" if self.format == "mlagentbench" else mlrc

    @classmethod
    def check_config(cls, cfg: TaskConfig) -> None:
        """The folder has what its layout needs (checked when configs are validated)."""
        folder_format = cfg.format
        if folder_format is None and cfg.path and Path(cfg.path).expanduser().is_dir():
            folder_format = layout.detect(Path(cfg.path).expanduser())
        layout.check(cfg.path or "", folder_format or "mlagentbench")

    @classmethod
    def scale_spec(cls, cfg: TaskConfig) -> Any:
        spec = super().scale_spec(cfg)
        if spec.phase not in PHASES:
            raise ConfigError(f"unknown task.scales.{cfg.scale}.phase '{spec.phase}'; valid choices: dev, test")
        return spec

    # --- assets -------------------------------------------------------------------------

    def requirements(self) -> list[str]:
        """The folder's requirements.txt (at its top, or in scripts/ as MLRC-Bench keeps it), then
        `task.requirements`: the task's own environment, where its code runs with its pins."""
        lines = []
        for path in (self.folder / "requirements.txt", self.folder / "scripts" / "requirements.txt"):
            if path.is_file():
                lines += environments.requirement_lines(path.read_text())
        return list(dict.fromkeys(lines + list(self.cfg.requirements)))

    def anchor_commands(self) -> dict[str, str]:
        return {"baseline": self.baseline_command()}

    def asset_key(self) -> dict[str, Any]:
        return {**super().asset_key(), "format": self.format, "method": self.spec.method,
                "folder": folder_digest(self.folder)}  # fmt: skip

    @property
    def builder(self) -> AssetBuilder:
        """One maker, whatever the scale says: the folder's files, copied and prepared."""
        return AssetBuilder(self.name, {"source": "build"}, {"build": self.copy_and_prepare})

    def copy_and_prepare(self, out_dir: Path, params: dict[str, Any]) -> dict[str, Any]:
        """env/ and scripts/ copied, scripts/prepare.py run on the copy, then public/ = env/
        and hidden/ = scripts/."""
        stage = out_dir / "folder"
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(self.folder / "env", stage / "env", symlinks=True, ignore=skip)
        shutil.copytree(self.folder / "scripts", stage / "scripts", symlinks=True, ignore=skip)
        if (stage / "scripts" / "prepare.py").is_file():
            self.prepare(stage / "scripts")
        (stage / "env").rename(out_dir / "public")
        (stage / "scripts").rename(out_dir / "hidden")
        stage.rmdir()
        return {"format": self.format, "folder": str(self.folder)}

    def prepare(self, scripts: Path) -> None:
        """scripts/prepare.py, run once from scripts/ (it may write into ../env and into scripts/)."""
        try:
            proc = subprocess.run([self.python, "prepare.py"], cwd=scripts, env=self.child_env(scripts),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=self.spec.prepare_timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise TaskFolderError(
                f"{self.folder}/scripts/prepare.py took longer than {self.spec.prepare_timeout_s:g} s"
            ) from None
        if proc.returncode != 0:
            raise TaskFolderError(
                f"{self.folder}/scripts/prepare.py exited {proc.returncode}: {last_line(proc.stderr)}"
            )

    @property
    def anchors(self) -> Anchors:
        """The baseline alone, measured even when the config states it (that is also the check
        that the folder works), one seed after another: the folder's code may use every core."""
        return dataclasses.replace(super().anchors, always_measured=("baseline",), workers=1)

    def calibrate(self, out_dir: Path) -> dict[str, Any]:
        """Run the baseline on the prepared files at `anchor_seeds` seeds and score each: their
        mean is the anchor when the config gives none. A baseline or eval.py that fails here is
        the folder's fault."""
        try:
            return self.measure_anchors(out_dir)
        except AnchorFailed as e:
            if e.ran:
                raise TaskFolderError(
                    f"{self.folder}/scripts/eval.py could not score the baseline: {e.reason}"
                ) from None
            raise TaskFolderError(
                f"{self.folder}/env: the baseline `{self.baseline_command()}` failed at seed {e.seed}: "
                f"{last_line(e.reason)}"
            ) from None

    @property
    def direction(self) -> float:
        return 1.0 if self.cfg.higher_is_better else -1.0

    # --- the run ------------------------------------------------------------------------

    def workspace_files(self, assets: Path) -> Path:
        return assets / "public"

    @property
    def rules(self) -> Rules:
        """The layout's read-only files too, as its scripts/read_only_files.txt lists them."""
        return dataclasses.replace(super().rules, read_only_listed_in="hidden/read_only_files.txt")

    def own_instructions(self) -> str | None:
        problem = (self.folder / "scripts" / "research_problem.txt").read_text()
        if self.format == "mlrc":
            problem += (
                f"\n\nImplement your method behind the entry point `python main.py -m METHOD -p dev` and evaluate it "
                f"on the dev split. After your run, the test split (hidden) is scored with "
                f"`python main.py -m {self.spec.method} -p test` on the state of your workspace that scored best "
                f"on dev, with the task's read-only files restored."
            )
        return problem

    @property
    def judge(self) -> Judge:
        """scripts/eval.py (`score`); MLRC-Bench: the test split scored on the step snapshot
        with the best dev score (selection.py), every distinct one scored on dev first."""
        if self.format != "mlrc":
            return super().judge
        from mlrb.tasks.folder import selection

        return dataclasses.replace(super().judge, snapshot_chooser=functools.partial(selection.best_dev_snapshot, self))

    def with_phase(self, phase: str) -> FolderTask:
        scales = {**self.cfg.scales, self.cfg.scale: {**self.cfg.scales[self.cfg.scale], "phase": phase}}
        task = FolderTask(dataclasses.replace(self.cfg, scales=scales))
        task.environment = self.environment
        return task

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        hidden = assets / "hidden"
        if self.format == "mlrc":
            problem = self.run_phase(submission, hidden)
            if problem:
                return ScoreReport.invalid(problem)
        try:
            proc = subprocess.run([self.python, "-c", GET_SCORE, str(hidden), str(submission.resolve())],
                                  cwd=hidden, env=self.child_env(work_dir), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=self.spec.score_timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            return ScoreReport.invalid(f"scripts/eval.py took longer than {self.spec.score_timeout_s:g} s")
        lines = proc.stdout.strip().splitlines()
        result: dict[str, Any] = (
            json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"error": last_line(proc.stderr)}
        )
        if "error" in result:
            return ScoreReport.invalid(f"scripts/eval.py get_score raised {result['error']}")
        score = result["score"]
        if not math.isfinite(score):
            return ScoreReport.invalid(f"scripts/eval.py get_score returned {score}")
        where = f"{self.spec.phase} split" if self.format == "mlrc" else "the workspace"
        return ScoreReport(valid=True, reason=f"scored by scripts/eval.py on {where}", score=score,
                           metrics=self.benchmark_metrics(score, assets))  # fmt: skip

    def run_phase(self, folder: Path, hidden: Path) -> str:
        """MLRC: `main.py -m METHOD -p PHASE` in the folder (test: the hidden split put in place
        first); why it failed, or ""."""
        phase, method = self.spec.phase, self.spec.method
        if phase == "test":
            if (hidden / "test_data").is_dir():
                shutil.copytree(hidden / "test_data", folder / "data", dirs_exist_ok=True)
            if (hidden / "test_constants.py").is_file():
                shutil.copyfile(hidden / "test_constants.py", folder / "constants.py")
        shutil.rmtree(folder / "output", ignore_errors=True)  # results are the scorer's own, never left over
        command = [self.python, "main.py", "-m", method, "-p", phase]
        shown = f"`python main.py -m {method} -p {phase}`"
        try:
            proc = subprocess.run(command, cwd=folder, env=self.child_env(folder), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=self.spec.score_timeout_s)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"{shown} took longer than {self.spec.score_timeout_s:g} s"
        return f"{shown} exited {proc.returncode}: {last_line(proc.stderr)}" if proc.returncode else ""

    def benchmark_metrics(self, score: float, assets: Path) -> dict[str, float]:
        """MLRC-Bench's own names for the two improvements it reports, in percent."""
        if self.format != "mlrc":
            return {}
        anchors = self.anchors.read(assets)
        baseline, reference = anchors["baseline_score"], anchors["reference_score"]
        metrics: dict[str, float] = {}
        if baseline:
            metrics["absolute_improvement_to_baseline"] = 100.0 * self.direction * (score - baseline) / abs(baseline)
        if baseline is not None and reference is not None:
            metrics["relative_improvement_to_human"] = 100.0 * (score - baseline) / (reference - baseline)
        return metrics

    def child_env(self, home: Path) -> dict[str, str]:
        """The environment of the task's own code (prepare.py, main.py, eval.py): the sandboxes'
        allow-list (no secrets), the task's Python environment, fixed hashing and threads, and
        nothing written into the (read-only, hashed) assets; the hub's offline flags stay the
        user's (a prepare.py may download)."""
        return sandbox_environment(
            str(home),
            {
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0",
                "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                "HF_DATASETS_OFFLINE": os.environ.get("HF_DATASETS_OFFLINE", "1"),
            },
            self.environment,
        )


def last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"


def folder_digest(folder: Path) -> str:
    """A task folder's content key: a changed file gets the assets rebuilt."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        stat = path.stat()
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        if stat.st_size > HASH_LIMIT_BYTES:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
