"""Sweeps through the launchers: real SLURM, local slots with their own GPUs,
resuming after a killed job, a Ctrl-C, and many jobs writing into one SQLite store."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    HARNESS_EXPERIMENT,
    HARNESS_SUBMISSION,
    HARNESS_TASK,
    PLUMBING,
    compose_config,
    mlflow_client,
    printed,
    run_cli,
    store_args,
)
from mlrb.sweep import slot_devices, sweep_facts

# A quick job: the agent hands in nothing, so no model is scored. The integration tier's sweeps run
# at the plumbing scale (PLUMBING), which extends tiny: an override of tiny's values is theirs too.
QUICK = "task.scales.tiny.baseline_command='echo GPU=$CUDA_VISIBLE_DEVICES'"
# Sweeps whose task is incidental run the cheapest real task (conftest's HARNESS_TASK), each job's agent
# a command of the sweep's (`agent=command`: the task's baseline command would change what its baseline
# anchor measures). It calls no model; the proxy it is given needs a key all the same.
HARNESS = [*HARNESS_TASK, "agent=command"]
KEY = {"ANTHROPIC_API_KEY": "sk-ant-sweeps-unused"}


def sweep_args(tmp_path, cache_dir):
    args = store_args(tmp_path, cache_dir)
    return [a for a in args if not a.startswith("hydra.run.dir")] + [f"hydra.sweep.dir={tmp_path / 'sweep'}"]


def runs_by_role(tmp_path, experiment="llm_merging"):
    client = mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlrb.role") != "sweep"]
    return client, parents, children


@functools.cache  # asked once: with the controller down, sinfo waits for it
def slurm_problem() -> str:
    if not shutil.which("sinfo"):
        return "needs SLURM (sinfo not found): bash launchers/slurm/setup_single_node.sh"
    if not shutil.which("pgrep") or subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode:
        return "needs SLURM's controller (slurmctld is not running): bash launchers/slurm/setup_single_node.sh"
    try:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30).stdout
    except subprocess.TimeoutExpired:
        return "needs SLURM's controller to answer (sinfo waited 30 s): bash launchers/slurm/setup_single_node.sh"
    if not any(s in state for s in ("idle", "mix", "alloc")):
        return f"needs a SLURM node up (sinfo says {state.strip()!r}): bash launchers/slurm/setup_single_node.sh"
    return ""


@pytest.mark.system
@pytest.mark.skipif(bool(slurm_problem()), reason=slurm_problem() or "slurm ok")
def test_a_three_seed_sweep_on_slurm_gives_three_finished_runs_under_one_parent(tmp_path, built_cache):
    # SQLite on this one-node cluster's local disk: safe here, so the user insists
    result = run_cli(
        "-m", "seed=1,2,3", "launcher=slurm", "task.scales.tiny.hardware.cpus=1", "tracking.allow_sqlite_on_slurm=true",
        *sweep_args(tmp_path, built_cache), cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("mlrb: warning: launcher=slurm")]
    assert (
        "SQLite on a shared filesystem loses writes under concurrent jobs" in warning and "tracking=server" in warning
    )
    _, parents, children = runs_by_role(tmp_path)
    (parent,) = parents
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_done"] == 3
    assert sorted(r.info.run_name for r in children) == [f"llm_merging/baseline/smoke/{s}" for s in (1, 2, 3)]
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["mlrb.valid"] == "True"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["mlrb.sweep_id"] == parent.data.tags["mlrb.sweep_id"]
    assert "3 jobs:" in result.stdout and "3 done, 0 failed" in result.stdout  # progress was shown
    submitit_logs = list((tmp_path / "sweep" / ".submitit").rglob("*_log.out"))
    assert submitit_logs, "the jobs ran through SLURM (sbatch) via submitit"


@pytest.mark.integration
def test_local_slots_get_distinct_gpus(tmp_path, cache_dir):
    result = run_cli(
        "-m", "seed=1,2,3,4", *HARNESS,
        f"agent.options.command='echo GPU=$CUDA_VISIBLE_DEVICES; {HARNESS_SUBMISSION} > /dev/null'",
        "task.scales.folder.hardware.gpus=1",
        "hydra.launcher.slots=2", "hydra.launcher.gpus_per_job=1", "hydra.launcher.devices=[6,7]",
        *sweep_args(tmp_path, cache_dir), cwd=tmp_path, env=KEY, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client, _, children = runs_by_role(tmp_path, HARNESS_EXPERIMENT)
    seen = []
    for run in children:
        path = client.download_artifacts(run.info.run_id, "trajectory.jsonl", str(tmp_path / run.info.run_id))
        events = [json.loads(line) for line in open(path)]
        (stdout,) = [printed(e) for e in events if e["event"] == "tool_result"]
        seen.append((run.info.start_time, run.info.end_time, stdout.strip()))
    assert sorted(s for _, _, s in seen) == ["GPU=6", "GPU=6", "GPU=7", "GPU=7"]
    # jobs that overlapped in time never shared a GPU
    for a in seen:
        for b in seen:
            if a is not b and a[0] < b[1] and b[0] < a[1]:
                assert a[2] != b[2]


@pytest.mark.fast
def test_more_slots_than_gpus_is_refused():
    assert slot_devices(2, 1, [0, 1]) == [[0], [1]]
    assert slot_devices(3, 0, []) == [[], [], []]
    with pytest.raises(ValueError, match="2 slots x 2 GPU.*need 4 GPUs but 3 are visible"):
        slot_devices(2, 2, [0, 1, 2])


@pytest.mark.fast
def test_jobs_that_differ_in_their_seed_alone_are_told_apart_as_if_each_were_composed(monkeypatch):
    """A sweep composes each configuration once and sets the seed of the jobs that differ only in it:
    each job's name, run key, experiment, store and resources are the ones its own composition gives."""
    from types import SimpleNamespace

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb.cli import CONF_DIR
    from mlrb.core.config import register_schema, to_typed
    from mlrb.sweep import LocalSweepLauncher

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-the-test")
    register_schema()
    GlobalHydra.instance().clear()
    jobs = [[f"task={task}", f"agent={agent}", f"seed={seed}", "budget=1h", PLUMBING]
            for task in ("llm_merging", "math_reasoning") for agent in ("baseline", "claude") for seed in (1, 2, 30)]  # fmt: skip
    jobs.append(["task=llm_merging", "agent=baseline", "seed=2", "budget=smoke", PLUMBING])  # another budget
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        launcher = LocalSweepLauncher.__new__(LocalSweepLauncher)
        launcher.config = compose(config_name="config", return_hydra_config=True)
        launcher.hydra_context = SimpleNamespace(config_loader=GlobalHydra.instance().config_loader())
        launcher.facts = ["sweep.name_keys=[]"]
        composed = []
        launcher.compose = lambda overrides, compose=launcher.compose: composed.append(overrides) or compose(overrides)  # type: ignore[method-assign]
        shared = launcher.describe_all(0, jobs)
        each = [launcher.describe(i, job, to_typed(launcher.compose(job))) for i, job in enumerate(jobs)]
    GlobalHydra.instance().clear()
    assert shared == each
    assert len({job.key for job in shared}) == len(jobs)  # every job its own run
    assert [job.name for job in shared[:3]] == [f"llm_merging/baseline/1h/{seed}" for seed in (1, 2, 30)]
    assert len(composed) == 5 + len(jobs)  # describe_all: the 5 configurations; then each job on its own


@pytest.mark.fast
def test_a_config_that_names_the_seed_in_a_value_is_composed_for_each_job():
    from omegaconf import OmegaConf

    from mlrb.core.config import names_the_seed

    assert names_the_seed(OmegaConf.create({"seed": 1, "agent": {"note": "run ${seed}"}}))
    assert names_the_seed(OmegaConf.create({"seed": 1, "task": {"s": ["${oc.select:seed,0}"]}}))
    assert not names_the_seed(OmegaConf.create({"seed": 1, "hydra": {"dir": "${seed}"}, "seeds": "${seeds_x}"}))


@pytest.mark.fast
@pytest.mark.parametrize(
    ("saved", "exits", "torn_down"),
    [(("success", {"run_id": "r1"}), 0, False), (("error", "Traceback ..."), 3, True), (None, 3, True)],
    ids=["success", "error-saved", "nothing-saved"],
)
def test_a_job_s_process_ends_without_teardown_only_once_its_success_is_saved(tmp_path, saved, exits, torn_down):
    """A job's process (submitit's) skips the interpreter's teardown once submitit saved its result as a
    success, as `python -m mlrb` does for a single run; its output still arrives. A saved error, or no
    result, ends as usual, with the process's own exit status (here 3): what the launcher reads is never
    turned into a success."""
    import pickle

    result = tmp_path / "result.pkl"
    if saved:
        result.write_bytes(pickle.dumps(saved))
    marker = tmp_path / "torn-down"
    script = (
        "import atexit, sys, pathlib\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'the usual exit ran')\n"  # runs after ours
        "from mlrb.sweep import end_without_teardown\n"
        f"atexit.register(end_without_teardown, pathlib.Path({str(result)!r}))\n"
        "print('the job printed this', flush=False)\n"
        "sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout == "the job printed this\n", done.stderr[-2000:]
    assert (done.returncode, marker.exists()) == (exits, torn_down)


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_stops_a_local_sweep_in_one_line_once_its_running_jobs_are_recorded_as_killed(
    tmp_path, cache_dir, signum
):
    """A terminal's Ctrl-C (SIGINT to the whole process group), or a SIGTERM to the sweep's
    process alone (which its jobs get as SIGINT: submitit lets a job's SIGTERM pass)."""
    from test_failures_runs import as_in_a_terminal, running_with

    seconds = str(random.randrange(10**6, 10**7))
    command = f"(sleep {seconds} & echo $! > agent.started; wait)"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mlrb", "-m", "seed=1,2,3", "hydra.launcher.slots=2",
         *sweep_args(tmp_path, cache_dir), *HARNESS, f"agent.options.command='{command}'"],
        cwd=tmp_path, env={**os.environ, **KEY}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal,
        process_group=0,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while len(list((tmp_path / "sweep").glob("*/workspace/agent.started"))) < 2:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the two jobs' agents did not start"
        time.sleep(0.2)
    if signum == signal.SIGINT:
        os.killpg(sweep.pid, signum)  # a terminal's Ctrl-C: the sweep's whole process group
    else:
        os.kill(sweep.pid, signum)
    out, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 128 + signum and "Traceback" not in out + err, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith("mlrb:")]
    name = signal.Signals(signum).name
    assert re.fullmatch(rf"mlrb: sweep \w+ interrupted by {name}; 2 running jobs stopped and recorded as killed, 1 not "
                        r"started; launch the same command again to run what is not finished", line), line  # fmt: skip
    _, parents, children = runs_by_role(tmp_path, HARNESS_EXPERIMENT)
    assert [p.info.status for p in parents] == ["KILLED"]
    stopped = sorted((c.data.tags["mlrb.seed"], c.info.status, c.data.tags["mlrb.status"],
                      c.data.tags["mlrb.stop_reason"]) for c in children)  # fmt: skip
    assert stopped == [("1", "KILLED", "killed", "SIGINT"), ("2", "KILLED", "killed", "SIGINT")]
    deadline = time.monotonic() + 10
    while running_with(str(tmp_path)) and time.monotonic() < deadline:  # submitit's controllers and jobs
        time.sleep(0.2)
    assert running_with(str(tmp_path)) == [] and running_with(f"sleep\0{seconds}") == []


@pytest.mark.integration
def test_a_relaunched_sweep_finishes_only_what_is_missing(tmp_path, cache_dir):
    # Three jobs, one at a time; the second is killed with SIGKILL while it runs.
    commands = "agent.options.command='sleep 1; python train.py','sleep 15; python train.py','sleep 2; python train.py'"
    args = ["-m", *HARNESS, commands, *sweep_args(tmp_path, cache_dir)]
    first = subprocess.Popen(
        [sys.executable, "-m", "mlrb", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **KEY},
    )
    os.kill(wait_for_running_job(tmp_path, "sleep 15", timeout=240), signal.SIGKILL)
    out, _ = first.communicate(timeout=300)
    assert "2 done, 1 failed" in out, out[-3000:]  # the others went on

    second = run_cli(*args, cwd=tmp_path, env=KEY, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert second.stdout.count("finished before") == 2

    _, parents, children = runs_by_role(tmp_path, HARNESS_EXPERIMENT)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"  # the same sweep, the same parent
    assert len(children) == 3 and all(r.info.status == "FINISHED" for r in children)  # one run per job
    (retried,) = [r for r in children if r.data.tags.get("mlrb.attempt") == "2"]
    assert retried.data.params["agent.options.command"] == "sleep 15; python train.py"


@pytest.mark.integration
def test_a_relaunched_sweep_syncs_a_run_that_ended_while_the_store_was_away_instead_of_running_it_again(
    tmp_path, cache_dir
):
    # Two quick jobs; then the store is left as an outage leaves it (the server went away just after the
    # second run started, tests/test_tracking_server.py): that run unfinished, without its end. Its run
    # folder's record has the whole run.
    args = [
        "-m",
        *HARNESS,
        "agent.options.command='sleep 1; python train.py','sleep 2; python train.py'",
        *sweep_args(tmp_path, cache_dir),
    ]
    first = run_cli(*args, cwd=tmp_path, env=KEY, timeout=600)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    client, _, children = runs_by_role(tmp_path, HARNESS_EXPERIMENT)
    (cut,) = [r for r in children if r.data.params["agent.options.command"] == "sleep 2; python train.py"]
    client.update_run(cut.info.run_id, status="RUNNING")
    for tag in ("mlrb.status", "mlrb.valid", "mlrb.counted_as"):
        client.delete_tag(cut.info.run_id, tag)
    trajectory = Path(cut.data.tags["mlrb.run_dir"]) / "trajectory.jsonl"
    ran_at = trajectory.stat().st_mtime_ns

    second = run_cli(*args, cwd=tmp_path, env=KEY, timeout=600)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert second.stdout.count("finished before (run") == 1
    assert (
        f"finished before while the store was away; its record synced (run {cut.info.run_id}), skipped" in second.stdout
    )
    assert trajectory.stat().st_mtime_ns == ran_at  # the agent did not run again
    _, _, children = runs_by_role(tmp_path, HARNESS_EXPERIMENT)
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    (synced,) = [r for r in children if r.info.run_id == cut.info.run_id]
    assert synced.data.tags["mlrb.attempt"] == "1"
    assert {t: synced.data.tags[t] for t in ("mlrb.status", "mlrb.valid", "mlrb.counted_as")} == {
        t: cut.data.tags[t] for t in ("mlrb.status", "mlrb.valid", "mlrb.counted_as")
    }


def wait_for_running_job(tmp_path, marker: str, timeout: float) -> int:
    """The pid of the submitit job process whose run executes `marker`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ps = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
        rows = [line.split(None, 2) for line in ps.splitlines()[1:]]
        by_pid = {pid: (ppid, args) for pid, ppid, args in rows}
        for pid, (_ppid, args) in by_pid.items():
            # bash runs a lone command in its own process (exec), so match either form
            if args in (marker, "/bin/bash -c " + marker):
                # climb to the submitit job process that runs this command's harness
                while pid in by_pid and "submitit" not in by_pid[pid][1]:
                    pid = by_pid[pid][0]
                if pid in by_pid and str(tmp_path) in by_pid[pid][1]:
                    return int(pid)
        time.sleep(0.5)
    raise AssertionError(f"no job running {marker!r} within {timeout} s")


def write_metrics(args):
    uri_dir, worker = args
    from mlrb.core.config import TrackingConfig
    from mlrb.store import record, tracking

    recorder = tracking.open_run(TrackingConfig(dir=uri_dir), "concurrency", f"writer-{worker}", {"w": worker},
                                 record.new_run_id(), 1)  # fmt: skip
    recorder.log_params({"worker": str(worker)})
    for step in range(40):
        recorder.log_metrics({"loss": step * 0.1 + worker, "step_seen": step}, step=step)
    recorder.finish("FINISHED")
    return recorder.run_id


@pytest.mark.integration
def test_eight_jobs_writing_to_one_sqlite_store_lose_nothing(tmp_path):
    store = str(tmp_path / "mlruns")
    write_metrics((store, -1))  # create the database first, as a sweep's first job would
    # Eight processes of their own, as a sweep's jobs are, each with its own connection to the store; forked
    # from a server that imported the store's code once (none of them pays for it), holding no connection.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["mlrb.store.tracking", "mlflow.store.tracking.sqlalchemy_store"])
    with context.Pool(8) as pool:
        run_ids = pool.map(write_metrics, [(store, w) for w in range(8)])
    client = mlflow_client(tmp_path)
    for worker, run_id in enumerate(run_ids):
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["worker"] == str(worker)
        history = client.get_metric_history(run_id, "loss")
        assert sorted(m.step for m in history) == list(range(40))


@pytest.mark.system
@pytest.mark.skipif(bool(slurm_problem()), reason=slurm_problem() or "slurm ok")
def test_a_preempted_slurm_job_is_requeued_and_continues_its_run(tmp_path, built_cache):
    # The first attempt starts a long command; SLURM's pre-emption signal (USR2, as
    # `scancel --signal` or a preempting partition sends it) makes submitit requeue the job,
    # and the second attempt finds the mark the first one left and finishes quickly.
    mark = tmp_path / "first-attempt-was-here"
    command = f"if [ -f {mark} ]; then echo resumed; else touch {mark}; sleep 300; fi"
    # sandbox=unconfined: the mark is a host file that both attempts must see.
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mlrb", "-m", "seed=7", "launcher=slurm", "sandbox=unconfined", "task.scales.tiny.hardware.cpus=1",
         "tracking.allow_sqlite_on_slurm=true",
         f"task.scales.tiny.baseline_command='{command}'", *sweep_args(tmp_path, built_cache)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for_running_job(tmp_path, "sleep 300", timeout=240)
        job_ids = own_slurm_jobs(tmp_path)
        assert len(job_ids) == 1, job_ids
        subprocess.run(["scancel", "--signal=USR2", job_ids[0]], check=True)
        release_when_requeued(job_ids[0], timeout=120)
        out, _ = sweep.communicate(timeout=600)
    finally:  # a failed test leaves no sweep or job behind to hold the cluster's CPUs
        if sweep.poll() is None:
            sweep.kill()
            for job in own_slurm_jobs(tmp_path):
                subprocess.run(["scancel", job])
    assert sweep.returncode == 0, out[-3000:]

    client, parents, children = runs_by_role(tmp_path)
    (run,) = children  # one MLflow run across both attempts
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    path = client.download_artifacts(run.info.run_id, "trajectory.jsonl", str(tmp_path / "artifacts"))
    events = [json.loads(line) for line in open(path)]
    assert [printed(e).strip() for e in events if e["event"] == "tool_result"] == ["resumed"]
    # submitit's own account of it: in its job log, or in the run's log where the quiet console sends stderr
    logs = "".join(p.read_text() for pattern in ("*_log.err", "*_log.out", "mlrb.log")
                   for p in (tmp_path / "sweep").rglob(pattern))  # fmt: skip
    assert "preempted" in logs and "requeu" in logs.lower()


def own_slurm_jobs(tmp_path) -> list[str]:
    """The ids of the jobs submitted from this test's folder: other SLURM tests may run beside it."""
    queue = subprocess.run(["squeue", "-h", "-n", "mlrb", "-o", "%i %Z"], capture_output=True, text=True).stdout
    return [job for job, workdir in (line.split(None, 1) for line in queue.splitlines()) if workdir == str(tmp_path)]


def release_when_requeued(job_id: str, timeout: float) -> None:
    """SLURM holds a requeued job back for about two minutes (its begin time); let it start
    at once, as an administrator would, so the test does not wait for that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True).stdout
        if state.startswith("PENDING"):
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
            return
        time.sleep(0.5)
    raise AssertionError(f"SLURM job {job_id} was not requeued within {timeout} s")


MERGE = 'python merge.py --data "$MLRB_DATA" --output submission'


# Its point is the configuration's counted and normalised means: the calibrated tiny scale's (a
# plumbing sweep's summary shows no mean), so the system tier's.
@pytest.mark.system
def test_a_sweep_ends_with_a_summary_that_matches_the_store(tmp_path, built_cache):
    # Two seeds x two commands: the baseline's merge (a valid submission) and one that hands in nothing.
    result = run_cli(
        "-m", "seed=1,2", f"task.scales.tiny.baseline_command='{MERGE}','echo nothing'", *sweep_args(tmp_path, built_cache),
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    client, (parent,), children = runs_by_role(tmp_path)
    out = result.stdout

    # Run names read as the configuration, including what the sweep varies, and are unique.
    names = sorted(r.info.run_name for r in children)
    assert names == sorted(f"llm_merging/baseline/smoke/{seed} task.scales.tiny.baseline_command={command}"
                           for seed in (1, 2) for command in (MERGE, "echo nothing"))  # fmt: skip
    assert (
        parent.info.run_name
        == f"sweep llm_merging/baseline/smoke: seed=1,2 task.scales.tiny.baseline_command='{MERGE}','echo nothing'"
    )

    # One line per run: its status, raw and counted scores as the store holds them.
    table = out[out.index("[sweep ") :]
    for run in children:
        (line,) = [line for line in table.splitlines() if line.startswith(run.info.run_name + " ")]
        if run.data.tags["mlrb.valid"] == "True":
            assert " ok " in line
            assert f"{run.data.metrics['score']:.4g}" in line and f"{run.data.metrics['normalised_score']:.1f}" in line
        else:
            # no score; counted as doing nothing, below the baseline's 0
            do_nothing = run.data.metrics["counted_normalised_score"]
            assert do_nothing < 0 and run.data.tags["mlrb.counted_as"] == "do_nothing"
            assert " no submission " in line and line.rstrip().endswith(f"{do_nothing:.1f}")

    # The parent carries the configuration's aggregates (the two commands are one configuration:
    # they differ in no field the report groups by): counted scores over every attempt.
    valid = [r for r in children if r.data.tags["mlrb.valid"] == "True"]
    assert len(valid) == 2
    scores = [r.data.metrics["score"] for r in valid]
    normalised = [r.data.metrics["counted_normalised_score"] for r in children]
    assert sorted(normalised)[:2] == [do_nothing, do_nothing]
    mean = sum(normalised) / 4
    sem = (sum((v - mean) ** 2 for v in normalised) / 3 / 4) ** 0.5
    metrics = client.get_run(parent.info.run_id).data.metrics
    assert (metrics["n"], metrics["n_valid"], metrics["jobs_done"]) == (4, 2, 4)
    assert metrics["score_mean"] == pytest.approx(sum(scores) / 2)
    assert metrics["counted_normalised_score_mean"] == pytest.approx(mean)
    assert metrics["counted_normalised_score_sem"] == pytest.approx(sem)
    assert metrics["success_rate"] == pytest.approx(sum(r.data.metrics["success"] for r in valid) / 4)
    assert f"{mean:.1f} ± {sem:.1f} (n=4)" in out  # the per-configuration line
    assert "no submission  2" in out  # failures by kind, with the reason

    # Where to look: the parent run and the exact command that opens it.
    experiment_id = parent.info.experiment_id
    assert f"parent run '{parent.info.run_name}' ({parent.info.run_id})" in out
    db = tmp_path / "mlruns" / "mlflow.db"
    assert f"{sys.executable} -m mlflow ui --backend-store-uri sqlite:///{db}" in out
    assert (
        f"http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{parent.info.run_id}?workflowType=machine_learning"
        in out
    )
    # The experiment's kind is set (MLflow 3.17's UI ignores it: the address above names the view;
    # tests/test_mlflow_ui.py checks both ways of reaching the runs table in a browser).
    assert client.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert "ETA" in out  # progress said how long was left


@pytest.mark.fast
def test_run_names_are_unique_in_a_sweep_and_the_parent_says_what_varies(monkeypatch):
    from conftest import compose_config
    from mlrb.core.run_names import extra_name_keys, run_name, sweep_name

    jobs = [[f"seed={seed}", f"sandbox={sandbox}", "budget=1h"] for seed in (1, 2) for sandbox in ("bwrap", "docker")]
    assert extra_name_keys(jobs) == ["sandbox"]  # task, agent, budget and seed are always in the name
    told = f"sweep.name_keys=[{','.join(extra_name_keys(jobs))}]"  # as the sweep tells its jobs
    names = [run_name(compose_config(*job, told)) for job in jobs]
    assert names == ["llm_merging/baseline/1h/1 sandbox=bwrap", "llm_merging/baseline/1h/1 sandbox=docker",
                     "llm_merging/baseline/1h/2 sandbox=bwrap", "llm_merging/baseline/1h/2 sandbox=docker"]  # fmt: skip
    assert sweep_name(jobs, names[0]) == "sweep llm_merging/baseline/1h: seed=1,2 sandbox=bwrap,docker"
    budgets = [[f"budget={b}", "seed=3"] for b in ("smoke", "1h")]
    assert sweep_name(budgets, "llm_merging/baseline/smoke/3") == "sweep llm_merging/baseline: budget=smoke,1h"


@pytest.mark.integration
def test_a_sweep_over_tasks_sums_up_every_task_s_runs(tmp_path, plumbing_cache):
    # Each task's runs are recorded in its own experiment; the sweep's summary and its parent's
    # metrics cover them all, not only the first task's.
    result = run_cli("-m", "task=llm_merging,math_reasoning", PLUMBING, QUICK, *sweep_args(tmp_path, plumbing_cache),
                     cwd=tmp_path, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "done" in result.stdout and ": 2 runs (" in result.stdout, result.stdout[-3000:]
    assert "llm_merging/baseline/smoke/0" in result.stdout and "math_reasoning/baseline/smoke/0" in result.stdout
    assert "its runs are in experiment 'llm_merging' and in 'math_reasoning'" in result.stdout


@pytest.mark.fast
def test_a_job_is_told_its_sweep_s_id_as_it_is_even_when_it_reads_as_a_number():
    # A sweep's id is 12 hex digits: 941305e46523 is also a float (infinity), which a job read as "inf"
    # and so found none of its sweep's earlier run folders.
    for sweep_id, parent in (("941305e46523", "1e10" + "0" * 28), ("0123456789ab", "f" * 32)):
        cfg = compose_config(*sweep_facts(sweep_id, parent))
        assert (cfg.sweep.id, cfg.sweep.parent_run_id) == (sweep_id, parent)
