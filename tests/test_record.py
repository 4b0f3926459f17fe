"""The run folder's record (mlrb/record.py): every fact sent to the tracking store is appended
to <run folder>/record.jsonl first, in a versioned format that folds into what the store holds."""

from __future__ import annotations

import json

import pytest

from conftest import assert_record_matches_store, mlflow_client
from mlrb import record, tracking
from mlrb.config import TrackingConfig


@pytest.mark.fast
def test_every_call_is_in_the_record_and_the_record_folds_into_what_the_store_holds(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scorer.log").write_text("scored\n")
    (run_dir / "snapshots" / "step-1").mkdir(parents=True)
    (run_dir / "snapshots" / "step-1" / "train.py").write_text("print(1)\n")
    opened_with = {"mlrb.run_dir": str(run_dir), "mlrb.seed": 0}
    store = tracking.open_run(TrackingConfig(dir=str(tmp_path / "mlruns")), "record", "record/0", opened_with)
    recorder = record.RecordedRun(store, run_dir, opened_with)
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
    state = assert_record_matches_store(client, client.get_run(store.run_id))
    assert state["metrics"] == {"llm.cost_usd": [[1, 0.01], [2, 0.03]]}
    assert state["tags"]["mlrb.status"] == "ok" and state["status"] == "FINISHED" and state["attempt"] == 1


@pytest.mark.fast
def test_a_record_of_another_format_version_is_refused_by_name(tmp_path):
    (tmp_path / "record.jsonl").write_text(json.dumps({"v": 2, "t": 0, "kind": "opened"}) + "\n")
    with pytest.raises(ValueError, match=r"record.jsonl: record format version 2, this mlrb reads 1"):
        record.read(tmp_path)
