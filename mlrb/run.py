"""One benchmark run, stage by stage, each taking the run's plan (mlrb/harness/plan.py):

    preflight -> open -> assets -> start -> agent -> collect -> score -> record

preflight checks everything before the run exists (the sandbox and the tracking store
included), so bad input never leaves a half-written run or an empty run folder; open
creates the run and its record (record.jsonl, which the store is written from); the rest
are `Stages`: the task's assets, the scorer, workspace, sandbox and prompt, the agent under
its budget, what it left, its submission scored in a separate process, and the outcome
recorded. Once the run exists it always ends with a status (mlrb/core/status.py):
FINISHED for the agent's outcomes, FAILED for an infrastructure error (with its
reason), KILLED when a signal stopped it (its workspace still scored unless a
second signal comes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlrb import prefetch
from mlrb.agents.base import AgentContext, AgentOutcome
from mlrb.agents.recording import open_sink
from mlrb.analysis import counting
from mlrb.core import console, disk, events, interrupts, timeline
from mlrb.core.budget import Budget
from mlrb.core.compute import HeldCompute
from mlrb.core.config import ConfigError, MlrbConfig
from mlrb.core.status import Status, of_run
from mlrb.core.tags import Metric, Tag
from mlrb.formats import atif
from mlrb.harness import agent_clock, control, disk_guard, instructions, step_scoring, task_steps
from mlrb.harness import assets as assets_lib
from mlrb.harness import plan as plans
from mlrb.harness.disk_guard import DiskGuard
from mlrb.models import metering
from mlrb.review.recording import review_at_end
from mlrb.run_files import resume, snapshots, workspace
from mlrb.run_files.resume import Resumption
from mlrb.sandbox.base import SandboxError, SandboxStopped, held_hardware, left_running_note
from mlrb.scoring.runner import Scorer, ScorerError, score_submission
from mlrb.store import record, recording_process, tracking
from mlrb.tasks.base import ScoreReport, Task
from mlrb.tasks.handling import in_environment, is_plumbing, run_anchors

log = logging.getLogger(__name__)

CLAIM_FILE = resume.CLAIM  # in a run folder: a run has claimed it
# A SLURM job stopped with no warning signal first gets SIGTERM, then SIGKILL this long after
# (its KillWait, 30 s by default): time enough for SLURM to end it before the harness would.
SLURM_KILL_WAIT_S = 300
# How long an agent that ended badly under SLURM waits for the job's own SIGTERM: SLURM signals a
# killed job's processes one by one, and the agent's command may die of it before the harness hears.
JOB_SIGTERM_GRACE_S = 5
ASSETS_PARAM = "assets.fingerprint"  # beside the config's params (task.name, agent.name, seed, sandbox.kind...)


class RunFailed(RuntimeError):
    """An infrastructure failure; the MLflow run is recorded as FAILED with this message, and
    its traceback is in `log_file` (the run's log)."""

    def __init__(self, message: str, run_id: str, log_file: str | None = None):
        super().__init__(message)
        self.run_id, self.log_file = run_id, log_file


@dataclass
class RunResult:
    run_id: str
    name: str
    status: Status
    valid: bool
    reason: str
    score: float | None
    normalised_score: float | None
    run_dir: str
    # Why the tracking store could not be reached during the run (None: it holds the whole
    # run); the run folder's record is complete either way, and `mlrb.sync` uploads it.
    store_error: str | None = None


def execute(cfg: MlrbConfig, new_dir: Path) -> RunResult:
    """Run once, in NEW_DIR (Hydra's, made for this job) or the folder of this run begun before,
    and record it. Raises ConfigError (nothing recorded, no run folder left), RunFailed (recorded as
    infra_error) or RunInterrupted (recorded as killed)."""
    clock = timeline.StageClock()
    clock.add("compose", timeline.since_process_start())
    plan = plans.make(cfg)  # the config, resolved once: nothing below reads cfg
    run_dir = folder_for(Path(new_dir), plan)
    commit: dict[str, str] = {}  # git runs in its own processes while the store is checked
    git = threading.Thread(target=lambda: commit.update(tracking.harness_commit()), name="git", daemon=True)
    git.start()
    # MLflow: in a process of its own (started with `python -m mlrb`, else now), which the
    # record is exported through
    recording = recording_process.start()
    try:
        preflight(plan, recording, clock)
    except ConfigError:
        discard_unused(Path(run_dir))
        raise
    git.join()
    run_dir = Path(run_dir).resolve()
    resumed = resume_in(run_dir, plan) if plan.resume else None  # None: a run of its own
    if resumed is None:
        run_dir = claim_run_dir(run_dir, plan)
    scrub_hydra_files(Path(run_dir), tracking.secrets_in(plan.tracking))

    tags = {**plan.tags, Tag.RUN_DIR: str(run_dir), **commit}
    run_id, attempt = run_identity(run_dir, plan, resumed)
    with interrupts.guarded() as guard:
        with guard.hold(), clock.stage("recording"):  # a run is created whole or not at all
            # every call a line of the run folder's record.jsonl, which the store is written from (the
            # recording process opens the store's run from its first line: the harness does not wait)
            recorder = record.RecordedRun(
                recording.store_run(plan.tracking), run_dir, plan.experiment, plan.name, tags, run_id, attempt
            )
        if resumed:
            log.info(
                "run %s (%s) goes on in attempt %d (%s); files in %s",
                plan.name,
                recorder.run_id,
                resumed.attempt,
                resumed.why,
                run_dir,
            )
        else:
            log.info("run %s (%s) started; files in %s", plan.name, recorder.run_id, run_dir)
        try:
            guard.release()  # a signal that came while the run was created stops it now
            with resume.heartbeat(run_dir):  # the run's sign of life, for who would resume it
                result = Stages(plan, recorder, run_dir, guard, clock, resumed).run()
        except BaseException as e:
            with guard.hold():  # signals now come too late to change anything
                replacement = stopped(plan, recorder, run_dir, e)
            if replacement is e:
                raise
            raise replacement from e
        with guard.hold():
            try:
                recorder.finish(result.status.mlflow_status)  # waits for the store, unless it is away
            except Exception as e:  # its end is in the record; the store could not be given it
                log.error("run %s: recording its end failed", plan.name, exc_info=e, extra=console.LOG_FILE_ONLY)
                raise RunFailed(
                    f"recording the run's end failed: {type(e).__name__}: {e} (its record is whole: "
                    f"`python -m mlrb.sync {run_dir}` uploads it)",
                    recorder.shown_id,
                    console.log_file(),
                ) from e
            if recorder.store_error and tracking.store_disk_was_full(recorder.store_error):
                catch_up_store(recorder, run_dir)
        result = dataclasses.replace(result, store_error=recorder.store_error, run_id=recorder.shown_id)
    if result.status == Status.KILLED:
        raise RunInterrupted(result, guard.received[0])
    return result


def catch_up_store(recorder: record.RecordedRun, run_dir: Path) -> None:
    """Give the store what it missed of the run, at the run's end: a store found away only because
    its disk was full (the agent filled the disk they share) has room again once the harness has
    stopped the agent and removed what it wrote past its limit. What `python -m mlrb.sync` would
    upload later, uploaded now; a store that still cannot take it leaves the run saying so."""
    from mlrb import sync

    try:
        client, artifact_root = tracking.client_for(sync.recorded_store(run_dir))
        done = sync.sync_run(client, artifact_root, run_dir)
    except Exception as e:
        log.warning("the tracking store, whose disk was full, still cannot take the run: %s", tracking.first_line(e))
        return
    log.info("the tracking store, whose disk was full, has the run now: %s", done)
    recorder.store_error = None


def preflight(plan: plans.RunPlan, recording: recording_process.RecordingProcess, clock: timeline.StageClock) -> None:
    """Everything the run needs, checked before it exists: a ConfigError is one line, and
    nothing is recorded."""
    # e.g. no namespaces, a dead Docker daemon
    plan.sandbox_class.preflight(plan.sandbox)
    prefetch.refuse_if_missing(plan.task)  # full scale: models or evaluation sets not in the HF cache
    if plan.task.setup.builds_at_preflight:  # a folder task whose baseline or eval.py fails: the same
        assets_lib.ensure_assets(plan.task, plan.cache_dir)
    plan.agent.prepare(plan.cache_dir)  # say, an agent's program installed into the cache, or refused
    # a store that cannot take the run: the same (a sweep's job waits for a server that is away)
    check = recording.start_check(plan.tracking, wait_for_server=bool(plan.sweep_id))
    with clock.stage("sandbox_start"):
        plan.agent.warm_up()  # e.g. an LLM agent imports its SDK on a thread while the store is checked
    with clock.stage("recording"):  # opening the store imports MLflow (here, or in the recording process)
        check.result()


def stopped(plan: plans.RunPlan, recorder, run_dir: Path, e: BaseException) -> BaseException:
    """Record a run that ended early; the exception for the caller."""
    if isinstance(e, SandboxStopped) and plan.resume:  # its job is being stopped from outside: not its end
        if resume.slurm_job_id():
            log.warning(
                "the sandbox was stopped from outside: waiting up to %d s for SLURM to end the job "
                "(the run goes on when it runs again)",
                SLURM_KILL_WAIT_S,
            )
            time.sleep(SLURM_KILL_WAIT_S)
        e = interrupts.Interrupted(signal.SIGTERM)
    if isinstance(e, Exception):
        log.error("run %s failed", plan.name, exc_info=e, extra=console.LOG_FILE_ONLY)
        message = f"{type(e).__name__}: {e}"
        status, tags = Status.INFRA_ERROR, {Tag.ERROR: message[:5000]}
    elif plan.resume and (
        isinstance(e, SystemExit) or isinstance(e, interrupts.Interrupted) and e.signum in interrupts.SUSPENDING
    ):
        # a launcher's requeue (submitit exits the job), `kill`, a closed terminal: it goes on later
        if isinstance(e, SystemExit):
            why = "the launcher requeued its job (a time limit or a pre-emption)"
        else:
            why = f"{e.name} stopped it"
        log.warning("run %s: %s; it goes on where it stopped when its job or command runs again", plan.name, why)
        with contextlib.suppress(Exception):  # the store's account of it; the record is what resumes it
            recorder.set_tags({Tag.ATTEMPT_ENDED: why})
        return RunSuspended(e.signum, recorder.shown_id) if isinstance(e, interrupts.Interrupted) else e
    else:  # a signal, or a launcher's requeue (submitit exits the job): not the agent's doing, nor a failure
        cause = e.name if isinstance(e, interrupts.Interrupted) else f"the launcher ({type(e).__name__}: requeued?)"
        message = f"interrupted by {cause}; the workspace was not scored"
        status, tags = Status.KILLED, {Tag.ERROR: message}
    try:
        try:
            recorder.set_tags({Tag.STATUS: status, **tags})
            recorder.log_file(run_dir / "trajectory.jsonl")
            atif.record(run_dir, recorder)  # the trajectory as ATIF too; its failure is a warning
            recorder.log_file(run_dir / "scoring" / "scorer.log")
            # what the agent tried before the end counts though nothing was scored: the rules
            # alone (no judge: a stopped job has seconds left), never failing the recording
            review_at_end(run_dir, recorder)
        finally:
            recorder.finish(status.mlflow_status)
    except Exception as failure:  # the store itself failed: say so, in the same one line
        log.error("run %s: recording its end failed: %s", plan.name, failure)
        message += f" (and recording it in the tracking store failed: {tracking.first_line(failure)})"
    if recorder.store_error:
        message += f" (not yet in the tracking store: `python -m mlrb.sync {run_dir}` uploads its record)"
    if status == Status.INFRA_ERROR:
        return RunFailed(message, recorder.shown_id, console.log_file())
    if isinstance(e, interrupts.Interrupted):
        return RunInterrupted(None, e.signum, recorder.shown_id)
    return e  # SystemExit from a launcher's requeue: it goes on exiting


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by a signal and recorded as killed (MLflow KILLED)."""

    def __init__(self, result: RunResult | None, signum: int, run_id: str = ""):
        self.result = result
        self.run_id = result.run_id if result else run_id
        self.signal = interrupts.Interrupted(signum)
        if result is None:
            scored = "workspace not scored"
        elif result.score is not None:
            scored = f"workspace scored: {result.score:.4f}"
        else:
            scored = "workspace scored: " + ("valid" if result.valid else f"invalid: {result.reason}")
        super().__init__(
            f"run interrupted by {self.signal.name}; recorded as killed ({scored}); mlflow run {self.run_id}"
        )

    @property
    def exit_code(self) -> int:
        return self.signal.exit_code


class RunSuspended(RunInterrupted):
    """The run was stopped by a signal before its end, to go on later where it was (mlrb/run_files/resume.py)."""

    def __init__(self, signum: int, run_id: str):
        self.result, self.run_id, self.signal = None, run_id, interrupts.Interrupted(signum)
        KeyboardInterrupt.__init__(
            self,
            f"run stopped by {self.signal.name} before its end; run the same command again to go on where it "
            f"stopped (resume=false starts over); mlflow run {run_id}",
        )


def claim_run_dir(run_dir: Path, plan: plans.RunPlan) -> Path:
    """A run folder no other run uses. Hydra names it by config and second, so two runs of
    one config started in the same second get the same one: the first to create the claim
    file keeps it, the others take the next free sibling (NAME-2, NAME-3, ...)."""
    owner = resume.me(plan.key, plan.sweep_id)
    for n in itertools.count(1):
        candidate = run_dir if n == 1 else run_dir.with_name(f"{run_dir.name}-{n}")
        candidate.mkdir(parents=True, exist_ok=True)
        if resume.write_owner(candidate, owner, exclusive=True):
            return candidate
    raise AssertionError("unreachable")


def run_identity(run_dir: Path, plan: plans.RunPlan, resumed: Resumption | None) -> tuple[str, int]:
    """The run's own id and attempt: a resumed run's; for a sweep's job run again after its run
    ended unfinished, that run's, one attempt more (in a folder of its own); else a new run's."""
    if resumed is not None:
        return resumed.run_id, resumed.attempt
    earlier = resume.earlier_attempt(run_dir, plan.key, plan.sweep_id) if plan.sweep_id and plan.resume else None
    if earlier is not None:
        return earlier[0], earlier[1] + 1
    return record.new_run_id(), 1


def resume_in(run_dir: Path, plan: plans.RunPlan) -> Resumption | None:
    """The run RUN_DIR holds, taken over to go on in a new attempt, when it is this plan's run,
    begun and not ended, and its owner is gone (mlrb/run_files/resume.py); else None."""
    if not resume.resumable(run_dir, plan.key, plan.sweep_id):
        return None
    state = record.fold(record.read(run_dir))
    attempt = int(state["attempt"] or 1) + 1
    if not resume.take_over(run_dir, plan.key, plan.sweep_id, attempt):
        return None  # another process resumed it first
    why = state["tags"].get(Tag.ATTEMPT_ENDED) or "its process ended before the run was recorded"
    return Resumption(attempt, state["run_id"], why, resume.load(run_dir), run_dir / resume.AGENT_STATE)


def folder_for(new_dir: Path, plan: plans.RunPlan) -> Path:
    """Where the run goes, decided here alone: NEW_DIR (Hydra's, made for this job), or the folder of
    this run begun before and never ended, to go on in (unless resume=false). Going on there, the
    run's log file goes there too, and the unused NEW_DIR is removed."""
    found = resume.find(new_dir, plan.key, plan.sweep_id) if plan.resume else None
    if found is None or found == new_dir.resolve():
        return new_dir
    console.move_log(found)
    discard_unused(new_dir)
    return found


def discard_unused(run_dir: Path) -> None:
    """Remove the folder Hydra made for a run that never started (it holds only Hydra's
    own files: .hydra/ and the log)."""
    if not run_dir.is_dir() or (run_dir / CLAIM_FILE).exists():
        return
    if all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)


def scrub_hydra_files(run_dir: Path, secrets: list[str]) -> None:
    """Hydra writes the command line and config into the run folder (.hydra/): mask secrets there."""
    if not secrets:
        return
    for path in (run_dir / ".hydra").glob("*.yaml"):
        text = path.read_text()
        clean = text
        for secret in secrets:
            clean = clean.replace(secret, "***")
        if clean != text:
            path.write_text(clean)


class Stages:
    """A run's stages once its record is open: assets, start, agent, collect, score and record,
    in that order (`run`). Each reads the plan and what the stages before it left here. Each is
    timed in one place, as one of the clock's stages (mlrb/core/timeline.py); what a stage writes
    to the record is timed apart, as `recording`."""

    def __init__(
        self,
        plan: plans.RunPlan,
        recorder: record.RecordedRun,
        run_dir: Path,
        guard: interrupts.Guard,
        clock: timeline.StageClock,
        resumed: Resumption | None = None,
    ):
        self.plan, self.recorder, self.run_dir, self.guard, self.clock = plan, recorder, run_dir, guard, clock
        self.resumed = resumed  # an earlier attempt's run, gone on with
        self.task: Task = plan.task
        self.calls: metering.CallEvents | None = None  # the model calls, for an agent that makes them
        self.outcome: AgentOutcome  # how the agent ended (`agent`)
        self.disk_guard: DiskGuard | None = None  # the agent's disk, once its workspace is there (`start`)
        self.left_running: list[str] = []  # what the agent left running at its end (`end_agent`)
        self.steps: task_steps.StepsRun | None = None  # a task of steps: the agent's way through them (`agent`)

    def run(self) -> RunResult:
        timed = (
            (self.open, "recording"),
            (self.assets, "assets"),
            (self.start, "sandbox_start"),
            (self.agent, "agent"),
            (self.collect, "collect"),
            (self.score, "scoring"),
        )
        # A write of the harness's that finds the disk full asks the agent's disk guard for room first.
        with disk.reclaiming(lambda: self.disk_guard is not None and self.disk_guard.make_room()):
            with contextlib.ExitStack() as self.closing:  # the scorer, closed once the run is scored or stops
                for stage, timed_as in timed:
                    with self.clock.stage(timed_as):
                        stage()
            with self.guard.hold():  # the outcome is recorded whole; a signal meanwhile stops the run right after
                result = self.record()
        self.guard.release()
        return result

    def open(self) -> None:
        """The run's record begun (the run itself is created before, whole or not at all): a
        resumed run goes on with what its earlier attempts left, a job retried in a folder of
        its own starts afresh; the config is recorded."""
        if self.resumed is not None:
            for leftover in ("submission", "scoring", "dev"):  # what scoring leaves: scored again
                shutil.rmtree(self.run_dir / leftover, ignore_errors=True)
            if self.recorder.logged_params():
                return  # its params and config are in the record already
        if self.recorder.attempt > 1:
            for leftover in ("workspace", "submission", "scoring", "snapshots", "dev"):
                shutil.rmtree(self.run_dir / leftover, ignore_errors=True)
            (self.run_dir / "trajectory.jsonl").unlink(missing_ok=True)
        self.recorder.log_params(self.plan.params)
        self.recorder.log_text(self.plan.config_yaml, "config.yaml")

    def assets(self) -> None:
        """The task's assets, found in the cache or built, and which ones the run uses."""
        started = time.monotonic()
        self.asset_path, environment = assets_lib.prepare(self.task, self.plan.cache_dir)
        self.task = in_environment(self.task, environment)  # its parts run in its own environment
        self.prepare_time = time.monotonic() - started
        with self.clock.stage("recording"):
            record_assets(self.recorder, assets_lib.fingerprint(self.asset_path))
            self.recorder.set_tags({Tag.ENVIRONMENT: environment.name if environment else "harness"})
        # wall time counts from here: building a task's assets is a one-off of whichever run
        # needs them first, and would make that run look slow next to its siblings.
        self.run_started = time.monotonic()

    def start(self) -> None:
        """The scorer, the workspace, the agent's sandbox and its prompt."""
        plan, task = self.plan, self.task
        # The scorer imports while the agent works, once there will be something to score: from the
        # start for an agent that runs a known solution (it hands one in), else from the first step
        # after which the workspace holds a submission (`after_step`).
        ahead = plan.agent.runs_known_solution
        self.scorer = self.closing.enter_context(
            Scorer(
                task,
                self.asset_path,
                self.run_dir / "scoring",
                plan.sandbox,
                self.recorder.run_id,
                ahead=ahead,
                on_agent_state=True,
            )
        )
        self.work = self.run_dir / "workspace"
        self.start_files = task.start.files(self.asset_path)
        self.step_snapshots = snapshots.StepSnapshots(self.run_dir / "snapshots", plan.submission)
        self.state_dir = self.run_dir / resume.AGENT_STATE  # the agent's own, across attempts
        self.state_dir.mkdir(exist_ok=True)
        if self.resumed is None:
            self.before = workspace.prepare(self.start_files, self.work)
        else:
            self.before, self.workspace_as = resumed_workspace(self.start_files, self.work, self.step_snapshots.root)
        self.model = metering.start(plan.agent, network_allowed=plan.limits.network)
        gpus, cpus = held_hardware(plan.sandbox, plan.limits)  # held from the sandbox's start to its close
        self.compute = HeldCompute(gpus, cpus, plan.compute.price_per_gpu_hour, plan.compute.price_per_cpu_hour)
        self.compute.start()
        self.sandbox = plan.sandbox_class(
            plan.sandbox,
            self.work,
            self.asset_path / "public",
            self.recorder.run_id,
            plan.limits,
            seed=plan.seed,
            task_environment=task.environment,
            model_endpoint=self.model.endpoint() if self.model else None,
            agent_tools=plan.agent.tools_dir,
            state_dir=self.state_dir,
            workspace_at=task.setup.workspace_at,
        )
        self.guard.on_interrupt(self.sandbox.close)  # a signal stops the agent's processes at once
        self.disk_guard = DiskGuard(
            [self.work, self.state_dir],
            int(plan.sandbox.disk_gb * (1 << 30)),
            stop=self.stop_for_disk,
            keep=self.work / plan.submission,
        )
        self.prompt = instructions.render(task, plan.budget, self.sandbox.workspace, self.sandbox.data_dir)
        with self.clock.stage("recording"):
            self.recorder.log_text(self.prompt, "instructions.md")

    def agent(self) -> None:
        """The agent's run in its sandbox, under the budget, its events into the trajectory."""
        plan, work, resumed = self.plan, self.work, self.resumed
        budget = self.budget = Budget(plan.budget, compute=self.compute)
        budget.on_pause = self.sandbox.hold_still  # while its clock stands still, nothing of the agent runs
        # scoring.every_steps / every_minutes: the workspace scored mid-run too, off the agent's clock
        self.during = step_scoring.StepScoring(
            plan.scoring,
            self.task,
            self.asset_path,
            work,
            self.start_files,
            self.step_snapshots.root,
            plan.sandbox,
            self.recorder,
            self.run_dir,
            budget,
        )
        progress = resumed.progress if resumed else None
        if progress is not None and progress.outcome is not None:  # the agent had ended: only scoring was left
            self.ended_before(progress, budget)
            return
        if progress is not None:  # what calls in flight held when the attempt before ended is charged
            budget.carry(progress.spent_with_held())

        def after_step(step: int) -> None:
            # The step's snapshot, its mid-run scoring and the scorer's start are the harness's time,
            # not the agent's; what the agent left running stands still meanwhile, so the snapshot
            # is of one moment (a checkpoint half rewritten is not taken as it was at the step).
            with budget.paused():
                self.during.after(self.step_snapshots.take(step, work, self.before, budget.elapsed_s()))
                if self.scorer.may_start_ahead and (work / plan.submission).exists():
                    self.scorer.start_ahead()

        sink: events.EventSink | None = None
        stopped_by: BaseException | None = None  # an error that stopped the agent: the sink's open spans end with it
        try:
            sink = open_sink(self.run_dir / "trajectory.jsonl", self.recorder)
            # its spend saved as it goes, for a later attempt; what is left written where the agent reads it
            keeper = resume.Keeper(
                self.run_dir, self.recorder.attempt, budget, also=agent_clock.AgentClock(work, budget, sink).update
            )
            if self.model is not None:  # the proxy charges the budget and emits each model call as the run's events,
                # and the tool calls seen in them for an agent that does not emit its own
                self.calls = metering.attach(self.model, budget, sink, tools=not plan.agent.emits_tool_events)
            if resumed is None:
                sink.emit(events.RunStarted(plan.name, dataclasses.asdict(plan.budget)))
            else:
                sink.emit(events.RunResumed(resumed.attempt, resumed.why, budget.summary(), self.workspace_as))
            context = AgentContext(
                self.task,
                self.prompt,
                self.sandbox,
                budget,
                sink,
                plan.seed,
                run_dir=self.run_dir,
                on_step_end=after_step,
                model=self.model,
                resumed=resumed,
                state_dir=self.state_dir,
            )
            if self.task.steps:  # a task of steps (a Harbor task's [[steps]]): each given and scored in turn
                self.steps = task_steps.StepsRun(
                    self.task,
                    lambda step: instructions.render(step, plan.budget, self.sandbox.workspace, self.sandbox.data_dir),
                    self.recorder,
                    self.run_dir,
                    self.asset_path,
                    work,
                    plan.sandbox,
                    self.sandbox,
                    budget,
                )
            try:
                with keeper.running():
                    self.outcome = self.agent_watched(context, budget)
            except interrupts.Interrupted as e:  # the workspace is still scored (a second signal skips that)
                if plan.resume and e.signum in interrupts.SUSPENDING:
                    raise  # the run goes on later, where it was (`stopped`)
                self.outcome = AgentOutcome(Status.KILLED, e.name, f"interrupted by {e.name}")
                log.warning("%s: stopped the agent; scoring its workspace (send it again to skip scoring)", e.name)
            self.spent = budget.summary()  # taken now, so the agent's time does not include scoring
            keeper.ended(dataclasses.asdict(self.outcome), self.spent)
            sink.emit(events.RunEnded(dataclasses.asdict(self.outcome), self.spent))
        except BaseException as e:
            stopped_by = e
            raise
        finally:
            self.sandbox.close()
            if self.model is not None:
                self.model.close()
            if sink is not None:
                sink.close(stopped_by)  # traces flushed, the trajectory file closed
        log.info("agent ended: %s %s", self.outcome.status, self.outcome.message)

    def ended_before(self, progress: resume.Progress, budget: Budget) -> None:
        """A resumed run whose agent had ended in an earlier attempt: its outcome and spend taken
        back, nothing of it started again; only the scoring was left."""
        outcome = dict(progress.outcome or {})
        self.outcome = AgentOutcome(Status(outcome["status"]), outcome.get("stop_reason"), outcome.get("message", ""))
        self.spent = dict(progress.spent or {})
        budget.carry(self.spent)
        self.sandbox.close()
        self.compute.stop()
        if self.model is not None:
            self.model.close()
        log.info("the agent had ended in an earlier attempt (%s): its workspace is scored", self.outcome.status)

    def agent_watched(self, context: AgentContext, budget: Budget) -> AgentOutcome:
        """The agent's run (a task of steps: step by step) under the disk guard, ended (`end_agent`)
        whatever ends it; a SLURM job being stopped is told apart from the agent's own end."""
        plan, guard = self.plan, self.disk_guard
        assert guard is not None  # made with the sandbox (`start`)
        try:
            with guard.watching():
                outcome = self.steps.run(plan.agent, context) if self.steps else plan.agent.run(context)
        except SandboxError as e:
            if self.job_stopping(within_s=JOB_SIGTERM_GRACE_S):
                raise SandboxStopped(f"{e} (SLURM is stopping its job)") from e
            raise
        finally:
            self.end_agent(budget)
        if guard.tripped:  # whatever the agent made of it: the limit stopped it
            outcome = AgentOutcome(Status.BUDGET_EXHAUSTED, disk_guard.LIMIT, f"stopped: {guard.tripped}")
        if self.job_stopping(within_s=0 if outcome.status == Status.OK else JOB_SIGTERM_GRACE_S):
            raise SandboxStopped(f"the agent ended ({outcome.message[:200]}) as SLURM stopped its job")
        return outcome

    def stop_for_disk(self, why: str, meanwhile: Callable[[], None]) -> None:
        """The agent went past its disk (mlrb/harness/disk_guard.py): its model calls refused from now
        on, its processes held still while MEANWHILE makes room, then ended."""
        self.budget.stop(disk_guard.LIMIT)
        self.sandbox.stop(why, meanwhile)

    def end_agent(self, budget: Budget) -> None:
        """The agent's end, whatever brought it (its exit, its budget, an error, a signal): first
        every process it has in its sandbox is ended, so nothing of it works after its end; then
        its model calls still open are waited for (a while, off its clock) and charged, each
        recorded as its call, so that what the upstream served is in the spend taken next. What it
        left running is named first, for the review (a note in `collect`)."""
        try:
            self.left_running = self.sandbox.processes_left()
        except Exception as e:  # the evidence is not worth the run
            log.warning("listing what the agent left running failed: %s", tracking.first_line(e))
        self.sandbox.close()
        if budget.compute is not None:
            budget.compute.stop()  # its hardware is no longer held
        if self.model is not None:
            with budget.paused():
                wait_s = 0.0 if self.guard.received else self.plan.budget.open_calls_wait_s  # a signal: at once
                self.model.settle_open(wait_s)

    def job_stopping(self, within_s: float) -> bool:
        """Whether SLURM is stopping this run's job (a requeue, a lost node, a time limit): its SIGTERM
        or SIGUSR2 reached the harness through the launcher's handler. The agent cannot send them (the
        sandbox has its own PIDs)."""
        if not (self.plan.resume and resume.slurm_job_id()):
            return False
        with self.budget.paused():  # the wait is not the agent's time
            return self.guard.launcher_signalled(within_s)

    def collect(self) -> None:
        """What the agent left: its final state and trajectory recorded, the step to score chosen
        (MLRC-Bench: the best on dev), the read-only files restored, its submission copied out of
        its reach. Nothing the agent left can fail the run here: what was left out or cut, and a
        patch or an upload that failed, is a note (a warning in the run's log and a line of its
        `workspace_notes.txt` artifact), and the run goes on to scoring."""
        plan, task, work = self.plan, self.task, self.work
        notes: list[str] = []

        def noted(what: str, call, *args) -> None:
            """CALL(*ARGS), whose failure is a note; its traceback goes to the run's log."""
            try:
                call(*args)
            except Exception as e:
                log.warning("%s failed", what, exc_info=e, extra=console.LOG_FILE_ONLY)
                notes.append(f"{what} failed: {type(e).__name__}: {tracking.first_line(e)}")

        # the final state (work left running may have changed it)
        final: dict = {}
        noted(
            "the final snapshot",
            lambda: final.update(
                self.step_snapshots.take(self.budget.steps, work, self.before, self.spent[Metric.AGENT_TIME_S])
            ),
        )
        patch_notes = workspace.Notes("the patch")
        with self.clock.stage("recording"):
            noted("recording the trajectory", self.recorder.log_file, self.run_dir / "trajectory.jsonl")
            atif_note = atif.record(self.run_dir, self.recorder)  # the trajectory as ATIF too: never fails the run
            notes += [atif_note] if atif_note else []
            noted(
                "recording the workspace's patch",
                lambda: self.recorder.log_text(workspace.diff(self.before, work, patch_notes), "workspace.patch"),
            )
            for path, folder, is_dir in snapshots.recorded(self.step_snapshots.root, plan.record.snapshots):
                noted(
                    "recording the snapshots",
                    self.recorder.log_folder if is_dir else self.recorder.log_file,
                    path,
                    folder,
                )
            if (self.run_dir / "agent").is_dir():  # what an outside agent printed: its transcript
                noted("recording the agent's transcript", self.recorder.log_folder, self.run_dir / "agent", "agent")

        def score_folder(scored_task: Task, folder: Path, work_dir: Path) -> ScoreReport:  # as the run's scorer
            try:
                return score_submission(
                    scored_task, folder, self.asset_path, work_dir, plan.sandbox, self.recorder.run_id
                )
            except ScorerError as e:  # a step whose dev scoring fails is not chosen; the final scoring has a control
                return ScoreReport.invalid(f"dev scoring failed: {e}")

        globs = task.rules.read_only_globs(self.asset_path)
        # what the agent left changed of them, which a chosen step's state (scored without them) leaves out
        changed_read_only = workspace.read_only_changed(self.start_files, work, globs, self.before)
        chosen = task.judge.choose_snapshot(self.step_snapshots.root, self.asset_path, self.run_dir, score_folder)
        if chosen is not None:  # MLRC-Bench: the test split is scored on the snapshot with the best dev score
            snapshots.materialise(self.step_snapshots.root, chosen["entry"], self.start_files, work)
            with self.clock.stage("recording"):
                self.recorder.log_metrics(chosen["metrics"])
                self.recorder.set_tags(chosen["tags"])
        submission_notes = workspace.Notes("the submission")
        try:
            self.restored = workspace.restore_read_only(self.start_files, work, globs, self.before)
        except workspace.NotRestored as e:  # what the agent put there cannot be removed: not scored, and counted
            self.restored, self.submitted = e.restored, False
            submission_notes.say(f"{e}: the submission was not collected")
        else:  # copied here, so that what it left out is noted with the rest
            self.submitted = workspace.collect(work, plan.submission, self.run_dir / "submission", submission_notes)
        self.restored = sorted(set(self.restored) | set(changed_read_only))
        if self.restored:
            log.warning("the agent changed read-only files, restored before scoring: %s", ", ".join(self.restored))
        disk_notes = self.disk_guard.notes if self.disk_guard is not None else []
        notes += [left] if (left := left_running_note(self.left_running)) else []
        lines = notes + disk_notes + final.get("notes", []) + patch_notes.lines() + submission_notes.lines()
        for line in lines:
            log.warning("%s", line)
        if lines:
            with self.clock.stage("recording"):
                noted("recording the notes", self.recorder.log_text, "\n".join(lines) + "\n", "workspace_notes.txt")

    def score(self) -> None:
        """The submission (copied out by `collect`) scored in the scorer's sandbox; a scoring that
        fails is judged by a control (mlrb/harness/control.py)."""
        # Checked again: scoring against assets changed since the run began would be a silent wrong score.
        self.asset_path = assets_lib.ensure_assets(self.task, self.plan.cache_dir)
        if self.steps is not None and (decided := self.steps.decided()) is not None:
            self.report = decided  # it ended at a step scored already
            return
        task, scorer = (self.steps.scored_task(), None) if self.steps is not None else (self.task, self.scorer)
        if scorer is None or task is self.task:
            scorer = self.scorer
        else:  # it ended before its last step: that step's verifier
            self.scorer.close()
            scorer = self.closing.enter_context(
                Scorer(
                    task,
                    self.asset_path,
                    self.run_dir / "scoring",
                    self.plan.sandbox,
                    self.recorder.run_id,
                    ahead=False,
                    on_agent_state=True,
                )
            )
        try:
            self.report = scorer.score(self.run_dir / "submission")  # (restarted if those assets were rebuilt)
        except ScorerError as failure:  # the submission's fault unless the task's baseline fails the same way
            scorer.close()
            self.report = (
                control.blame(
                    failure,
                    task,
                    self.asset_path,
                    self.run_dir / "scoring" / "control",
                    self.plan.sandbox,
                    self.recorder.run_id,
                )
                if task is self.task
                else ScoreReport.invalid(f"scoring failed: {failure}")
            )  # (a step's solution alone is no control)
        if self.steps is not None:  # the trial's reward, from every step's
            self.report = self.steps.trial_report(self.report)
        if not self.submitted:
            self.report.details["collected"] = False

    def record(self) -> RunResult:
        """The score, how it counts and how the run ended, as metrics and tags."""
        task, report, outcome, recorder = self.task, self.report, self.outcome, self.recorder
        score_time = self.clock.times["scoring"]
        status = (
            Status.KILLED if outcome.status == Status.KILLED else of_run(outcome.status, self.submitted, report.valid)
        )
        with self.clock.stage("recording"):
            recorder.log_text(json.dumps(report.to_dict(), indent=2, default=float), "score_report.json")
            recorder.log_file(self.run_dir / "scoring" / "scorer.log")
        calibration = run_anchors(task, self.asset_path)
        summary = counting.run_metrics(report, calibration, task.higher_is_better, task.setup.normalisation)
        # a run scored mid-run: its curve ends at its own score
        self.during.ended(self.budget.steps, report, self.spent)
        recorder.log_metrics(
            {
                **summary,
                **report.metrics,
                **self.spent,
                Metric.PREPARE_TIME_S: self.prepare_time,
                Metric.SCORE_TIME_S: score_time,
                Metric.WALL_TIME_S: time.monotonic() - self.run_started,
                **self.clock.metrics(),
            }
        )
        recorder.set_tags(
            {
                Tag.STATUS: status,
                Tag.STOP_REASON: outcome.stop_reason or "",
                Tag.AGENT_MESSAGE: outcome.message[:5000],
                Tag.VALID: report.valid,
                Tag.INVALID_REASON: "" if report.valid else report.reason,
                Tag.READ_ONLY_RESTORED: ", ".join(self.restored),
                Tag.MODELS_USED: ",".join(sorted(self.calls.models_used)) if self.calls else "",
                **counting.counted_tags(
                    report,
                    calibration,
                    task.higher_is_better,
                    plumbing=is_plumbing(task),
                    normalisation=task.setup.normalisation,
                ),
                **(self.steps.tags() if self.steps is not None else {}),
            }
        )
        with self.clock.stage("recording"):  # read from what the run folder holds now; never fails the run
            review_at_end(self.run_dir, recorder, self.plan.review)
        return RunResult(
            run_id=recorder.run_id,
            name=self.plan.name,
            status=status,
            valid=report.valid,
            reason=report.reason,
            score=report.score,
            normalised_score=summary.get(Metric.NORMALISED_SCORE),
            run_dir=str(self.run_dir),
        )


def resumed_workspace(start_files: Path, work: Path, snapshot_root: Path) -> tuple[workspace.Snapshot, str]:
    """A resumed run's workspace: the folder as the agent left it when it survived, else its
    last step's snapshot (or its starting files, before any step). Returns the starting state
    (what the run's patch is taken against) and how the workspace was found."""
    before = workspace.starting_state(start_files)
    if work.is_dir():
        return before, "as it was"
    steps = snapshots.load_steps(snapshot_root)
    if not steps:
        workspace.prepare(start_files, work)
        return before, "from its starting files"
    snapshots.materialise(snapshot_root, steps[-1], start_files, work)
    return before, f"from step {steps[-1]['step']}'s snapshot"


def record_assets(recorder, fingerprint: str) -> None:
    """Which assets the run used: a tag (what rescoring checks), and a param, which the MLflow
    UI's runs table compares runs by. A param cannot change: a retried job whose assets were
    rebuilt since its first attempt keeps the first param, and its tag says what it used."""
    recorder.set_tags({Tag.ASSETS_FINGERPRINT: fingerprint})
    if recorder.attempt == 1 or ASSETS_PARAM not in recorder.logged_params():
        recorder.log_params({ASSETS_PARAM: fingerprint})
