"""Score a submission outside the agent's reach: on a fresh copy, in a fresh sandbox
of the run's kind that sees the copy and the hidden data but not the workspace or
the network, with Python in isolated mode (-I: no PYTHON* variables, no user site,
no current folder on sys.path) so nothing the agent shipped can load itself
into the scorer.

A task whose scoring runs the submission's own code (MLRC-Bench's `main.py -m METHOD -p
test` on the hidden test inputs) says so with `submission_command`: that code runs first, on
the copy, in another fresh sandbox of the run's kind that sees the copy, the task's Python
and the system but never the task's assets, so it cannot read the hidden labels; the scorer
then scores what it left. (sandbox=unconfined confines nothing: there it can.)"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import mlrb
from mlrb.core import registry
from mlrb.core.config import SandboxConfig
from mlrb.sandbox.base import (
    IsolatedCommand,
    IsolatedProcess,
    Limits,
    Mount,
    harness_hidden,
    limits_for,
    sandbox_environment,
    task_environment_mounts,
)
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.submission_command import SubmissionCommand


class ScoredTask(Protocol):
    """What scoring needs of a task (every mlrb.tasks.base.Task has it): its judge (the modules
    its scorer imports, its time limit), its rules and hardware, and the config its scorer's
    process loads the task from (registry.load_task).

    A task whose scoring runs the submission's own code says so with its judge's
    `submission_command(copy, assets) -> SubmissionCommand | None` (its inputs put in the copy,
    the command to run there); the scorer's process then scores with `judge.after_command()`."""

    @property
    def environment(self) -> Path | None: ...  # where the task's own scripts run (None: the harness's Python)

    # (typed Any: scoring never imports mlrb.tasks, which stands above it)
    @property
    def judge(self) -> Any: ...  # mlrb.tasks.judge.Judge: its imports and time limit
    @property
    def rules(self) -> Any: ...  # mlrb.tasks.attempt_rules.Rules: its submission and network
    @property
    def hardware(self) -> Any: ...
    def scorer_config(self) -> dict[str, Any]: ...


class ScorerError(RuntimeError):
    """Scoring failed without a judgement (the scorer raised, or was killed): whose fault it is
    takes a control to tell (mlrb/harness/control.py); never a score of 0."""


class ScoringTimedOut(ScorerError):
    """Scoring ran past the judge's time limit: a slow submission, or a slow machine."""


def score_submission(
    task: ScoredTask,
    submission: Path,
    assets: Path,
    work_dir: Path,
    sandbox: SandboxConfig,
    run_id: str = "",
    on_agent_state: bool = False,
) -> ScoreReport:
    """Score in a fresh sandbox of the run's kind (a new namespace for bwrap, a new container
    for docker, a plain subprocess for unconfined). A submission that runs past the time limit
    is invalid here (a step scored mid-run, a rescoring); a run's own scoring asks a control.
    ON_AGENT_STATE: the submission's own command runs on what the run's sandbox kept of the agent
    (Sandbox.keep_state_now), as a run's own scoring does."""
    with Scorer(task, assets, work_dir, sandbox, run_id, ahead=False, on_agent_state=on_agent_state) as scorer:
        try:
            return scorer.score(submission)
        except ScoringTimedOut as e:
            return ScoreReport.invalid(str(e))


class Scorer:
    """A scorer started before there is anything to score, so that its imports (the task's
    judge's `imports`: torch, lm-eval; seconds) happen while the agent works: in its fresh
    sandbox it imports them, then waits for `score` to hand it the submission. Close it (or
    leave its `with` block) whether or not it scored: a waiting scorer is killed.

    With `ahead=False` it starts at `start_ahead` (the run calls it once the workspace holds a
    submission) or at `score`, whichever comes first: a run that never hands anything in never
    pays for a scorer's imports (seconds of CPU) or holds its memory (hundreds of MiB)."""

    def __init__(
        self,
        task: ScoredTask,
        assets: Path,
        work_dir: Path,
        sandbox: SandboxConfig,
        run_id: str = "",
        ahead: bool = True,
        on_agent_state: bool = False,
    ):
        self.task, self.sandbox, self.run_id = task, sandbox, run_id
        # It scores what the run's agent left at its end: a submission's own command that asks for
        # it runs on the agent's kept state (IsolatedCommand.on_agent_state), not a control's.
        self.on_agent_state = on_agent_state
        # Absolute, as given (not resolved): the scorer sees each folder at the path it is told.
        self.assets, self.work_dir = assets.absolute(), work_dir.absolute()
        self.request_file = self.work_dir / "request.json"
        self.log_file = self.work_dir / "scorer.log"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.used = self.closed = False
        self.process: IsolatedProcess | None = None
        if ahead:
            self.start_ahead()

    @property
    def may_start_ahead(self) -> bool:
        """Whether `start_ahead` would start it (it does not run yet, and was not closed)."""
        return self.process is None and not self.closed

    def start_ahead(self) -> None:
        """Start it now, unless it runs already (or was closed)."""
        if self.may_start_ahead:
            self.process = self.start()

    def start(self, ahead: bool = True) -> IsolatedProcess:
        """The worker in its sandbox. Started AHEAD of its submission, it imports the judge's modules
        while it waits; started to score at once, it imports each as scoring uses it, so a submission
        the checks refuse is refused without torch's seconds of imports."""
        self.request_file.unlink(missing_ok=True)
        self.assets_seen = folder_identity(self.assets)
        self.used = self.closed = False
        imports = ",".join(self.task.judge.imports) if ahead else ""
        self.job = IsolatedCommand(
            argv=[sys.executable, "-I", "-m", "mlrb.scoring.worker", str(self.request_file), imports],
            mounts=scorer_mounts(self.assets, self.work_dir) + task_environment_mounts(self.task.environment),
            workdir=str(self.work_dir),
            env=scorer_environment(self.work_dir, self.sandbox),
            timeout_s=self.task.judge.timeout_s,
            log_file=self.log_file,
            limits=self.limits(),
            run_id=self.run_id,
        )
        return self.sandbox_class().start_isolated(self.sandbox, self.job)

    def sandbox_class(self) -> Any:
        return registry.load(registry.SANDBOXES[self.sandbox.kind])

    def limits(self) -> Limits:
        """The task's, offline: what scoring runs in, the submission's own command too."""
        return dataclasses.replace(limits_for(self.task, self.sandbox), network=False)

    def score(self, submission: Path) -> ScoreReport:
        """Score `submission` (a file or folder) on a fresh copy; the time limit counts from here."""
        if not submission.exists():
            self.close()  # nothing to score: no need to wait for the run's end to stop it
            return ScoreReport.invalid(
                f"no submission: the agent left nothing at '{self.task.rules.submission}' in its workspace"
            )
        # Not started yet; or a scorer scores once (or was closed); or assets rebuilt since it
        # started are a new folder its sandbox does not show.
        if self.process is None or self.used or self.closed or folder_identity(self.assets) != self.assets_seen:
            if self.process is not None:
                self.process.close()
            self.process = self.start(ahead=False)
        self.used = True
        process = self.process
        fresh = self.work_dir / "submission"
        shutil.rmtree(fresh, ignore_errors=True)
        if submission.is_dir():
            shutil.copytree(submission, fresh, symlinks=True)
        else:
            shutil.copy2(submission, fresh, follow_symlinks=False)
        started = time.monotonic()  # the time limit covers the submission's own command too
        command = submission_command(self.task, fresh, self.assets)
        if command is not None:
            problem = self.run_apart(command, fresh)
            if problem:  # its own code failed: the submission's fault, as when it fails in the scorer
                return ScoreReport.invalid(problem)
        process.hand_over(fresh)

        request: dict[str, Any] = {
            "task": self.task.scorer_config(),
            "submission": str(fresh),
            "assets": str(self.assets),
            "work_dir": str(self.work_dir),
            "report": str(self.work_dir / "report.json"),
            # where a task's own scripts run (a folder's eval.py): its environment, or null for the harness's
            "environment": str(self.task.environment) if self.task.environment else None,
            # the submission's own command ran apart: the scorer only reads what it left
            "submission_command_ran": command is not None,
        }
        written = self.request_file.with_name(self.request_file.name + ".part")
        written.write_text(json.dumps(request, indent=2))
        written.replace(self.request_file)  # whole, at once: a waiting scorer starts when it appears
        code = process.wait(max(0.0, self.job.timeout_s - (time.monotonic() - started)))
        if code is None:
            raise ScoringTimedOut(f"scoring took longer than {self.job.timeout_s:g} s")
        report_file = Path(request["report"])
        if code != 0 or not report_file.exists():
            raise ScorerError(f"scorer exited {code}: {last_error(self.log_file)} (log: {self.log_file})")
        return ScoreReport(**json.loads(report_file.read_text()))

    def run_apart(self, command: SubmissionCommand, copy: Path) -> str:
        """Run the submission's own command in a fresh sandbox of the run's kind that sees the
        copy (writable), the task's Python and the system, as the agent's own sandbox shows them
        (the harness's files hidden), and nothing else: not the assets, not the scorer's folder.
        Why it failed, or ""; ScoringTimedOut past its time. Its output is kept in
        submission_command.log beside the scorer's."""
        log_file = self.work_dir / "submission_command.log"
        job = IsolatedCommand(
            argv=command.argv,
            mounts=[Mount(copy.absolute(), writable=True), *harness_hidden()]
            + task_environment_mounts(self.task.environment)
            + list(command.mounts),
            workdir=str(copy.absolute()),
            env=with_run_devices(command.env, self.sandbox),
            timeout_s=command.timeout_s,
            log_file=log_file,
            limits=self.limits(),
            run_id=self.run_id,
            on_agent_state=self.on_agent_state and command.on_agent_state,
        )
        code = self.sandbox_class().run_isolated(self.sandbox, job)
        if code is None:  # a slow submission or a slow machine: a run's control tells which
            raise ScoringTimedOut(f"{command.shown} took longer than {command.timeout_s:g} s")
        return f"{command.shown} exited {code}: {last_error(log_file)}" if code else ""

    def close(self) -> None:
        """Stop it (safe twice). One that scored nothing leaves no log: its output was only its
        imports' (Docker's scorer writes its log once waited on, so it never had one)."""
        if self.process is not None:
            self.process.close()
        self.closed = True
        if not self.used:
            self.log_file.unlink(missing_ok=True)

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def submission_command(task: ScoredTask, copy: Path, assets: Path) -> SubmissionCommand | None:
    """The submission's own command the task runs before scoring it (its inputs put in the copy), if any."""
    command_of = task.judge.submission_command
    return command_of(copy, assets) if command_of is not None else None


def last_error(log_file: Path) -> str:
    """The log's last exception line (`SomeError: ...`; a progress bar may follow it), else its last line."""
    try:
        lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception|Interrupt)\b", line)]
    return (errors or lines or ["(no output)"])[-1][:500]


def folder_identity(folder: Path) -> tuple[int, int]:
    """Which folder this is (not which path): a rebuilt asset folder is a new one at the same path."""
    info = folder.stat()
    return info.st_dev, info.st_ino


def scorer_mounts(assets: Path, work_dir: Path) -> list[Mount]:
    """What the scorer sees besides the system and Python: its own folder (the submission's
    copy, the report), the task's assets, hidden data included, and the user's Hugging Face
    caches read-only (lm-eval's evaluation sets at full scale); never the workspace."""
    mounts = [Mount(work_dir.absolute(), writable=True), Mount(assets.absolute())]
    mounts += [Mount(cache) for cache in hf_caches() if cache.is_dir()]
    package = Path(mlrb.__file__).parent  # where this interpreter imports mlrb from, as it names it
    if not package.is_relative_to(sys.prefix):  # an editable install: the package in its source tree
        mounts.append(Mount(package))
    return mounts


def hf_caches() -> list[Path]:
    """The user's hub cache and datasets cache, as huggingface_hub and datasets find them."""
    import os

    from huggingface_hub import constants

    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or str(Path(constants.HF_HOME) / "datasets")
    return [Path(constants.HF_HUB_CACHE).expanduser().resolve(), Path(datasets_cache).expanduser().resolve()]


def scorer_environment(work_dir: Path, sandbox: SandboxConfig | None = None) -> dict[str, str]:
    """Offline, reading models from the user's hub cache and evaluation sets from a view of
    the user's datasets cache (see datasets_view); on the run's own GPUs."""
    hub_cache, datasets_cache = hf_caches()
    extra = {
        "HF_HOME": str(work_dir / "hf_home"),  # scratch: lm-eval's and datasets' own writes
        "HF_HUB_CACHE": str(hub_cache),
        "HF_DATASETS_CACHE": str(datasets_view(datasets_cache, work_dir / "hf_datasets")),
        "TOKENIZERS_PARALLELISM": "false",
    }
    return with_run_devices(sandbox_environment(str(work_dir), extra), sandbox)


def with_run_devices(env: dict[str, str], sandbox: SandboxConfig | None) -> dict[str, str]:
    """ENV with the run's own GPUs as its CUDA_VISIBLE_DEVICES (scorer_devices)."""
    env = dict(env)
    devices = scorer_devices(sandbox)
    if devices is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def scorer_devices(sandbox: SandboxConfig | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for the scorer: the run's own GPUs (sandbox.gpu_ids, else the
    launcher's allocation, CUDA_VISIBLE_DEVICES, "" when it gave none). None: leave unset,
    where the sandbox numbers its own GPUs (a container: see Sandbox.numbers_own_gpus)."""
    import os

    if sandbox is not None and registry.load(registry.SANDBOXES[sandbox.kind]).numbers_own_gpus:
        return None
    if sandbox is not None and sandbox.gpu_ids is not None:
        return ",".join(str(i) for i in sandbox.gpu_ids)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def datasets_view(cache: Path, view: Path) -> Path:
    """A writable folder that shows the user's read-only datasets cache: `datasets` takes a
    file lock next to each prepared table (<name>/<config>/<version>/<hash>_builder.lock)
    even to read it, so the folders down to <version> are made here and each prepared
    table is a link to the user's."""
    view.mkdir(parents=True, exist_ok=True)
    for table in cache.glob("*/*/*/*"):
        if table.is_dir() and (table / "dataset_info.json").is_file():
            link = view / table.relative_to(cache)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(table)
    return view
