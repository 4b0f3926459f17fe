"""The store's runs read in one search (mlrb/store/run_search.py): against a real tracking server
(`python -m mlrb.tracking serve` on PostgreSQL), its pages asked for a few at a time and its runs made from the
JSON are the runs MLflow's own client pages through, in the same order, with the same info, params,
tags and metrics; a filter narrows both alike; a SQLite store is paged through the client."""

from __future__ import annotations

import math

import pytest

from mlrb.store import run_search
from tests.test_tracking_server import server  # noqa: F401 - the fixture: a server on a PostgreSQL database of its own


def fill(client, runs: int) -> list[str]:
    """RUNS runs of one experiment as the harness's look in the store: params, tags, metrics with
    history (a NaN among them); the last one still running, without an end time."""
    from mlflow.entities import Metric, Param, RunTag

    experiment = client.create_experiment("llm_merging")
    ids = []
    for i in range(runs):
        run = client.create_run(experiment, start_time=1_700_000_000_000 + 1000 * (i % 5), run_name=f"r/{i}")
        client.log_batch(run.info.run_id, params=[Param(f"task.p{k}", f"v{i}-{k}") for k in range(12)],
                         tags=[RunTag("mlrb.agent", "claude" if i % 2 else "baseline"), RunTag("mlrb.seed", str(i))],
                         metrics=[Metric("score", 0.5 + i / 100, 1_700_000_000_000 + i, 0),
                                  Metric("score", 0.6 + i / 100, 1_700_000_000_500 + i, 3),
                                  Metric("loss", math.nan, 1_700_000_000_000, 1)])  # fmt: skip
        if i < runs - 1:
            client.set_terminated(run.info.run_id, "FAILED" if i == 3 else "FINISHED", end_time=1_700_000_900_000 + i)
        ids.append(run.info.run_id)
    return [experiment]


def described(run) -> tuple:
    metrics = sorted((m.key, str(m.value), m.timestamp, m.step) for m in run.data._metric_objs)
    return dict(run.info), run.data.params, run.data.tags, {k: str(v) for k, v in run.data.metrics.items()}, metrics


@pytest.mark.system
def test_a_servers_runs_read_page_by_page_at_once_are_the_clients_runs(server, monkeypatch):  # noqa: F811
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.uri)
    experiments = fill(client, 11)
    through_client = run_search.paged(client, experiments, "")
    monkeypatch.setattr(run_search, "PAGE", 2)  # six pages, asked for three at a time
    monkeypatch.setattr(run_search, "AT_ONCE", 3)
    asked = []
    real_asker = run_search.PageAsker.__call__
    monkeypatch.setattr(
        run_search.PageAsker, "__call__", lambda self, token: asked.append(token) or real_asker(self, token)
    )
    found = run_search.search_all(client, experiments)
    assert len(found) == len(through_client) == 11
    assert [described(r) for r in found] == [described(r) for r in through_client]
    assert [r.info.status for r in found].count("RUNNING") == 1 and [r.info.end_time for r in found].count(None) == 1
    assert len(asked) >= 6 and asked[0] is None

    claude = "tags.`mlrb.agent` = 'claude'"
    narrowed = run_search.search_all(client, experiments, claude)
    assert [r.info.run_id for r in narrowed] == [r.info.run_id for r in run_search.paged(client, experiments, claude)]
    assert len(narrowed) == 5


@pytest.mark.fast
def test_a_token_that_is_not_an_offset_is_followed_page_after_page():
    assert run_search.offset_of(run_search.offset_token(2000)) == 2000
    assert run_search.offset_of("not-base64!") is None
    assert run_search.offset_of("eyJwYWdlIjogMn0=") is None  # {"page": 2}: another server's kind of token
    assert run_search.offset_of(None) is None


@pytest.mark.fast
def test_a_sqlite_store_is_read_through_the_client(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiments = fill(client, 3)
    assert [described(r) for r in run_search.search_all(client, experiments)] == [
        described(r) for r in client.search_runs(experiments)
    ]
