"""A new SQLite store starts as a copy of an empty one this MLflow made (mlrb/store/empty_tables.py):
the same schema as MLflow's migrations make, its own default experiment, and a kept copy that
MLflow refuses is replaced, never the cause of a failed store."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from mlrb.core.config import TrackingConfig
from mlrb.store import empty_tables, tracking


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own ($MLRB_CACHE_DIR), with no kept store in it yet."""
    monkeypatch.setenv("MLRB_CACHE_DIR", str(tmp_path / "cache"))
    empty_tables.kept_path.cache_clear()
    yield tmp_path / "cache"
    empty_tables.kept_path.cache_clear()


@pytest.fixture
def migrations(monkeypatch) -> list[str]:
    """The stores MLflow made by running its migrations (MLflow's own function, watched)."""
    import mlflow.store.db.utils as db_utils

    made: list[str] = []
    real = db_utils._initialize_tables

    def initialize_tables(engine):
        made.append(str(engine.url))
        return real(engine)

    monkeypatch.setattr(db_utils, "_initialize_tables", initialize_tables)
    return made


def schema(db: Path) -> list[tuple]:
    connection = sqlite3.connect(db)
    try:
        tables = connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return tables + connection.execute("SELECT * FROM alembic_version").fetchall()
    finally:
        connection.close()


def default_experiment(folder: Path):
    from mlflow.tracking import MlflowClient

    (experiment,) = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    return experiment


@pytest.mark.fast
def test_a_second_new_store_is_a_copy_with_the_schema_the_migrations_make_and_its_own_default_experiment(
    tmp_path, cache, migrations
):
    first, second = tmp_path / "first", tmp_path / "second"
    tracking.check_store(TrackingConfig(dir=str(first)))
    assert empty_tables.kept_path().is_file() and empty_tables.kept_path().is_relative_to(cache)
    tracking.check_store(TrackingConfig(dir=str(second)))
    assert migrations == [f"sqlite:///{first / 'mlflow.db.creating'}"]  # the second was copied
    assert schema(second / "mlflow.db") == schema(first / "mlflow.db")
    for folder in (first, second):
        experiment = default_experiment(folder)
        assert (experiment.experiment_id, experiment.name) == ("0", "Default")
        assert experiment.artifact_location == f"{(folder / 'artifacts').as_uri()}/0"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{second / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("copied"))
    client.log_metric(run.info.run_id, "score", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"score": 0.5}
    assert [e.name for e in MlflowClient(f"sqlite:///{first / 'mlflow.db'}").search_experiments()] == ["Default"]


@pytest.mark.fast
@pytest.mark.parametrize("kept", ["not-a-database", "an-older-schema", "holds-a-run"])
def test_a_kept_store_that_holds_something_or_that_mlflow_refuses_is_replaced_and_the_new_store_made_whole(
    tmp_path, cache, migrations, caplog, kept
):
    tracking.check_store(TrackingConfig(dir=str(tmp_path / "first")))
    path = empty_tables.kept_path()
    if kept == "not-a-database":
        path.write_bytes(b"not a database" * 100)
    elif kept == "an-older-schema":
        connection = sqlite3.connect(path)
        with connection:
            connection.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")  # MLflow 1.0's schema
        connection.close()
    else:  # a run some other process wrote there: no new store may start with it
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{path}")
        client.create_run(client.create_experiment("planted"))
    with caplog.at_level(logging.WARNING, logger="mlrb.store.empty_tables"):
        tracking.check_store(TrackingConfig(dir=str(tmp_path / "second")))
    assert [r.getMessage() for r in caplog.records if r.name == "mlrb.store.empty_tables"] == [
        f"the empty store kept in {path} was refused; removed, and this store made afresh"
    ]
    assert len(migrations) == 2  # the first store, then the second made by the migrations
    assert default_experiment(tmp_path / "second").name == "Default"  # its one experiment: nothing planted
    assert schema(path)[-1] == schema(tmp_path / "first" / "mlflow.db")[-1]  # kept again, whole
    tracking.check_store(TrackingConfig(dir=str(tmp_path / "third")))
    assert len(migrations) == 2


@pytest.mark.fast
def test_a_cache_that_cannot_be_written_only_goes_unused(tmp_path, monkeypatch, migrations):
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("MLRB_CACHE_DIR", str(blocked))
    empty_tables.kept_path.cache_clear()
    try:
        for name in ("first", "second"):
            tracking.check_store(TrackingConfig(dir=str(tmp_path / name)))
            assert default_experiment(tmp_path / name).name == "Default"
    finally:
        empty_tables.kept_path.cache_clear()
    assert len(migrations) == 2


@pytest.mark.fast
def test_a_kept_store_removed_while_a_new_store_is_copied_from_it_leaves_that_store_made_by_mlflow(
    tmp_path, cache, migrations, monkeypatch
):
    """Another process removes the kept copy (it found it refused) between this one finding it and copying it."""
    import shutil

    tracking.check_store(TrackingConfig(dir=str(tmp_path / "first")))
    real_copy = shutil.copyfile

    def copy_after_another_process_removed_it(source, target):
        if Path(source) == empty_tables.kept_path():
            Path(source).unlink()
        return real_copy(source, target)

    monkeypatch.setattr(shutil, "copyfile", copy_after_another_process_removed_it)
    tracking.check_store(TrackingConfig(dir=str(tmp_path / "second")))
    assert default_experiment(tmp_path / "second").name == "Default"
    assert len(migrations) == 2
