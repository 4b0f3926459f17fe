"""Sweeps logging through a real MLflow tracking server on a real PostgreSQL
(`python -m mlrb.tracking serve`), the same sweep into SQLite, a server that goes
away mid-sweep, and the one-line refusals (PostgreSQL down, SQLite on SLURM).

PostgreSQL: .ci/run installs Debian's and creates the role these tests use
(MLRB_TEST_POSTGRES, default postgresql://mlrb:mlrb@127.0.0.1:5432/postgres: a role
that may create databases). Each session's server gets a database of its own.
"""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from statistics import mean

import pytest

from conftest import REPO, mlflow_client, run_cli
from mlrb.core.tags import Tag

POSTGRES = os.environ.get("MLRB_TEST_POSTGRES", "postgresql://mlrb:mlrb@127.0.0.1:5432/postgres")
SEEDS = list(range(1, 9))  # 8 jobs, 4 at a time: two waves, the first through the restart
JOBS = len(SEEDS)
# A quick job: the agent runs a short command and hands in nothing, so nothing is scored.
QUICK = "task.scales.tiny.baseline_command='sleep 2'"
ARTIFACTS = ["config.yaml", "instructions.md", "review.json", "score_report.json", "snapshots", "trajectory.atif.json",
             "trajectory.jsonl", "workspace.patch"]  # fmt: skip
# The files behind them: the step snapshots' folder holds its steps.jsonl (a quick job changes no file).
ARTIFACT_FILES = ["config.yaml", "instructions.md", "review.json", "score_report.json", "steps.jsonl", "trajectory.atif.json",
                  "trajectory.jsonl", "workspace.patch"]  # fmt: skip
STAGES = ["agent", "assets", "collect", "compose", "recording", "sandbox_start", "scoring"]
METRICS = sorted(["agent_time_s", "baseline_score", "cost_usd", "counted_normalised_score", "counted_score",
                  "do_nothing_score", "input_tokens", "output_tokens", "prepare_time_s",
                  "reference_score", "score_time_s", "steps", "valid", "wall_time_s",
                  "cache_read_tokens", "cache_write_tokens", "web_searches", "fee_usd", "gpu_hours", "cpu_hours",
                  *(f"stage_time_s.{stage}" for stage in STAGES)])  # fmt: skip
TAGS = ["mlflow.parentRunId", "mlflow.runName", "mlrb.agent", "mlrb.agent_message", "mlrb.assets_fingerprint",
        "mlrb.attempt", "mlrb.budget", "mlrb.confined", "mlrb.counted_as", "mlrb.counted_reason", "mlrb.invalid_reason", "mlrb.network",
        "mlrb.normalised_as", "mlrb.read_only_restored", "mlrb.review", "mlrb.review_findings", "mlrb.run_dir", "mlrb.run_key",
        "mlrb.sandbox", "mlrb.scale", "mlrb.seed",
        "mlrb.status", "mlrb.stop_reason", "mlrb.sweep_id", "mlrb.task", "mlrb.valid"]  # fmt: skip


def postgres_problem() -> str:
    try:
        import psycopg

        psycopg.connect(POSTGRES, connect_timeout=3).close()
    except Exception as e:  # no driver, no server, no such role
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"needs PostgreSQL reachable as {POSTGRES.split('@')[-1]} with a role that may create databases "
                f"(set MLRB_TEST_POSTGRES; .ci/run sets one up): {first}")  # fmt: skip
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class TrackingServer:
    """`python -m mlrb.tracking serve` as a user starts it, on a loopback port."""

    def __init__(self, db_uri: str, artifacts: Path, log: Path, extra: list[str] | None = None):
        self.db_uri, self.artifacts, self.log = db_uri, artifacts, log
        self.extra = extra or []  # more options of `serve`
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 240) -> None:
        command = [sys.executable, "-m", "mlrb.tracking", "serve", "--backend-store-uri", self.db_uri,
                   "--artifacts-destination", str(self.artifacts), "--host", "127.0.0.1", "--port", str(self.port),
                   "--workers", "1", *self.extra]  # fmt: skip
        before = self.log.read_text() if self.log.exists() else ""  # a restart appends to the first start's log
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + timeout
        announced = f"MLFLOW_TRACKING_URI={self.uri}"
        while announced not in self.log.read_text()[len(before) :]:
            assert self.process.poll() is None, f"the server stopped: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {announced} within {timeout} s: {self.log.read_text()[-3000:]}"
            time.sleep(0.5)

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        assert not port_open(self.port), "the server still answers after it was stopped"


# The tests that use the server share one test process, so the server (its database, MLflow's
# tables, its workers) starts once, not once in each process that runs one of them.
ONE_SERVER = pytest.mark.xdist_group("tracking_server")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    problem = postgres_problem()
    if problem:  # a skip fails under CI, where .ci/run starts PostgreSQL
        pytest.skip(problem)
    import psycopg

    database = f"mlrb_test_{uuid.uuid4().hex[:10]}"
    db_uri = POSTGRES.rsplit("/", 1)[0] + f"/{database}"
    folder = tmp_path_factory.mktemp("tracking-server")
    running = TrackingServer(db_uri, folder / "artifacts", folder / "server.log")
    running.start()
    yield running
    if running.process and running.process.poll() is None:
        running.stop()
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def sweep_command(tmp_path: Path, cache_dir: Path, *store: str) -> list:
    return [sys.executable, "-m", "mlrb", "-m", f"seed={','.join(map(str, SEEDS))}", QUICK, "hydra.launcher.slots=4",
            f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *store]  # fmt: skip


def recorded(client) -> tuple:
    """(the sweep's parent run, {run name: what the store holds for it})."""
    experiment = client.get_experiment_by_name("llm_merging").experiment_id
    runs = client.search_runs([experiment], max_results=1000)
    (parent,) = [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"]
    children = {}
    for run in runs:
        if run is parent:
            continue
        histories = {key: len(client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics}
        children[run.info.run_name] = {
            "status": run.info.status,
            "mlrb.status": run.data.tags.get("mlrb.status"),
            "parent": run.data.tags.get("mlflow.parentRunId") == parent.info.run_id,
            "tags": sorted(k for k in run.data.tags if k in TAGS),
            "metrics": sorted(run.data.metrics),
            "logged once": all(n == 1 for n in histories.values()),
            "params": sorted(run.data.params),
            "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
            "traces": traces_of(client, experiment, run.info.run_id),
        }
    return parent, runs, children


def traces_of(client, experiment: str, run_id: str) -> list:
    """Each of the run's traces as its spans' (name, type), in order."""
    import mlflow

    # MLflow reads a trace's spans kept as an mlflow-artifacts file through the process-wide URI.
    mlflow.set_tracking_uri(client.tracking_uri)
    try:
        traces = client.search_traces(locations=[experiment], run_id=run_id)
    finally:
        mlflow.set_tracking_uri(None)
    return [[(span.name, span.span_type) for span in sorted(trace.data.spans, key=lambda s: s.start_time_ns)]
            for trace in traces]  # fmt: skip


def check_sweep(client, out: str) -> tuple:
    parent, runs, children = recorded(client)
    assert sorted(children) == sorted(f"llm_merging/baseline/smoke/{s}" for s in SEEDS), out[-3000:]
    for name, run in children.items():
        assert run["status"] == "FINISHED" and run["mlrb.status"] == "no_submission", (name, run)
        assert run["parent"] and run["logged once"], (name, run)
        assert run["tags"] == TAGS and run["metrics"] == METRICS and run["artifacts"] == ARTIFACTS, (name, run)
        assert run["traces"] == [[("step 1", "AGENT"), ("shell", "TOOL")]], (name, run)  # the baseline's one step
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["jobs"] == JOBS and parent.data.metrics["jobs_done"] == JOBS
    assert parent.data.metrics["jobs_failed"] == 0 and parent.data.metrics["n"] == JOBS
    assert f"{JOBS} runs ({JOBS} no submission)" in out and out.count("llm_merging/baseline/smoke/") >= JOBS
    return parent, runs, children


@pytest.mark.system
@ONE_SERVER
def test_a_sweep_through_the_server_loses_nothing_when_it_restarts_and_matches_sqlite(server, tmp_path, built_cache):
    from mlflow.tracking import MlflowClient

    (tmp_path / "a").mkdir()
    sweep = subprocess.Popen(
        sweep_command(tmp_path / "a", built_cache, "tracking=server", f"tracking.uri={server.uri}"),
        cwd=tmp_path / "a", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    client = MlflowClient(server.uri)
    # Once the first jobs log, the server goes away for 10 s and comes back (a restart).
    deadline = time.monotonic() + 300
    while (
        not client.search_experiments(filter_string="name = 'llm_merging'")
        or len(client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])) < 3
    ):  # the parent and two jobs' runs
        assert sweep.poll() is None and time.monotonic() < deadline, "the sweep did not start its jobs"
        time.sleep(0.5)
    server.stop()
    stopped = time.monotonic()
    time.sleep(10)
    server.start()
    down_s = time.monotonic() - stopped
    out, _ = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, out[-4000:]
    parent, runs, on_server = check_sweep(client, out)
    assert down_s >= 10 and "4 running" in out  # 4 jobs wrote at once
    assert "0 failed" in out and "failed\n" not in out.replace("0 failed", "")
    # every run's artifact is in the server's shared folder, and nothing else (MLflow may keep a
    # trace's spans there too, under traces/; the traces themselves were checked above)
    files = sorted(p.name for p in server.artifacts.rglob("*")
                   if p.is_file() and "traces" not in p.relative_to(server.artifacts).parts)  # fmt: skip
    assert files == sorted(ARTIFACT_FILES * JOBS)

    # the report reads the server: its table is the store's
    report = run_cli_module("mlrb.report", "--tracking-uri", server.uri, "--sweep", parent.data.tags["mlrb.sweep_id"],
                            "--no-plots", "--out", str(tmp_path / "report"), cwd=tmp_path)  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    rows = read_csv(tmp_path / "report" / "runs.csv")
    children = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert sorted(r["run_id"] for r in rows) == sorted(r.info.run_id for r in children)
    by_id = {r.info.run_id: r for r in children}
    for row in rows:
        run = by_id[row["run_id"]]
        assert (row["name"], row["mlflow_status"], row["kind"]) == (run.info.run_name, "FINISHED", "no_submission")
        assert float(row["wall_time_s"]) == pytest.approx(run.data.metrics["wall_time_s"])
    (summary,) = read_csv(tmp_path / "report" / "summary.csv")
    counts = (summary["runs"], summary["attempts"], summary["valid"], summary["no_submission"])
    assert counts == (str(JOBS), str(JOBS), "0", str(JOBS))
    assert float(summary["wall_time_s_mean"]) == pytest.approx(mean(r.data.metrics["wall_time_s"] for r in children))

    # the same sweep into a fresh SQLite store records the same
    (tmp_path / "b").mkdir()
    sqlite = subprocess.run(sweep_command(tmp_path / "b", built_cache, f"tracking.dir={tmp_path / 'b' / 'mlruns'}"),
                            cwd=tmp_path / "b", capture_output=True, text=True, timeout=600)  # fmt: skip
    assert sqlite.returncode == 0, sqlite.stdout[-3000:] + sqlite.stderr[-3000:]
    _, _, in_sqlite = check_sweep(mlflow_client(tmp_path / "b"), sqlite.stdout)
    assert in_sqlite == on_server


def run_cli_module(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.fast
def test_serve_refuses_in_one_line_when_postgresql_is_not_reachable(tmp_path):
    dead, http = free_port(), free_port()  # nothing listens on either
    started = time.monotonic()
    result = run_cli_module(
        "mlrb.tracking", "serve", "--backend-store-uri", f"postgresql://mlrb:s3cret@127.0.0.1:{dead}/mlflow",
        "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(http), cwd=tmp_path,
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"mlrb.tracking: error: PostgreSQL at 127.0.0.1:{dead} is not reachable")
    assert "Connection refused" in lines[0] and "pg_ctlcluster" in lines[0]
    assert "s3cret" not in result.stdout + result.stderr
    assert time.monotonic() - started < 30 and not port_open(http)  # no server was started
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.fast
def test_a_slurm_sweep_refuses_sqlite_in_one_line_and_names_the_server(tmp_path):
    result = run_cli("-m", "launcher=slurm", "seed=1,2", f"tracking.dir={tmp_path / 'mlruns'}",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert lines[0].startswith("mlrb: error: launcher=slurm with an SQLite tracking store: SQLite on a shared ")
    assert "loses writes under concurrent jobs" in lines[0] and "tracking=server" in lines[0]
    assert "tracking.allow_sqlite_on_slurm=true" in lines[0]
    assert not list((tmp_path / "sweep").rglob("*.pkl"))  # nothing was submitted
    assert not (tmp_path / "mlruns").exists()  # nor a store made


@pytest.mark.fast
def test_tracking_server_needs_its_address(tmp_path):
    result = run_cli("tracking=server", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                     env={"MLFLOW_TRACKING_URI": ""})  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "tracking=server needs the MLflow server's address: tracking.uri=http://HOST:PORT" in lines[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlruns").exists()


@pytest.mark.system
@ONE_SERVER
def test_a_sweep_whose_server_goes_away_ends_its_jobs_and_its_relaunch_uploads_them_without_running_them(
    server, tmp_path, built_cache
):
    from mlflow.tracking import MlflowClient

    command = [sys.executable, "-m", "mlrb", "-m", "seed=201,202", "task.scales.tiny.baseline_command='sleep 8'",
               "hydra.launcher.slots=2", "tracking=server", f"tracking.uri={server.uri}", "tracking.retry_for_s=3",
               f"paths.cache_dir={built_cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    sweep = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = MlflowClient(server.uri)
    deadline = time.monotonic() + 240
    while True:  # both jobs' runs are open: their agents work (8 s)
        experiment = client.get_experiment_by_name("llm_merging")
        runs = ([r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("mlrb.seed") in ("201", "202")]
                if experiment else [])  # fmt: skip
        if len(runs) == 2:
            break
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()[0][-3000:]
        time.sleep(0.5)
    server.stop()
    out, _ = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, out[-3000:]
    assert "the tracking store cannot be reached" in out and "launch the sweep again once the store is back" in out
    assert "2 done, 0 failed" in out, out[-3000:]  # the jobs ended as they would have
    trajectories = {r.info.run_id: Path(r.data.tags["mlrb.run_dir"]) / "trajectory.jsonl" for r in runs}
    ran_at = {run_id: path.stat().st_mtime_ns for run_id, path in trajectories.items()}

    server.start()
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("finished before while the store was away; its record synced") == 2, again.stdout
    assert {run_id: path.stat().st_mtime_ns for run_id, path in trajectories.items()} == ran_at  # not run again
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("mlrb.seed") in ("201", "202")]
    assert sorted(r.info.run_id for r in runs) == sorted(trajectories)  # the same two runs, no new ones
    for run in runs:
        assert run.info.status == "FINISHED" and run.data.tags["mlrb.status"] == "no_submission"
        assert traces_of(client, experiment.experiment_id, run.info.run_id) == [
            [("step 1", "AGENT"), ("shell", "TOOL")]
        ]
    (parent,) = [r for r in client.search_runs([experiment.experiment_id], "tags.`mlrb.role` = 'sweep'")
                 if r.info.run_id == runs[0].data.tags["mlflow.parentRunId"]]  # fmt: skip
    assert parent.info.status == "FINISHED" and parent.data.metrics["jobs_skipped"] == 2
    assert "2 runs (2 no submission)" in again.stdout


@pytest.mark.system
@ONE_SERVER
def test_a_run_whose_server_goes_away_finishes_and_sync_stores_it_as_a_live_run_holds_it(server, tmp_path, built_cache):
    """Runs last in this module: it stops the module's server, and starts it again for the sync."""
    import psycopg
    from mlflow.tracking import MlflowClient

    def command(seed: int) -> list[str]:  # the store's retries as a user has them: tracking.retry_for_s=300
        return [sys.executable, "-m", "mlrb", "tracking=server", f"tracking.uri={server.uri}",
                "task.scales.tiny.baseline_command='sleep 10'", f"seed={seed}", f"paths.cache_dir={built_cache}",
                f"hydra.run.dir={tmp_path / f'run-{seed}'}"]  # fmt: skip

    started = time.monotonic()
    live = subprocess.run(command(98), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    live_took = time.monotonic() - started
    assert live.returncode == 0 and "not yet in the tracking store" not in live.stdout, live.stderr[-3000:]
    started = time.monotonic()
    run = subprocess.Popen(command(99), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = MlflowClient(server.uri)
    deadline = time.monotonic() + 180
    found = []
    while not found:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.5)
        experiment = client.get_experiment_by_name("llm_merging")
        found = client.search_runs([experiment.experiment_id], "tags.`mlrb.seed` = '99'") if experiment else []
    run_id = found[0].info.run_id
    trajectory = tmp_path / "run-99" / "trajectory.jsonl"
    while not (trajectory.exists() and '"tool_call"' in trajectory.read_text()):  # the agent's step has begun
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.2)
    server.stop()  # while the agent still works, and until the run has ended
    out, err = run.communicate(timeout=300)
    took = time.monotonic() - started

    # the run goes on and ends as it would have: exit 0, its result, and one line saying where its record is
    assert run.returncode == 0, err[-3000:]
    assert "llm_merging/baseline/smoke/99: no score (invalid: no submission" in out and f"mlflow run {run_id}" in out
    (line,) = [line for line in out.splitlines() if "not yet in the tracking store" in line]
    run_dir = line.split("its record is complete in ")[1].split(":")[0]
    assert f"`python -m mlrb.sync {run_dir}` uploads it" in line
    # no write is waited for during the run, and at its end the server is found away at once, instead of
    # waiting through the store's five minutes of retries (it takes about 2 s longer than the live run now:
    # where those seconds go is not yet found, so the bound is the live run's time and 5 s)
    assert took <= live_took + 5, (took, live_took)
    with psycopg.connect(server.db_uri) as connection:  # the store still shows it unfinished
        (status,) = connection.execute("select status from runs where run_uuid = %s", [run_id]).fetchone()
    assert status == "RUNNING"

    server.start()
    synced = run_cli_module("mlrb.sync", run_dir, cwd=tmp_path)  # to the store the run was recorded for
    assert synced.returncode == 0, synced.stderr[-2000:]
    assert f"status FINISHED (run {run_id})" in synced.stdout
    # the store now holds what a run logged live holds: params, tags, metrics with their steps, artifacts, traces
    live_run, offline_run = (client.search_runs([experiment.experiment_id], f"tags.`mlrb.seed` = '{seed}'")[0]
                             for seed in (98, 99))  # fmt: skip
    assert offline_run.info.run_id == run_id and offline_run.info.status == live_run.info.status == "FINISHED"
    assert sorted(offline_run.data.params) == sorted(live_run.data.params)
    # (a sync marks the run it made whole in the store: the live run needed none)
    assert sorted(set(offline_run.data.tags) - {Tag.SYNCED_RECORD}) == sorted(live_run.data.tags)
    assert offline_run.data.tags["mlrb.status"] == live_run.data.tags["mlrb.status"] == "no_submission"

    def histories(run) -> dict:
        return {key: [m.step for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics}

    assert histories(offline_run) == histories(live_run)
    assert offline_run.data.metrics["valid"] == 0 and offline_run.data.metrics["agent_time_s"] >= 10
    # the agent is charged its 10 s step, as the live run's agent is, not the store's retries
    assert offline_run.data.metrics["agent_time_s"] <= 1.1 * live_run.data.metrics["agent_time_s"]

    def files(run_id: str, folder: str | None = None) -> list:
        entries = client.list_artifacts(run_id, folder)
        return sorted(f for e in entries for f in (files(run_id, e.path) if e.is_dir else [e.path]))

    assert files(run_id) == files(live_run.info.run_id)
    # and its trace, which the store could not take live: the baseline's one step, with its own times
    assert traces_of(client, experiment.experiment_id, run_id) == traces_of(client, experiment.experiment_id,
                                                                           live_run.info.run_id)  # fmt: skip
    assert traces_of(client, experiment.experiment_id, run_id) == [[("step 1", "AGENT"), ("shell", "TOOL")]]
    # a second sync finds nothing to do
    again = run_cli_module("mlrb.sync", run_dir, cwd=tmp_path)
    assert again.returncode == 0 and "in sync, nothing to upload" in again.stdout, again.stdout + again.stderr
