"""The run folder's record (mlrb/store/record.py): every fact sent to the tracking store is appended
to <run folder>/record.jsonl first, in a versioned format that folds into what the store holds."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, assert_record_matches_store, mlflow_client, run_cli
from mlrb.core.config import TrackingConfig
from mlrb.store import record, recording_process, tracking


@pytest.mark.fast
def test_every_call_is_in_the_record_and_the_record_folds_into_what_the_store_holds(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scorer.log").write_text("scored\n")
    (run_dir / "snapshots" / "step-1").mkdir(parents=True)
    (run_dir / "snapshots" / "step-1" / "train.py").write_text("print(1)\n")
    opened_with = {"mlrb.run_dir": str(run_dir), "mlrb.seed": 0}
    store = recording_process.start().store_run(TrackingConfig(dir=str(tmp_path / "mlruns")))
    recorder = record.RecordedRun(store, run_dir, "record", "record/0", opened_with, record.new_run_id())
    recorder.log_params({"seed": "0", "task.name": "llm_merging"})
    recorder.set_tags({"mlrb.status": "running", "mlrb.valid": True})
    recorder.log_metrics({"llm.cost_usd": 0.01, "llm.latency_s": None}, step=1)  # None: not logged, as by MLflow
    recorder.log_metrics({"llm.cost_usd": 0.03}, step=2)
    recorder.log_text("seed: 0\n", "config.yaml")
    recorder.log_file(run_dir / "scorer.log")
    recorder.log_file(run_dir / "missing.log")  # not there: logged nowhere
    recorder.log_folder(run_dir / "snapshots", "snapshots")
    recorder.set_tags({"mlrb.status": "ok"})  # a later value replaces the earlier one
    recorder.finish("FINISHED")

    lines = [json.loads(line) for line in (run_dir / "record.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["opened", "params", "tags", "metrics", "metrics", "artifact",
                                                "artifact", "artifact", "tags", "status"]  # fmt: skip
    assert {line["v"] for line in lines} == {record.VERSION}
    assert (run_dir / "record" / "config.yaml").read_text() == "seed: 0\n"  # the text is a file of the run folder
    client = mlflow_client(tmp_path)
    run = client.get_run(recorder.shown_id)
    assert run.data.tags["mlrb.run_id"] == recorder.run_id == lines[0]["run_id"] != run.info.run_id  # found by it
    state = assert_record_matches_store(client, run)
    assert state["metrics"] == {"llm.cost_usd": [[1, 0.01], [2, 0.03]]}
    assert state["tags"]["mlrb.status"] == "ok" and state["status"] == "FINISHED" and state["attempt"] == 1


@pytest.mark.fast
def test_a_record_of_another_format_version_is_refused_by_name(tmp_path):
    (tmp_path / "record.jsonl").write_text(json.dumps({"v": 2, "t": 0, "kind": "opened"}) + "\n")
    with pytest.raises(ValueError, match=r"record.jsonl: record format version 2, this mlrb reads 1"):
        record.read(tmp_path)


def recorded_run(tmp_path, store_dir):
    """A run recorded into STORE_DIR through the record, as a run does: its folder and run id."""
    run_dir = tmp_path / "outputs" / "runs" / "run-0"
    (run_dir / "snapshots" / "step-1").mkdir(parents=True)
    (run_dir / "snapshots" / "step-1" / "train.py").write_text("print(1)\n")
    (run_dir / "trajectory.jsonl").write_text('{"step": 1}\n')
    opened_with = {"mlrb.run_dir": str(run_dir), "mlrb.task": "llm_merging"}
    store = recording_process.start().store_run(TrackingConfig(dir=str(store_dir)))
    recorder = record.RecordedRun(store, run_dir, "llm_merging", "llm_merging/claude/smoke/0", opened_with,
                                  record.new_run_id())  # fmt: skip
    recorder.log_params({"seed": "0", "long": "x" * 7000})  # longer than MLflow keeps
    recorder.log_text("seed: 0\n", "config.yaml")
    for step in (1, 2, 3):
        recorder.log_metrics({"llm.cost_usd": 0.01 * step, "llm.latency_s": 1.0}, step=step)  # equal values at 3 steps
    recorder.log_file(run_dir / "trajectory.jsonl")
    recorder.log_folder(run_dir / "snapshots", "snapshots")
    recorder.set_tags({"mlrb.status": "ok", "mlrb.valid": True})
    recorder.log_metrics({"score": 0.55})
    recorder.finish("FINISHED")
    return run_dir, recorder.shown_id


def store_content(client, run) -> dict:
    from mlrb.sync import artifact_files

    # each value with its step and the time it was logged at: a synced value keeps the live run's
    history = {key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run.info.run_id, key))
               for key in run.data.metrics}  # fmt: skip
    # the run's own tags: not the one a sync marks its store's run with once the run is whole there
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("mlrb.") and k != "mlrb.synced_record"}
    return {"name": run.info.run_name, "status": run.info.status, "params": run.data.params, "tags": tags,
            "metrics": history, "artifacts": artifact_files(client, run.info.run_id)}  # fmt: skip


@pytest.mark.fast
def test_sync_puts_a_run_from_its_record_into_an_empty_store_once(tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    from mlrb import sync

    run_dir, original_id = recorded_run(tmp_path, tmp_path / "live")
    live = MlflowClient(f"sqlite:///{tmp_path / 'live' / 'mlflow.db'}")
    expected = store_content(live, live.get_run(original_id))
    assert expected["artifacts"] == {"config.yaml", "trajectory.jsonl", "snapshots/step-1/train.py"}

    monkeypatch.chdir(tmp_path)  # the run folder named as a user in its project names it: relative
    sync.main([str(run_dir.relative_to(tmp_path)), "--tracking-dir", str(tmp_path / "rebuilt")])
    rebuilt = MlflowClient(f"sqlite:///{tmp_path / 'rebuilt' / 'mlflow.db'}")
    (run,) = rebuilt.search_runs([rebuilt.get_experiment_by_name("llm_merging").experiment_id])
    assert store_content(rebuilt, run) == expected  # what a run logged live holds
    assert run.data.tags["mlrb.run_id"] == record.fold(record.read(run_dir))["run_id"]  # the record's own id
    assert "2 params, " in capsys.readouterr().out

    sync.main(["--all", "--outputs", str(tmp_path / "outputs"), "--tracking-dir", str(tmp_path / "rebuilt")])
    assert capsys.readouterr().out.strip() == f"{run_dir}: in sync, nothing to upload (run {run.info.run_id})"
    assert store_content(rebuilt, rebuilt.get_run(run.info.run_id)) == expected  # nothing twice
    sync.main([str(run_dir), "--tracking-dir", str(tmp_path / "live")])  # the run's own store: complete already
    assert capsys.readouterr().out.strip() == f"{run_dir}: in sync, nothing to upload (run {original_id})"


@pytest.mark.fast
def test_a_sync_stopped_half_way_is_finished_by_the_next_without_duplicates(tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    from mlrb import sync

    run_dir, original_id = recorded_run(tmp_path, tmp_path / "live")
    live = MlflowClient(f"sqlite:///{tmp_path / 'live' / 'mlflow.db'}")
    expected = store_content(live, live.get_run(original_id))
    full = (run_dir / record.FILE).read_text()
    lines = full.splitlines(keepends=True)
    # As far as a sync had come when it was stopped: the record up to the second metric line.
    (run_dir / record.FILE).write_text("".join(lines[:5]))
    sync.main([str(run_dir), "--tracking-dir", str(tmp_path / "rebuilt")])
    (run_dir / record.FILE).write_text(full)
    monkeypatch.chdir(tmp_path)  # the run folder named as a user in its project names it: relative
    sync.main([str(run_dir.relative_to(tmp_path)), "--tracking-dir", str(tmp_path / "rebuilt")])
    rebuilt = MlflowClient(f"sqlite:///{tmp_path / 'rebuilt' / 'mlflow.db'}")
    (run,) = rebuilt.search_runs([rebuilt.get_experiment_by_name("llm_merging").experiment_id])
    assert store_content(rebuilt, run) == expected


# Syncs of argv[1] into stores under argv[2], each in a process forked from this one (MLflow imported
# once), which kills itself (SIGKILL: no handler, no cleanup) just before its Nth write to the store:
# first one that is not killed, which counts the writes, then one killed before each of them. Prints
# {"writes": count, "signals": [the signal that ended each]}.
KILLED_AT_EACH_WRITE = """
import json, os, shutil, signal, sys
from mlflow.tracking import MlflowClient
from mlrb import sync
from mlrb.store import tracking
from mlrb.core.config import TrackingConfig
run_dir, root = sys.argv[1], sys.argv[2]
writes, kill_at = 0, -1
def counted(method):
    def write(*args, **kwargs):
        global writes
        if writes == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        writes += 1
        return method(*args, **kwargs)
    return write
for name in ("create_run", "log_batch", "log_text", "log_artifact", "log_artifacts", "set_terminated"):
    setattr(MlflowClient, name, counted(getattr(MlflowClient, name)))
def forked(work):
    pid = os.fork()
    if pid == 0:
        work()
        os._exit(min(writes, 255))
    return os.waitpid(pid, 0)[1]
def forked_sync(store, kill):
    def work():
        global kill_at
        kill_at = kill
        sync.main([run_dir, "--tracking-dir", store])
    shutil.copytree(root + "/empty", store)  # made once: an empty store's migrations take seconds
    return forked(work)
tracking.check_store(TrackingConfig(dir=root + "/empty"))  # here: what opening a store imports, each fork has
status = forked_sync(root + "/whole", -1)
count = os.WEXITSTATUS(status)
signals = [os.WTERMSIG(s) if os.WIFSIGNALED(s) else None
           for s in (forked_sync(f"{root}/killed-{n}", n) for n in range(count))]
print(json.dumps({"writes": count, "signals": signals}))
"""


@pytest.mark.integration
def test_a_sync_killed_at_any_write_is_finished_by_the_next_without_duplicates(tmp_path, capsys):
    import signal
    import subprocess

    from mlflow.tracking import MlflowClient

    from mlrb import sync

    run_dir, original_id = recorded_run(tmp_path, tmp_path / "live")
    live = MlflowClient(f"sqlite:///{tmp_path / 'live' / 'mlflow.db'}")
    expected = store_content(live, live.get_run(original_id))
    syncs = subprocess.run([sys.executable, "-c", KILLED_AT_EACH_WRITE, str(run_dir), str(tmp_path)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert syncs.returncode == 0, syncs.stderr[-3000:]
    killed = json.loads(syncs.stdout.strip().splitlines()[-1])
    # The run, its params, tags, metric values, artifacts and end: a sync can be cut off before each.
    assert killed["writes"] >= 8 and killed["signals"] == [signal.SIGKILL] * killed["writes"]
    for kill_at in range(killed["writes"]):
        store = tmp_path / f"killed-{kill_at}"
        sync.main([str(run_dir), "--tracking-dir", str(store)])
        client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
        assert store_content(client, run) == expected, f"killed before write {kill_at}"
        capsys.readouterr()
        sync.main([str(run_dir), "--tracking-dir", str(store)])
        assert capsys.readouterr().out.strip().endswith(f"in sync, nothing to upload (run {run.info.run_id})")


def copies_of(run_dir: Path, count: int, first: int = 1) -> list[Path]:
    """COUNT run folders beside RUN_DIR (run-FIRST, ...), each a copy of it recorded as another run (its own id)."""
    import shutil

    folders = []
    for n in range(first, first + count):
        folder = run_dir.with_name(f"run-{n}")
        shutil.copytree(run_dir, folder)
        text = (folder / record.FILE).read_text()
        lines = [json.loads(line) for line in text.splitlines()]
        run_id = record.new_run_id()
        lines[0] = {**lines[0], "run_id": run_id, "tags": {**lines[0]["tags"], "mlrb.run_id": run_id,
                                                          "mlrb.run_dir": str(folder)}}  # fmt: skip
        (folder / record.FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
        folders.append(folder)
    return folders


def store_calls(monkeypatch) -> dict:
    """Every call of the MLflow client's methods from here on, counted by name."""
    from collections import Counter

    from mlflow.tracking import MlflowClient

    calls: Counter = Counter()
    for name in ("search_experiments", "search_runs", "get_run", "get_metric_history", "list_artifacts",
                 "search_traces", "get_experiment_by_name", "create_run", "log_batch", "log_artifact",
                 "log_artifacts", "set_terminated"):  # fmt: skip
        method = getattr(MlflowClient, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(MlflowClient, name, counted)
    return calls


@pytest.mark.fast
def test_a_sync_of_many_runs_already_in_the_store_asks_it_a_few_times_in_all(tmp_path, capsys, monkeypatch):
    """A lab's `python -m mlrb.sync --all` over thousands of runs it synced before: the store's runs are
    read in one paged search and each run is found whole by its tag, so the store is asked the same
    few times for 3 runs as for 6 (before, some 50 requests per run: a metric's history each). A
    new run is created and written without asking what it holds; a single run in sync is looked up
    alone."""
    from mlrb import sync

    monkeypatch.setattr(sync, "INDEX_FROM", 2)
    run_dir, _ = recorded_run(tmp_path, tmp_path / "live")
    outputs = tmp_path / "outputs"
    store = ["--outputs", str(outputs), "--tracking-dir", str(tmp_path / "rebuilt")]
    copies_of(run_dir, 2)
    calls = store_calls(monkeypatch)
    sync.main(["--all", *store])  # three new runs
    assert calls["create_run"] == 3 and not calls["get_metric_history"] and not calls["list_artifacts"]
    asked = {}
    for count in (3, 6):
        if count == 6:
            copies_of(run_dir, 3, first=3)
            sync.main(["--all", *store])
        capsys.readouterr()
        calls.clear()
        sync.main(["--all", *store])
        said = capsys.readouterr().out.splitlines()
        assert len(said) == count and all("in sync, nothing to upload" in line for line in said)
        asked[count] = dict(calls)
    assert asked[3] == asked[6] and sum(asked[6].values()) <= 3, asked  # the store's check, then one search
    calls.clear()
    sync.main([str(run_dir), "--tracking-dir", str(tmp_path / "rebuilt")])
    assert sum(calls.values()) <= 3, dict(calls)  # the store's check, then the run looked up


@pytest.mark.fast
def test_a_file_added_to_a_logged_folder_after_a_sync_is_uploaded_by_the_next(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from mlrb import sync
    from mlrb.sync import artifact_files

    run_dir, _ = recorded_run(tmp_path, tmp_path / "live")
    sync.main([str(run_dir), "--tracking-dir", str(tmp_path / "rebuilt")])
    (run_dir / "snapshots" / "step-1" / "later.py").write_text("print(2)\n")
    sync.main([str(run_dir), "--tracking-dir", str(tmp_path / "rebuilt")])
    assert "1 artifacts" in capsys.readouterr().out.splitlines()[-1]
    client = MlflowClient(f"sqlite:///{tmp_path / 'rebuilt' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert "snapshots/step-1/later.py" in artifact_files(client, run.info.run_id)


@pytest.mark.fast
def test_sync_refuses_a_folder_without_a_record_in_one_line(tmp_path, capsys):
    from mlrb import sync

    with pytest.raises(SystemExit) as stop:
        sync.main([str(tmp_path), "--tracking-dir", str(tmp_path / "store")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"mlrb.sync: error: no record.jsonl in {tmp_path}: not a run folder of this mlrb"
    assert not (tmp_path / "store").exists()  # nothing made


@pytest.mark.integration
def test_the_documented_rebuild_of_a_lost_store(tmp_path, cache_dir):
    """docs/runs.md's two lines, as written, after a run from the same folder (of the cheapest real
    task: the lines name none)."""
    import subprocess

    from mlflow.tracking import MlflowClient

    done = run_cli(*HARNESS_TASK, "agent=baseline", cwd=tmp_path, env={"MLRB_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    # Read through a copy: MLflow keeps a store's engine per URI in this process, which would
    # still read the deleted file after `rm -rf mlruns`.
    with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as live_db, sqlite3.connect(tmp_path / "live.db") as copy:
        live_db.backup(copy)  # with what is still in its write-ahead log
    client = MlflowClient(f"sqlite:///{tmp_path / 'live.db'}")
    (live,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    expected = store_content(client, live)
    assert "score_report.json" in expected["artifacts"] and "score" in expected["metrics"]

    block = "rm -rf mlruns\npython -m mlrb.sync --all\n"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-ec", block], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (rebuilt,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert store_content(client, rebuilt) == expected
    assert rebuilt.data.tags["mlrb.run_id"] == live.data.tags["mlrb.run_id"]  # the record's own id, in both


@pytest.mark.fast
def test_sync_of_a_run_whose_store_needs_a_password_says_to_name_it_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from mlrb import sync

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    opened = {"v": record.VERSION, "t": 0, "kind": "opened", "run_id": "abc", "experiment": "e", "run_name": "r",
              "attempt": 1, "tags": {}, "store": {"uri": "http://bob:***@mlflow.example:5000"}}  # fmt: skip
    (run_dir / "record.jsonl").write_text(json.dumps(opened) + "\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        sync.main([str(run_dir)])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"mlrb.sync: error: {run_dir}: its store http://bob:***@mlflow.example:5000 needs a password, which the "
        "record does not keep: name the store with --tracking-uri"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no store made here


@pytest.mark.fast
def test_a_line_is_written_whole_or_not_at_all_and_a_cut_last_line_is_skipped_then_mended(tmp_path):
    from mlrb.core import disk

    path = tmp_path / record.FILE
    disk.append_whole(path, record.line_of("params", params={"a": "1"}).encode())
    with open(path, "a") as f:  # a process killed mid-line
        f.write('{"v": 1, "t": 2, "kind": "tags", "ta')
    assert [line["kind"] for line in record.read(tmp_path)] == ["params"]
    disk.mend(path)  # before the next attempt appends
    disk.append_whole(path, record.line_of("tags", tags={"b": "2"}).encode())
    assert [line["kind"] for line in record.read(tmp_path)] == ["params", "tags"]


@pytest.mark.fast
@pytest.mark.parametrize("away, caught_up", [
    ("RecordingError: OSError: [Errno 28] No space left on device: 'mlruns/artifacts'", True),
    ("RecordingError: OperationalError: (sqlite3.OperationalError) database or disk is full", True),
    ("RecordingError: ConnectionError: Max retries exceeded (Connection refused)", False),
], ids=["no-space", "sqlite-full", "server-away"])  # fmt: skip
def test_a_store_away_only_for_a_full_disk_gets_the_run_at_its_end(tmp_path, away, caught_up):
    """A run whose store was found away mid-run because its disk was full (the agent filled the disk they
    share) is given the rest of its record at its end, once the harness has made room: the store holds it
    FINISHED with its last tags, and the run no longer says it is not yet in the store. A store away for
    any other reason is left to `python -m mlrb.sync`, as before."""
    from mlflow.tracking import MlflowClient

    from mlrb.run import catch_up_store

    run_dir = tmp_path / "outputs" / "runs" / "run-0"
    run_dir.mkdir(parents=True)
    store = recording_process.start().store_run(TrackingConfig(dir=str(tmp_path / "mlruns")))
    recorder = record.RecordedRun(store, run_dir, "llm_merging", "llm_merging/command/smoke/0",
                                  {"mlrb.task": "llm_merging"}, record.new_run_id())  # fmt: skip
    recorder.log_params({"seed": "0"})
    recorder.store_run.flush()
    recorder.store_error = away  # as store_failures notes a failed export; what follows is in the record only
    recorder.set_tags({"mlrb.status": "budget_exhausted", "mlrb.stop_reason": "disk"})
    recorder.log_metrics({"score": 0.5})
    recorder.finish("FINISHED")
    if tracking.store_disk_was_full(recorder.store_error):
        catch_up_store(recorder, run_dir)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert (recorder.store_error is None) == caught_up
    if caught_up:
        assert run.info.status == "FINISHED" and run.data.tags["mlrb.stop_reason"] == "disk"
        assert run.data.metrics["score"] == 0.5 and run.data.params["seed"] == "0"
    else:
        assert run.info.status == "RUNNING" and "mlrb.stop_reason" not in run.data.tags
