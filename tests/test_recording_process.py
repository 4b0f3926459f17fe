"""A single run records through MLflow in a process of its own (mlrb/store/recording_process.py),
in whole runs through `python -m mlrb` of the cheapest real task (conftest's HARNESS_TASK, the
task incidental here): the harness's process never imports MLflow and the run is recorded whole;
a Ctrl-C to the whole process group (what a terminal sends) still records the run as killed, and
the recording process ends with the run; a recording process that dies is one line naming it,
not a traceback or a hang. And, without a run, what crosses between the two processes: a refused
store is the same ConfigError, a trace ended by an error names the error's type, a warning the
process logs is in the harness's log, and a request the process cannot read fails alone."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_SUBMISSION, HARNESS_TASK, store_args
from mlrb.core import events
from mlrb.core.config import ConfigError, TrackingConfig
from mlrb.store import record, recording_process
from mlrb.store.tracing import TraceWriter
from test_failures_runs import as_in_a_terminal, mlrb_lines, once_running, only_run, running_with, wait_for_file

RECORDING_PROCESS = "mlrb.store.recording_process"


def recording_processes_of(harness_pid: int) -> list[int]:
    """The harness's children that run mlrb.store.recording_process."""
    found = []
    for task in Path(f"/proc/{harness_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
            if RECORDING_PROCESS in cmdline:
                found.append(int(child))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def start_long_run(tmp_path: Path, cache: Path, then: str = "true") -> tuple[subprocess.Popen, str]:
    """A run in its own process group whose agent starts a long sleep, then runs THEN once the
    sleep ends; returns once the sleep runs, with the sleep's marker (for `running_with`). The sleep
    is its own: its length is drawn in the sandbox and written to agent.started once it runs. A folder
    task's baseline command is also its baseline anchor, run when its assets are built: there the
    workspace has no budget file, and the command only makes the submission (one command string for
    every run: its assets are built once)."""
    command = (
        f'if [ ! -e "$MLRB_BUDGET_FILE" ]; then {HARNESS_SUBMISSION}; '
        "else seconds=$((1000000 + $(od -An -N3 -tu4 /dev/urandom))); "
        f"(sleep $seconds & echo $seconds > agent.started; wait); {then}; fi"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "mlrb", *store_args(tmp_path, cache), *HARNESS_TASK,
         f"task.scales.folder.baseline_command='{command}'"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal,
        process_group=0,
    )  # fmt: skip
    seconds = wait_for_file(tmp_path / "run" / "workspace" / "agent.started", process)
    marker = f"sleep\0{seconds}"
    once_running(marker, process)  # the agent's command runs
    return process, marker


@pytest.mark.integration
def test_the_harness_never_imports_mlflow_and_the_run_is_recorded_whole(tmp_path, cache_dir):
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mlrb", *store_args(tmp_path, cache_dir), *HARNESS_TASK],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # -X importtime is the harness's flag only: its children (the recording process) do not inherit it.
    imported = {m.group(1) for m in re.finditer(r"^import time:.*\|\s*([\w.]+)$", result.stderr, re.MULTILINE)}
    assert "hydra" in imported and "mlrb.run" in imported
    assert not {m for m in imported if m.split(".")[0] in ("mlflow", "sqlalchemy", "alembic")}
    client, run = only_run(tmp_path, HARNESS_EXPERIMENT)
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.status"] == "ok"
    assert {"score", "stage_time_s.recording"} <= set(run.data.metrics) and run.data.tags["mlrb.scale"] == "folder"
    assert run.data.params["task.name"] == HARNESS_EXPERIMENT
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "instructions.md", "score_report.json", "workspace.patch"} <= artifacts


@pytest.mark.integration
def test_ctrl_c_to_the_process_group_records_the_run_killed_and_the_recording_process_ends(tmp_path, cache_dir):
    process, marker = start_long_run(tmp_path, cache_dir)
    (recorder_pid,) = recording_processes_of(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the harness and every process of its group
    out, err = process.communicate(timeout=300)
    assert process.returncode == 128 + signal.SIGINT, err[-3000:]
    assert "Traceback" not in out + err
    (line,) = mlrb_lines(err)
    assert line.startswith("mlrb: run interrupted by SIGINT; recorded as killed")
    _, run = only_run(tmp_path, HARNESS_EXPERIMENT)
    assert run.info.status == "KILLED" and run.data.tags["mlrb.status"] == "killed"
    deadline = time.monotonic() + 10
    while (alive(recorder_pid) or running_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(recorder_pid), "the recording process outlived its run"
    assert running_with(marker) == []


@pytest.mark.integration
def test_a_recording_process_that_dies_is_one_line_naming_it(tmp_path, cache_dir):
    process, marker = start_long_run(tmp_path, cache_dir)
    (recorder_pid,) = recording_processes_of(process.pid)
    os.kill(recorder_pid, signal.SIGKILL)  # say, the kernel's OOM killer
    for pid in running_with(marker):
        os.kill(int(pid), signal.SIGKILL)  # the agent's command ends; the run goes on to record
    out, err = process.communicate(timeout=300)
    assert process.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    (line,) = mlrb_lines(err)
    assert line.startswith("mlrb: run failed (")
    assert "the recording process (MLflow) ended unexpectedly, exit code -9" in line


@pytest.mark.fast
def test_a_store_the_recording_process_refuses_is_the_harness_s_one_line_config_error(tmp_path):
    process = recording_process.RecordingProcess()
    try:
        (tmp_path / "file").write_text("")  # a file where the store's folder would go
        with pytest.raises(ConfigError, match=r"tracking store .*file/mlflow.db.* \(tracking.dir\): cannot create it"):
            process.start_check(TrackingConfig(dir=str(tmp_path / "file"))).result()
    finally:
        process.close()
    assert process.process.returncode == 0


@pytest.mark.fast
def test_a_run_recorded_through_the_process_has_its_params_and_a_trace_ended_by_the_agent_s_error(tmp_path):
    from mlflow.tracking import MlflowClient

    process = recording_process.RecordingProcess()
    cfg = TrackingConfig(dir=str(tmp_path / "mlruns"))
    try:
        process.start_check(cfg).result()
        store_run = process.store_run(cfg)
        (tmp_path / "run").mkdir()
        # The harness appends each line to the run's record; the process reads it there and writes it
        # (the first, `opened`, opens the store's run).
        recorder = record.RecordedRun(store_run, tmp_path / "run", "experiment", "a run", {"mlrb.task": "t"},
                                      record.new_run_id())  # fmt: skip
        recorder.log_params({"seed": "3"})
        recorder.log_params({"seed": "4"})  # returns at once: the process writes it while the harness goes on
        # MLflow's own error, in the recording process: the harness gets it as one of mlrb's, by name,
        # when it next waits for the store (at the latest, the run's end)
        with pytest.raises(recording_process.RecordingError, match=r"^MlflowException: .*seed"):
            store_run.flush()
        traces = TraceWriter(recorder, session=recorder.run_id)  # its traces go through the process
        traces.handle(events.StepStarted(1, "10 steps left"))

        class APIConnectionError(Exception):  # an SDK's error, which the recording process cannot import
            pass

        traces.close(APIConnectionError("connection refused"))
        recorder.finish("FAILED")
    finally:
        process.close()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([store_run.opened_as[1]])
    assert (run.info.run_id, run.data.tags["mlrb.run_id"]) == (recorder.shown_id, recorder.run_id)
    assert (run.info.status, run.data.params["seed"], run.data.tags["mlrb.task"]) == ("FAILED", "3", "t")
    (trace,) = client.search_traces(locations=[store_run.opened_as[1]])
    (span,) = trace.data.spans
    assert span.name == "step 1" and span.status.status_code == "ERROR"
    assert span.status.description == "APIConnectionError: connection refused"


EXPORT_AFTER_IMPORTS = """
import sys, time
import mlflow
from mlflow.tracking import MlflowClient
from mlrb.store import tracing
tracing.import_exporter()
uri = sys.argv[1]
client = MlflowClient(uri)
experiment = client.create_experiment("e")
run = client.create_run(experiment)
before = set(sys.modules)
now = time.time_ns()
span = dict(span_type="AGENT", inputs={}, outputs={}, attributes={}, status="OK", status_description=None, events=[])
spans = [dict(span, name="tool", span_id="b", parent_id="a", start_time_ns=now + 1, end_time_ns=now + 2),
         dict(span, name="step 1", span_id="a", parent_id=None, start_time_ns=now, end_time_ns=now + 3)]
tracing.export_trace(uri, experiment, run.info.run_id, {"step": 1, "session": "s", "spans": spans})
assert len(client.search_traces(locations=[experiment])) == 1
print(sorted(set(sys.modules) - before))
"""


@pytest.mark.integration
def test_what_a_first_trace_export_would_import_a_recording_process_imports_ahead(tmp_path):
    # MLflow imports its tracer, all of mlflow.pyfunc and GitPython (which runs `git version`) on a
    # process's first trace export; recording processes import them ahead with their lasting imports
    # (`tracing.import_exporter`). A newer MLflow that imports something else there shows up here.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = subprocess.run([sys.executable, "-c", EXPORT_AFTER_IMPORTS, uri], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.fast
def test_the_process_s_warnings_reach_the_harness_s_log_and_a_request_it_cannot_read_fails_alone(tmp_path, caplog):
    store = tmp_path / "mlruns"
    store.mkdir()
    damaged = sqlite3.connect(store / "mlflow.db")  # a table MLflow cannot use and no runs: made afresh, with a warning
    damaged.execute("CREATE TABLE experiments (x INTEGER)")
    damaged.commit()
    damaged.close()
    process = recording_process.RecordingProcess()
    try:
        with caplog.at_level("WARNING", logger="mlrb"):
            process.start_check(TrackingConfig(dir=str(store))).result()
        (warning,) = [r for r in caplog.records if "was damaged and held no runs" in r.getMessage()]
        assert (warning.name, warning.levelname) == ("mlrb.store.tracking", "WARNING")
        # A request it cannot read (an argument it does not take) fails alone; the next is answered.
        with pytest.raises(recording_process.RecordingError, match=r"TypeError: .*unexpected keyword.*'colour'"):
            process.call("check_store", tracking={"dir": str(store)}, wait_for_server=False, colour="red")
        with pytest.raises(recording_process.RecordingError, match=r"KeyError: 'rename_the_store'"):
            process.call("rename_the_store")
        process.start_check(TrackingConfig(dir=str(store))).result()
    finally:
        process.close()
    assert process.process.returncode == 0
    assert len(list(store.glob("mlflow.db.broken-*"))) == 1
