"""Sweeps: `python -m mlrb -m ...`, launched through submitit locally or on SLURM.

Hydra's sweeper expands the command line into jobs and hands them to one of
these launchers (chosen with `launcher=local` or `launcher=slurm`), which:

- compose each job's config, to know its run key, experiment and resources;
- open the sweep's MLflow parent run (the same one again when the same sweep
  is launched again), whose id and sweep id reach each job through the environment;
- skip jobs whose run key already has a FINISHED run, so a re-launched sweep
  finishes only what is missing;
- run the rest through submitit: locally at most `slots` jobs at once, each slot
  with its own GPUs; on SLURM as job arrays whose time, GPUs, CPUs and memory
  follow each job's budget and task, within a cluster profile from mlrb/launchers/;
- show progress while they wait; a job that fails is recorded as failed and the
  others go on.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from mlrb import sweep_summary, sync
from mlrb.core import run_names
from mlrb.core.config import ConfigError, MlrbConfig, TrackingConfig, names_the_seed, split_seed, to_typed
from mlrb.core.messages import first_line
from mlrb.core.status import MlflowStatus
from mlrb.core.tags import SWEEP_ROLE, Metric, Tag
from mlrb.harness.plan import experiment_name, run_key, run_name
from mlrb.run_files import resume
from mlrb.store import experiment_view, record, recording_process, recording_server, tracking
from mlrb.tasks.harbor import dataset as harbor_dataset

log = logging.getLogger(__name__)


class HideSacctNoise(logging.Filter):
    """Clusters without SLURM accounting make submitit warn on every status poll;
    the jobs' states still arrive (from squeue), so keep the terminal readable."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Bypassing sacct error" not in record.getMessage()


PROFILES_DIR = Path(__file__).resolve().parent / "launchers"  # cluster profiles, shipped inside the package


@dataclass
class SweepJob:
    idx: int
    overrides: list[str]
    name: str
    key: str
    experiment: str
    tracking: TrackingConfig
    wall_time_s: float
    gpus: int
    cpus: int | None
    memory_gb: float | None


class Progress:
    """One line each time the counts change: never a silent wait. The ETA is the time
    per finished job so far (slots working in parallel included) times the jobs left."""

    def __init__(self, sweep_id: str, total: int, skipped: int):
        self.sweep_id, self.total, self.skipped = sweep_id, total, skipped
        self.last: tuple[int, ...] | None = None
        self.started = time.monotonic()

    def show(self, queued: int, running: int, done: int, failed: int) -> None:
        counts = (queued, running, done, failed)
        if counts != self.last:
            self.last = counts
            print(
                f"[sweep {self.sweep_id}] {self.total} jobs: {self.skipped} already finished, "
                f"{queued} queued, {running} running, {done} done, {failed} failed"
                f"{self.eta(done + failed, queued + running)}",
                flush=True,
            )

    def eta(self, ended: int, left: int) -> str:
        if not ended or not left:
            return ""
        seconds = (time.monotonic() - self.started) / ended * left
        return f"; ETA {seconds / 60:.0f} min" if seconds >= 90 else f"; ETA {seconds:.0f} s"


def finished_before(jobs: list[SweepJob], sweep_id: str, sweep_dir: Path) -> dict[int, str | None]:
    """Each job's run that finished in an earlier launch of the sweep (in the store, or in its run
    folder while the store was away: its record synced now), by job index; None: to run. Says so
    for each job skipped."""
    finished = {j.idx: find_finished(j) for j in jobs}
    folders = resume.folders_by_job(sweep_dir.parent, sweep_id)  # every launch's run folders, by job
    for job in jobs:
        if finished[job.idx]:
            print(f"[sweep {sweep_id}] #{job.idx} {job.name}: finished before (run {finished[job.idx]}), skipped")
        elif synced := sync_ended_offline(job, folders.get(job.key, [])):  # ended while the store was away
            finished[job.idx] = synced
            print(
                f"[sweep {sweep_id}] #{job.idx} {job.name}: finished before while the store was away; "
                f"its record synced (run {synced}), skipped"
            )
    return finished


def end_without_teardown(result: Path) -> None:
    """At the exit of a job's process (an atexit handler, registered once its job succeeded, so it
    runs before the others): once submitit has saved the job's result as a success, end the process
    as `python -m mlrb` ends a single run (cli.end_process), without the interpreter's teardown. That
    teardown (freeing every module and object) took a job 0.2-1.2 s on 2 cores, while its slot waited
    to start the next job. Anything else (no result, an error saved) ends as usual, with its own status.
    Python waited for the process's other threads before it called this."""
    import pickle

    try:
        with open(result, "rb") as saved:
            outcome = pickle.load(saved)[0]
    except Exception:  # noqa: BLE001 - no result to go by: the usual exit
        return
    if outcome != "success":
        return
    recording_process.stop()  # every write was answered: the recording process ends
    logging.shutdown()  # flushes and closes every handler
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def job_returns(
    jobs: list[SweepJob], finished: dict[int, str | None], outcomes: dict[int, tuple[bool, Any]]
) -> list[JobReturn]:
    """What Hydra gets back for each job: skipped (finished before), its return, or its failure."""
    returns = []
    for job in jobs:
        ret = JobReturn(overrides=job.overrides, status=JobStatus.COMPLETED)
        if finished[job.idx]:
            ret.return_value = {"run_id": finished[job.idx], "status": "skipped"}
        else:
            ok, value = outcomes[job.idx]
            if ok:
                ret = value
            else:
                ret.status, ret.return_value = JobStatus.FAILED, value
        returns.append(ret)
    return returns


class SweepLauncher(BaseSubmititLauncher):
    """Shared by the local and SLURM launchers; subclasses implement `run_jobs`.

    hydra-submitit-launcher's base class supplies what runs in each job's process
    (`__call__`: compose the job's config and run it) and the requeue on a SLURM
    timeout or preemption (`checkpoint`); a requeued job finds its unfinished MLflow
    run again by its run key and sweep id (see run.execute). `launch` is mlrb's own.
    """

    # ---- in each job's process ------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        # MLflow's imports start now, in the recording process, while the job's config is composed
        # and its harness loads, as `python -m mlrb` starts it for a single run (a SLURM job has no
        # sweep's recording server to fork it, and waits for those imports before its run opens).
        recording_process.start()
        ret = super().__call__(*args, **kwargs)
        if ret.status == JobStatus.FAILED:
            ret.return_value  # noqa: B018 - raises the job's exception, so the launcher sees it as the job's failure
        if os.environ.get("SUBMITIT_FOLDER"):  # in submitit's job process (it sets this), not a caller's
            import submitit

            atexit.register(end_without_teardown, submitit.JobEnvironment().paths.result_pickle)
        return ret

    # ---- in the launching process ---------------------------------------------------
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        started = time.monotonic()
        if not self.config.get("verbose"):
            logging.getLogger("mlflow").setLevel(logging.WARNING)  # "creating database tables" and the like
        # What the sweep tells each job, as config (`sweep` in mlrb/core/config.py): the keys its run's name ends
        # with, then, once known, the sweep's id and parent run.
        try:  # a dataset of Harbor tasks (task.path=DIR/*): one job per task folder
            job_overrides = harbor_dataset.expand(job_overrides)
        except ConfigError as e:
            print(f"mlrb: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        self.facts = [f"sweep.name_keys=[{','.join(run_names.extra_name_keys(job_overrides))}]"]
        jobs = self.describe_all(initial_job_idx, job_overrides)
        try:  # refused before anything starts or is recorded: one line, no traceback
            problem = self.gpu_problem(jobs)
            if problem:
                raise ConfigError(problem)
            self.check_tracking(jobs[0].tracking)
            tracking.check_store(jobs[0].tracking)
        except ConfigError as e:
            print(f"mlrb: error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
        sweep_id = hashlib.sha256(" ".join(sorted(j.key for j in jobs)).encode()).hexdigest()[:12]
        client, _ = tracking.client_for(jobs[0].tracking)
        parent_name = run_names.sweep_name(job_overrides, jobs[0].name)
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).resolve()
        parent = open_parent_run(client, jobs[0], sweep_id, parent_name, len(jobs), sweep_dir)
        parent_id, parent_experiment = parent.store_run.wait_opened()  # its jobs' runs name it as their parent
        finished = finished_before(jobs, sweep_id, sweep_dir)
        todo = [j for j in jobs if not finished[j.idx]]
        self.facts += sweep_facts(sweep_id, parent_id)

        progress = Progress(sweep_id, len(jobs), len(jobs) - len(todo))
        try:
            outcomes = self.run_jobs(todo, progress) if todo else {}
        except SweepInterrupted as e:  # its jobs stopped and recorded themselves: one line, no traceback
            parent.finish(MlflowStatus.KILLED)
            print(
                f"mlrb: sweep {sweep_id} interrupted by {signal.Signals(e.signum).name}; {e}; launch the same "
                f"command again to run what is not finished",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(128 + e.signum)  # as a shell reports a process ended by that signal
        except BaseException as e:  # never leave the sweep's run RUNNING (Ctrl-C: KILLED)
            parent.finish(MlflowStatus.FAILED if isinstance(e, Exception) else MlflowStatus.KILLED)
            raise
        failed = [idx for idx, (ok, _) in outcomes.items() if not ok]
        away: str | None = None
        try:
            for job in todo:  # a job that ended while the store was away (a restart): its record, uploaded now
                if run_dir := store_missed(outcomes[job.idx]):
                    log.info(sync.sync_run(client, tracking.client_for(job.tracking)[1], run_dir))
            summary = sweep_summary.summarise(
                client,
                parent_experiment,
                jobs[0].experiment,
                sweep_id,
                parent_name,
                parent_id,
                tracking.store_location(jobs[0].tracking)[0],
                time.monotonic() - started,
                others=job_experiments(client, jobs),
            )
            parent.log_metrics(
                {
                    Metric.JOBS: len(jobs),
                    Metric.JOBS_SKIPPED: len(jobs) - len(todo),
                    Metric.JOBS_FAILED: len(failed),
                    Metric.JOBS_DONE: len(todo) - len(failed),
                    **summary.metrics,
                }
            )
        except Exception as e:
            if not tracking.store_unreachable(e):
                raise
            away = first_line(e)
        parent.finish(MlflowStatus.FAILED if failed else MlflowStatus.FINISHED)
        away = away or parent.store_error
        if away:  # the runs' records are whole in their folders: nothing is lost
            print(
                f"[sweep {sweep_id}] the tracking store cannot be reached ({away}); each run's record "
                f"is whole in its run folder: launch the sweep again once the store is back, and it uploads "
                f"them instead of running them again",
                flush=True,
            )
        else:
            print(summary.text, flush=True)

        return job_returns(jobs, finished, outcomes)

    def check_tracking(self, cfg: TrackingConfig) -> None:
        """Whether this launcher's jobs can share the tracking store (raise ConfigError if not)."""

    def describe_all(self, first_idx: int, job_overrides: Sequence[Sequence[str]]) -> list[SweepJob]:
        """Each job's config, composed once per configuration: jobs that differ only in their seed
        (`-m seed=1,2,3`, a lab's five seeds) share one composition with the seed set after it, as
        Hydra sets a value, unless the config names the seed in an interpolation (then each job is
        composed on its own). A composition takes most of a second: a sweep of 105 jobs spent 108 s
        composing before its first job started."""
        by_configuration: dict[tuple[str, ...], MlrbConfig] = {}
        jobs = []
        for i, overrides in enumerate(job_overrides):
            rest, seed = split_seed(overrides)
            if seed is not None and rest in by_configuration:
                cfg = dataclasses.replace(by_configuration[rest], seed=seed)
            else:
                composed = self.compose(list(overrides))
                cfg = to_typed(composed)
                if seed is not None and not names_the_seed(composed):
                    by_configuration[rest] = cfg
            jobs.append(self.describe(first_idx + i, list(overrides), cfg))
        return jobs

    def compose(self, overrides: list[str]) -> DictConfig:
        assert self.hydra_context is not None and self.config is not None
        return self.hydra_context.config_loader.load_sweep_config(self.config, overrides + self.facts)

    def describe(self, idx: int, overrides: list[str], cfg: MlrbConfig) -> SweepJob:
        hw = cfg.task.scales[cfg.task.scale].get("hardware", {}) or {}
        return SweepJob(
            idx=idx,
            overrides=overrides,
            name=run_name(cfg),
            key=run_key(cfg),
            experiment=experiment_name(cfg),
            tracking=cfg.tracking,
            wall_time_s=cfg.budget.wall_time_s,
            gpus=int(hw.get("gpus") or 0),
            cpus=hw.get("cpus"),
            memory_gb=hw.get("memory_gb"),
        )

    def submission(self, job: SweepJob) -> tuple:
        """The arguments submitit pickles for one job (see __call__)."""
        return (job.overrides + self.facts, "hydra.sweep.dir", job.idx, f"job_id_for_{job.idx}", Singleton.get_state())

    def gpu_problem(self, jobs: list[SweepJob]) -> str:
        """Why the sweep's GPU request cannot be met here ("" when it can)."""
        return ""

    @abc.abstractmethod
    def run_jobs(self, jobs: list[SweepJob], progress: Progress) -> dict[int, tuple[bool, Any]]:
        """Run the jobs to their end; job index -> (True, JobReturn) or (False, why it failed)."""

    @staticmethod
    def collect(submitted, job: SweepJob) -> tuple[bool, Any]:
        """(True, JobReturn) or (False, the reason the job failed)."""
        try:
            ret = submitted.result()
        except Exception as e:  # the job's process died (killed, out of memory, requeue limit, ...)
            log.error("job #%d %s failed: %s", job.idx, job.name, str(e).splitlines()[0] if str(e) else e)
            return False, RuntimeError(f"job #{job.idx} {job.name} failed: {str(e)[:2000]}")
        return True, ret


def open_parent_run(
    client: Any, first: SweepJob, sweep_id: str, name: str, n_jobs: int, folder: Path
) -> record.RecordedRun:
    """The sweep's parent run, recorded as a run is, in FOLDER's record (the sweep's folder):
    found again in the store by its sweep id when the sweep is re-launched."""
    _, artifact_root = tracking.client_for(first.tracking)
    exp = tracking.experiment_id(client, first.experiment, artifact_root)
    experiment_view.open_on_runs_table(client, exp)
    tags = {Tag.ROLE: SWEEP_ROLE, Tag.SWEEP_ID: sweep_id}
    found = tracking.find_runs(client, exp, tags)
    if found:  # launched again: the same run, one attempt more (one recorded before mlrb made run ids: by the store's)
        run_id = found[0].data.tags.get(Tag.RUN_ID) or found[0].info.run_id
        attempt = int(found[0].data.tags.get(Tag.ATTEMPT, "1")) + 1
    else:
        run_id, attempt = record.new_run_id(), 1
    command = " ".join(filter_overrides(sys.argv[1:]))
    opening = {
        **tags,
        Tag.N_JOBS: str(n_jobs),
        Tag.COMMAND: command[:5000],
        Tag.RUN_DIR: str(folder),
        **tracking.harness_commit(),
    }
    recording = recording_process.start()
    folder.mkdir(parents=True, exist_ok=True)
    return record.RecordedRun(
        recording.store_run(first.tracking), folder, first.experiment, name, opening, run_id, attempt
    )


def job_experiments(client: Any, jobs: list[SweepJob]) -> dict[str, str]:
    """Each experiment the sweep's runs are recorded in (a sweep over tasks has one per task): id -> name."""
    _, artifact_root = tracking.client_for(jobs[0].tracking)
    names = sorted({job.experiment for job in jobs})
    return {tracking.experiment_id(client, name, artifact_root): name for name in names}


def find_finished(job: SweepJob) -> str | None:
    client, artifact_root = tracking.client_for(job.tracking)
    exp = tracking.experiment_id(client, job.experiment, artifact_root)
    done = tracking.find_runs(client, exp, {Tag.RUN_KEY: job.key}, [MlflowStatus.FINISHED])
    return done[0].info.run_id if done else None


def store_missed(outcome: tuple[bool, Any]) -> Path | None:
    """The run folder of a job whose run ended saying the store did not get all of it (its
    result's store_error); None for any other."""
    ok, ret = outcome
    value = getattr(ret, "return_value", None) if ok else None
    if isinstance(value, dict) and value.get("store_error") and value.get("run_dir"):
        return Path(value["run_dir"])
    return None


def sweep_facts(sweep_id: str, parent_id: str) -> list[str]:
    """The overrides that tell each job its sweep and parent run: quoted, since an id such as
    941305e46523 would be read as a number (here, infinity), and the job then knows no sweep."""
    return [f"sweep.id='{sweep_id}'", f"sweep.parent_run_id='{parent_id}'"]


def sync_ended_offline(job: SweepJob, folders: list[Path]) -> str | None:
    """This job's run, found in its run folders of the sweep's launches (FOLDERS, newest first),
    when its record ended FINISHED but the store does not hold it so (the store went away during
    it, mlrb/store/record.py): its record synced into the store; the store's run id, or None when there
    is no such run."""
    client, artifact_root = tracking.client_for(job.tracking)
    for folder in folders:
        state = resume.ended_state(folder)
        if state is None or state["status"] != MlflowStatus.FINISHED:
            continue
        log.info(sync.sync_run(client, artifact_root, folder))
        stored = tracking.find_run(client, state["run_id"])
        return stored.info.run_id if stored is not None else None
    return None


def visible_devices(devices: list[Any] | None) -> list[int]:
    if devices is not None:
        return [int(d) for d in devices]
    env = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return [int(d) for d in env.split(",") if d.strip()]


def slot_devices(slots: int, gpus_per_job: int, devices: list[int]) -> list[list[int]]:
    """Share the machine's GPUs out to the slots, each its own: never two jobs on one GPU."""
    if gpus_per_job == 0:
        return [[] for _ in range(slots)]
    if slots * gpus_per_job > len(devices):
        raise ValueError(
            f"launcher: {slots} slots x {gpus_per_job} GPU(s) need {slots * gpus_per_job} GPUs "
            f"but {len(devices)} are visible ({devices}); lower hydra.launcher.slots or set hydra.launcher.devices"
        )
    return [devices[i * gpus_per_job : (i + 1) * gpus_per_job] for i in range(slots)]


class LocalSweepLauncher(SweepLauncher):
    """submitit's local executor, with a cap on concurrent jobs and a GPU set per slot. The jobs,
    and this process for the sweep's parent run, record through processes forked by this process's
    recording server (mlrb/store/recording_server.py)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        server = recording_server.start(recording_process.main)
        if server:
            os.environ[recording_server.ADDRESS_VAR] = server.address  # submitit hands it to every job
        try:
            return super().launch(job_overrides, initial_job_idx)
        finally:
            os.environ.pop(recording_server.ADDRESS_VAR, None)
            recording_process.stop()  # the parent run's, ended before its server waits for its forks to end
            if server:
                server.close()

    def gpu_problem(self, jobs: list[SweepJob]) -> str:
        slots, gpus_per_job = int(self.params.get("slots", 1)), int(self.params.get("gpus_per_job", 0))
        try:
            slot_devices(slots, gpus_per_job, visible_devices(self.params.get("devices")))
        except ValueError as e:
            return str(e)
        return ""

    def run_jobs(self, jobs: list[SweepJob], progress: Progress) -> dict[int, tuple[bool, Any]]:
        import submitit

        slots = int(self.params.get("slots", 1))
        gpus_per_job = int(self.params.get("gpus_per_job", 0))
        free = deque(enumerate(slot_devices(slots, gpus_per_job, visible_devices(self.params.get("devices")))))
        queue, outcomes = deque(jobs), {}
        running: dict[int, tuple[Any, SweepJob, tuple[int, list[int]]]] = {}
        with Stops() as stops:
            try:
                while queue or running:
                    while queue and free:
                        slot, gpus = free.popleft()
                        job = queue.popleft()
                        executor = submitit.LocalExecutor(folder=self.params["submitit_folder"])
                        executor.update_parameters(
                            timeout_min=self.params.get("timeout_min") or job_minutes(job, 10),
                            gpus_per_node=len(gpus),
                            visible_gpus=tuple(gpus),  # this slot's GPUs only: CUDA_VISIBLE_DEVICES in the job
                        )
                        with stops.held(), jobs_started_apart():
                            running[job.idx] = (executor.submit(self, *self.submission(job)), job, (slot, gpus))
                    for idx, (submitted, job, held) in list(running.items()):
                        if submitted.done():
                            outcomes[idx] = self.collect(submitted, job)
                            free.append(held)
                            del running[idx]
                    failed = sum(not ok for ok, _ in outcomes.values())
                    progress.show(len(queue), len(running), len(outcomes) - failed, failed)
                    time.sleep(0.5)
            except KeyboardInterrupt:
                stop_jobs([submitted for submitted, _, _ in running.values()], stops.last, progress.sweep_id)
                stopped = f"{len(running)} running jobs stopped and recorded as killed, {len(queue)} not started"
                raise SweepInterrupted(stopped, stops.first) from None
        return outcomes


class SweepInterrupted(Exception):
    """A Ctrl-C (or SIGTERM, SIGHUP) stopped a local sweep once its running jobs had recorded
    themselves."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class InOwnProcessGroup:
    """`subprocess` as submitit's local executor sees it while it starts a job's controller:
    its Popen starts a process group of its own, so the controller and its job are not in the
    sweep's (see `jobs_started_apart`), and reads nothing from the terminal (a process outside
    its foreground group that tried would be stopped)."""

    def __init__(self, module: Any):
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)

    def Popen(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - subprocess's name
        return self.module.Popen(*args, **{"stdin": self.module.DEVNULL, **kwargs, "process_group": 0})


@contextlib.contextmanager
def jobs_started_apart() -> Iterator[None]:
    """Start a local job's processes outside this process's group. A terminal's Ctrl-C reaches
    its whole foreground group, and submitit's local controller answers it by killing its job
    a second later, before the job has recorded its run: apart, the job is stopped by this
    process alone (`stop_jobs`), as a single run is by a Ctrl-C."""
    from submitit.local import local

    started_by = local.subprocess
    setattr(local, "subprocess", InOwnProcessGroup(started_by))  # noqa: B010 - a module's global, for a while
    try:
        yield
    finally:
        setattr(local, "subprocess", started_by)  # noqa: B010


class Stops:
    """While a local sweep's jobs run, SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt (the
    last two would end this process at once and leave its jobs running), except while held:
    then once the held block is done, so that no job is started and left unknown."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.came: list[int] = []
        self.holding = False
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> Stops:
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored (nohup, a background job): kept
                self.previous[signum] = signal.signal(signum, self.stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def stop(self, signum: int, frame: Any) -> None:
        self.came.append(signum)
        if not self.holding:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding, pending = True, len(self.came)
        try:
            yield
        finally:
            self.holding = False
        if len(self.came) > pending:
            raise KeyboardInterrupt

    @property
    def first(self) -> int:
        return self.came[0] if self.came else signal.SIGINT

    @property
    def last(self) -> int:
        return self.came[-1] if self.came else signal.SIGINT


def stop_jobs(jobs: list[Any], signum: int, sweep_id: str) -> None:
    """Hand these running jobs the signal this process got, as a terminal hands it to a single
    run (each records its run as killed, its workspace scored), and wait for them to end. A
    further one is handed on too (a run then stops scoring)."""
    print(
        f"[sweep {sweep_id}] stopping {len(jobs)} running jobs: each records its run as killed "
        f"(Ctrl-C again to stop their scoring)",
        flush=True,
    )
    with Stops() as stops:
        signal_jobs(jobs, signum)
        while not all(job.done() for job in jobs):
            try:
                time.sleep(0.5)
            except KeyboardInterrupt:
                signal_jobs(jobs, stops.last)


def signal_jobs(jobs: list[Any], signum: int) -> None:
    """Signal each job's own process: the child of its submitit controller, whose id is the
    controller's PID (the controller would kill its job a second after a SIGINT of its own).
    A SIGTERM goes as SIGINT: in a job's process submitit lets a SIGTERM pass (SLURM sends one
    before a pre-emption), so the run would not stop."""
    if signum == signal.SIGTERM:
        signum = signal.SIGINT
    for job in jobs:
        try:
            tasks = Path(f"/proc/{job.job_id}/task")
            children = [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # it has ended
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def job_minutes(job: SweepJob, overhead_min: float) -> int:
    """A job's time limit: its budget's wall time plus room for assets and scoring."""
    return int(math.ceil(job.wall_time_s / 60 + overhead_min))


def chain_of(job: SweepJob, profile: dict[str, Any]) -> tuple[int, int]:
    """The time limit of each of a run's SLURM jobs, and how many jobs its run needs: one, or
    a chain when its budget and overhead are longer than the partition allows a job
    (`time_limit_min`). Each job of a chain stops at submitit's time-limit signal, is requeued,
    and its run goes on where it was (mlrb/run_files/resume.py); the agent's clock runs only while it works."""
    needed = job_minutes(job, profile.get("overhead_min", 10))
    limit = profile.get("time_limit_min")
    if not limit or needed <= limit:
        return needed, 1
    # Each job loses its start-up and the time between the signal and its end to the chain.
    usable = limit - profile.get("signal_delay_s", 120) / 60 - CHAIN_JOB_START_MIN
    if usable <= 0:
        raise ConfigError(
            f"launcher: the cluster profile's time_limit_min ({limit}) leaves no time for a run's "
            f"work after its signal_delay_s ({profile.get('signal_delay_s', 120)} s) and a job's "
            f"start ({CHAIN_JOB_START_MIN} min): give a longer time limit or a shorter signal delay"
        )
    return int(limit), int(math.ceil(needed / usable))


CHAIN_JOB_START_MIN = 1.0  # a chained job's own start: the harness, the asset check, the sandbox


def squeue_states() -> dict[str, str]:
    """Job id (array tasks as "123_4") -> state, from squeue (works without accounting)."""
    import subprocess

    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.split(maxsplit=1) for line in out.stdout.splitlines() if " " in line)


def load_profile(name_or_path: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
        raise ValueError(f"launcher: no cluster profile '{name_or_path}' (known in {PROFILES_DIR}: {known})")
    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(path), resolve=True))


class SlurmSweepLauncher(SweepLauncher):
    """hydra-submitit's way (submitit's SLURM executor, one job array per kind of job),
    with each job's resources taken from its budget and task within a cluster profile."""

    def check_tracking(self, cfg: TrackingConfig) -> None:
        warning = tracking.check_cluster_store(cfg)  # jobs on many nodes: SQLite refused unless insisted on
        if warning:
            print(f"mlrb: warning: {warning}", file=sys.stderr, flush=True)

    def resources(self, job: SweepJob, profile: dict[str, Any]) -> dict[str, Any]:
        cpus = min(job.cpus or 1, profile.get("max_cpus_per_job") or job.cpus or 1)
        memory = job.memory_gb or profile.get("default_mem_gb") or 4
        if profile.get("max_mem_gb"):
            memory = min(memory, profile["max_mem_gb"])
        minutes, _ = chain_of(job, profile)
        params = {
            "timeout_min": minutes,
            "gpus_per_node": job.gpus,
            "cpus_per_task": int(cpus),
            "mem_gb": int(math.ceil(memory)),
            "slurm_partition": profile.get("partition"),
            "slurm_array_parallelism": profile.get("array_parallelism", 64),
            "slurm_signal_delay_s": profile.get("signal_delay_s", 120),
        }
        for key in ("account", "qos", "constraint", "exclude", "gres", "setup", "additional_parameters"):
            if profile.get(key):
                params[f"slurm_{key}"] = profile[key]
        return params

    def gpu_problem(self, jobs: list[SweepJob]) -> str:
        try:
            profile = load_profile(str(self.params.get("cluster", "local_single_node")))
        except ValueError as e:
            return str(e)
        try:
            for job in jobs:
                chain_of(job, profile)
        except ConfigError as e:
            return str(e)
        most = profile.get("max_gpus_per_job")
        greedy = [job for job in jobs if most is not None and job.gpus > most]
        if greedy:
            return (
                f"launcher: job #{greedy[0].idx} {greedy[0].name} needs {greedy[0].gpus} GPU(s) but the cluster "
                f"profile's partition '{profile.get('partition')}' has at most {most} per job (max_gpus_per_job); "
                "use a profile with more, or a task scale that needs fewer"
            )
        return ""

    def run_jobs(self, jobs: list[SweepJob], progress: Progress) -> dict[int, tuple[bool, Any]]:
        import submitit

        profile = load_profile(str(self.params.get("cluster", "local_single_node")))
        groups: dict[str, list[SweepJob]] = {}
        for job in jobs:
            groups.setdefault(repr(sorted(self.resources(job, profile).items())), []).append(job)
        submitted: list[tuple[Any, SweepJob]] = []
        for group in groups.values():
            links = max(chain_of(job, profile)[1] for job in group)
            executor = submitit.AutoExecutor(
                folder=self.params["submitit_folder"],
                cluster="slurm",
                slurm_max_num_timeout=int(profile.get("max_requeues", 3)) + links - 1,  # a chain's links are time-outs
            )
            executor.update_parameters(name="mlrb", **self.resources(group[0], profile))
            array = executor.map_array(self, *zip(*(self.submission(job) for job in group), strict=True))
            submitted.extend(zip(array, group, strict=True))
        logging.getLogger("submitit").addFilter(HideSacctNoise())
        outcomes: dict[int, tuple[bool, Any]] = {}
        while len(outcomes) < len(submitted):
            states = squeue_states()
            running = 0
            for handle, job in submitted:
                if job.idx in outcomes:
                    continue
                if handle.done():
                    outcomes[job.idx] = self.collect(handle, job)
                elif states.get(handle.job_id) == "RUNNING":
                    running += 1
            failed = sum(not ok for ok, _ in outcomes.values())
            progress.show(len(submitted) - len(outcomes) - running, running, len(outcomes) - failed, failed)
            time.sleep(1.0)
        return outcomes
