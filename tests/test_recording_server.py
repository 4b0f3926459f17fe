"""A local sweep's jobs record through processes forked by the sweep's recording server
(mlrb/store/recording_server.py), not through MLflow imported in each job: what such a process
writes is what a single run's recording process writes; it runs with the job's environment
; the job waits for it as its own child; a job whose server is gone
starts a new interpreter instead; the server ends with the sweep's process. And in a whole
local sweep: each job's recording process and the sweep's own (its parent run's) are the
server's, none starts one of its own, the runs are recorded whole, and no recording process
outlives the sweep. A sweep that opened its store before its server started hands the server's
forks no connection to it."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import PLUMBING, mlflow_client, store_args
from mlrb.core.config import TrackingConfig
from mlrb.core.tags import Metric
from mlrb.store import record, recording_process, recording_server
from test_failures_runs import once_running
from test_recording_process import RECORDING_PROCESS, alive
from warm_start import STARTING_ENV

# The sweep's side, in a process of its own (a test process runs threads: no server forks there).
SWEEP = """
import sys
from mlrb.store import recording_process, recording_server
server = recording_server.start(recording_process.main)
print(server.address, server.pid, flush=True)
sys.stdin.read()  # until the test closes it, or kills this process
server.close()
print("closed", flush=True)
"""

# A sweep's process that opened its store before it started its server (a second sweep launched
# by mlrb.cli.main() in one Python process, say). Its parent run, and a job's run beside it,
# record through the server's forks while this process lets go of its own connection to the
# store, as it does when it ends.
STORE_OPENED_FIRST = """
import json, os, sys
from pathlib import Path
from mlrb.core.config import TrackingConfig
from mlrb.store import record, recording_process, recording_server, tracking
cfg, folder = TrackingConfig(dir=sys.argv[1]), Path(sys.argv[2])
tracking.check_store(cfg)  # opened here: MLflow keeps the connection
server = recording_server.start(recording_process.main)
os.environ[recording_server.ADDRESS_VAR] = server.address
processes = {"sweep": recording_process.start(), "job": recording_process.RecordingProcess()}
runs = {}
for role, process in processes.items():
    (folder / role).mkdir()
    runs[role] = record.RecordedRun(process.store_run(cfg), folder / role, "experiment", role, {"mlrb.role": role},
                                    record.new_run_id())
    runs[role].store_run.wait_opened()
recording_server.close_store_connections()  # this process's own connection, closed
for step in range(10):
    for run in runs.values():
        run.log_metrics({"score": step / 10}, step=step)
for run in runs.values():
    run.finish("FINISHED")
ids = {role: run.shown_id for role, run in runs.items()}
print(json.dumps({"ids": ids, "served": [type(p.process).__name__ for p in processes.values()],
                  "server": server.pid}), flush=True)
sys.stdin.read()  # until the test has looked at the server's descriptors
for process in processes.values():
    process.close()
server.close()
"""


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except FileNotFoundError:  # it ended meanwhile
        return []


def descendants_of(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return ""


def start_sweep_process() -> Iterator[tuple[subprocess.Popen, str, int]]:
    """A sweep's process with its recording server: (process, the server's address, its pid)."""
    process = subprocess.Popen([sys.executable, "-c", SWEEP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=STARTING_ENV)  # fmt: skip
    assert process.stdout is not None
    address, pid = process.stdout.readline().split()
    yield process, address, int(pid)
    process.kill()
    process.wait()


shared_sweep_process = pytest.fixture(scope="module")(start_sweep_process)  # for tests that leave it as it is
# One process, so the sweep's process starts once
ONE_SHARED_SWEEP_PROCESS = pytest.mark.xdist_group("recording_server_sweep")
sweep_process = pytest.fixture(start_sweep_process)  # for tests that end it


def record_a_run(tmp_path: Path) -> tuple[recording_process.RecordingProcess, str]:
    """A run recorded through a RecordingProcess, as run.execute records one: its id in the store."""
    process = recording_process.RecordingProcess(recording_process.forked_or_new)
    cfg = TrackingConfig(dir=str(tmp_path / "mlruns"))
    try:
        process.start_check(cfg).result()
        (tmp_path / "run").mkdir()
        recorder = record.RecordedRun(process.store_run(cfg), tmp_path / "run", "experiment", "a job",
                                      {"mlrb.task": "t"}, record.new_run_id())  # fmt: skip
        recorder.log_params({"seed": "3"})
        recorder.log_metrics({"score": 0.5}, step=2)
        recorder.finish("FINISHED")
    finally:
        process.close()
    return process, recorder.shown_id


@pytest.mark.fast
@ONE_SHARED_SWEEP_PROCESS
def test_a_job_records_through_a_process_the_server_forks_and_waits_for_it_as_its_own(
    tmp_path, monkeypatch, shared_sweep_process
):
    from mlflow.tracking import MlflowClient

    _, address, _ = shared_sweep_process
    monkeypatch.setenv(recording_server.ADDRESS_VAR, address)
    process, run_id = record_a_run(tmp_path)
    served = process.process
    assert isinstance(served, recording_server.ServedProcess)
    assert served.returncode == 0 and not alive(served.pid)  # waited for, as the job's own child would be
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}").get_run(run_id)
    assert (run.info.status, run.data.params["seed"], run.data.tags["mlrb.task"]) == ("FINISHED", "3", "t")
    assert run.data.metrics["score"] == 0.5
    assert (tmp_path / "run" / record.FILE).is_file()  # the record the store was written from


@pytest.mark.fast
@ONE_SHARED_SWEEP_PROCESS
def test_a_served_process_is_the_server_s_fork_with_the_job_s_environment(tmp_path, monkeypatch, shared_sweep_process):
    _, address, server_pid = shared_sweep_process
    monkeypatch.setenv(recording_server.ADDRESS_VAR, address)
    # The store MLflow opens comes from the environment when the config names none: the job's
    # (set here), not the sweep's (which has none). tracking.dir is where it would go otherwise.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'by-env' / 'mlflow.db'}")
    (tmp_path / "by-env").mkdir()
    process = recording_process.RecordingProcess(recording_process.forked_or_new)
    try:
        assert parent_of(parent_of(process.process.pid)) == server_pid  # forked by the server's fork
        process.start_check(TrackingConfig(dir=str(tmp_path / "by-dir"))).result()
    finally:
        process.close()
    assert (tmp_path / "by-env" / "mlflow.db").is_file() and not (tmp_path / "by-dir").exists()


@pytest.mark.fast
def test_a_job_whose_server_is_gone_records_through_a_new_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv(recording_server.ADDRESS_VAR, str(tmp_path / "no-server"))
    process, _ = record_a_run(tmp_path)
    assert isinstance(process.process, subprocess.Popen)
    assert RECORDING_PROCESS in " ".join(process.process.args)
    assert process.process.returncode == 0


@pytest.mark.fast
def test_the_server_ends_with_the_sweep_s_process_and_its_recording_processes_with_their_jobs(
    tmp_path, monkeypatch, sweep_process
):
    sweep, address, server_pid = sweep_process
    monkeypatch.setenv(recording_server.ADDRESS_VAR, address)
    process = recording_process.RecordingProcess(recording_process.forked_or_new)
    served = process.process
    sweep.kill()  # the sweep's process dies (its Ctrl-C, say): its job goes on recording
    sweep.wait()
    deadline = time.monotonic() + 10
    while alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server_pid), "the recording server outlived the sweep's process"
    process.start_check(TrackingConfig(dir=str(tmp_path / "mlruns"))).result()
    assert alive(served.pid)
    process.close()  # the job ends
    assert served.returncode == 0 and not alive(served.pid)
    assert not Path(address).parent.exists()  # its socket's folder, removed by the server as it ended


@pytest.mark.fast
def test_a_closed_server_removes_its_socket(sweep_process):
    sweep, address, server_pid = sweep_process
    assert Path(address).exists()
    sweep.stdin.close()
    assert sweep.stdout.readline().strip() == "closed"
    assert not alive(server_pid) and not Path(address).parent.exists()


@pytest.mark.integration
def test_a_local_sweep_s_jobs_record_through_its_server_and_leave_no_process(tmp_path, plumbing_cache):
    seconds = str(random.randrange(10**6, 10**7))
    command = f"(sleep {seconds} & echo $! > agent.started; wait)"  # ends when the test ends the sleep
    sweep = subprocess.Popen(
        [sys.executable, "-m", "mlrb", "-m", "seed=1,2", "hydra.launcher.slots=2", *store_args(tmp_path, plumbing_cache)[:2],
         PLUMBING, f"task.scales.tiny.baseline_command='{command}'"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=STARTING_ENV,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while len(list(tmp_path.glob("outputs/sweeps/*/*/workspace/agent.started"))) < 2:
        assert sweep.poll() is None, sweep.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the two jobs' agents did not start"
        time.sleep(0.2)
    marker = f"sleep\0{seconds}"
    # The sweep's children: its recording server (a fork: the sweep's own command line) and submitit's.
    (server,) = [c for c in children_of(sweep.pid) if Path(f"/proc/{c}/cmdline").read_bytes() ==
                 Path(f"/proc/{sweep.pid}/cmdline").read_bytes()]  # fmt: skip
    served = [g for c in children_of(server) for g in children_of(c)]
    assert len(served) == 3  # one recording process per job and one for the sweep's parent run, forked by the server
    mine = descendants_of(sweep.pid)  # (other tests' runs may be recording beside it)
    assert not [pid for pid in mine if RECORDING_PROCESS in command_line(pid)]  # no new interpreter records

    for pid in once_running(marker, sweep, count=2):
        os.kill(int(pid), signal.SIGKILL)  # the agents' commands end
    out, err = sweep.communicate(timeout=300)
    assert sweep.returncode == 0 and "Traceback" not in out + err, err[-3000:]
    client = mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    jobs = {r.data.tags["mlrb.seed"]: r for r in runs if r.data.tags.get("mlrb.role") != "sweep"}
    assert sorted(jobs) == ["1", "2"]
    for seed, run in jobs.items():  # recorded whole, as a single run's recording process records one
        assert (run.info.status, run.data.tags["mlrb.status"]) == ("FINISHED", "no_submission")
        assert run.data.params["seed"] == seed and "stage_time_s.recording" in run.data.metrics
        run_dir = Path(run.data.tags["mlrb.run_dir"])
        assert record.fold(record.read(run_dir))["status"] == "FINISHED"
        assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"config.yaml", "trajectory.jsonl"}
    (parent,) = [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"]  # recorded by the server's fork too
    assert parent.info.status == "FINISHED"
    assert (parent.data.metrics[Metric.JOBS], parent.data.metrics[Metric.JOBS_DONE]) == (2, 2)
    assert not any(alive(pid) for pid in [server, *served]), "a recording process outlived its sweep"


def store_files_open(pid: int, store: Path) -> list[str]:
    """The files of the SQLite store STORE (its database, WAL and shared memory) that PID holds open."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except FileNotFoundError:  # closed meanwhile
            pass
    return sorted(link for link in links if link.startswith(str(store)))


@pytest.mark.fast
def test_runs_recorded_through_the_server_of_a_sweep_that_opened_its_store_first_are_whole(tmp_path):
    """The server and its forks inherit no connection to the store: a fork that did would use
    SQLite locks it does not hold, and lose its writes when the sweep's process lets go of its own."""
    from mlflow.tracking import MlflowClient

    (tmp_path / "runs").mkdir()
    sweep = subprocess.Popen([sys.executable, "-c", STORE_OPENED_FIRST, str(tmp_path / "mlruns"), str(tmp_path / "runs")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=STARTING_ENV)  # fmt: skip
    try:
        assert sweep.stdout is not None and sweep.stdin is not None
        told = json.loads(sweep.stdout.readline())
        store = tmp_path / "mlruns" / "mlflow.db"
        assert store_files_open(told["server"], store) == []
        assert told["served"] == ["ServedProcess", "ServedProcess"]  # the parent run's too, by the server
        sweep.stdin.close()
        assert sweep.wait(60) == 0
    finally:
        sweep.kill()
    client = MlflowClient(f"sqlite:///{store}")
    for role, run_id in told["ids"].items():
        run = client.get_run(run_id)
        assert (run.info.status, run.data.tags["mlrb.role"]) == ("FINISHED", role)
        scores = client.get_metric_history(run_id, "score")
        assert sorted(m.step for m in scores) == list(range(10)), role
