"""mlrb's run search on its own tracking server: two routes served beside MLflow's, read straight
from the server's database in a few SQL queries.

MLflow's search sends every param of every run (a harness run has over a hundred: its whole config)
and builds each run through its ORM and protobuf messages, about 6 ms of server CPU a run. The report
and compare read three params. These routes answer what mlrb reads, in MLflow's own order and with
MLflow's own values:

    POST /api/2.0/mlrb/runs/ids {experiment_ids, filter}
        -> {"version": 1, "run_ids": [...]}: the active runs MLflow's search would return, in its
           order (newest first, then by id), all in one query (one snapshot: no page shifts when
           runs are written meanwhile);
    POST /api/2.0/mlrb/runs/get {experiment_ids, run_ids (at most 1000), params (names, or null for all)}
        -> {"runs": [...]}: those runs that are still active, in the order asked, in the JSON shape
           of MLflow's runs/search (info, latest metrics, tags, the params asked for).

What they cannot answer exactly as MLflow's search would (a filter other than `tags.x = 'v'` /
`params.x = 'v'` clauses, a store other than MLflow's SQL store) is answered 501, and the client asks
MLflow's search instead. They pass through the server's middleware like every other route, and read
only the experiments MLflow's search would let the caller read. `python -m mlrb.tracking serve`
serves them through MLflow's app plugin entry point (`mlflow server --app-name mlrb`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

VERSION = 1
IDS = "/api/2.0/mlrb/runs/ids"
GET = "/api/2.0/mlrb/runs/get"
MAX_RUN_IDS = 1000  # runs one `get` may ask for
RUN_NAME_TAG = "mlflow.runName"


class Unsupported(Exception):
    """What these routes cannot answer as MLflow's search would: the client asks MLflow's search."""


class BadRequest(Exception):
    """A body these routes do not take (HTTP 400)."""


def create_app() -> Any:
    """MLflow's server app with mlrb's routes added (the `mlflow.app` entry point `mlrb`)."""
    from mlflow.server import app

    add_routes(app)
    if os.environ.get("_MLFLOW_SGI_NAME", "uvicorn") != "uvicorn":  # gunicorn or waitress serve the Flask app
        return app
    from mlflow.server.fastapi_app import create_fastapi_app

    return create_fastapi_app(app)


def add_routes(app: Any) -> None:
    if "mlrb_run_ids" in app.view_functions:
        return
    app.add_url_rule(IDS, "mlrb_run_ids", run_ids_view, methods=["POST"])
    app.add_url_rule(GET, "mlrb_runs_get", runs_get_view, methods=["POST"])


def run_ids_view() -> Any:
    return answer(lambda body: {"version": VERSION, "run_ids": run_ids(*readable(body), text(body, "filter"))})


def runs_get_view() -> Any:
    def get(body: dict) -> dict:
        store, experiments = readable(body)
        ids, params = body.get("run_ids"), body.get("params")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(ids) > MAX_RUN_IDS:
            raise BadRequest(f"run_ids must be a list of at most {MAX_RUN_IDS} run ids")
        if params is not None and (not isinstance(params, list) or not all(isinstance(p, str) for p in params)):
            raise BadRequest("params must be a list of param names, or null for all")
        return {"runs": runs_of(store, experiments, ids, params)}

    return answer(get)


def answer(work: Any) -> Any:
    """WORK's result for the request's JSON body, as JSON; 400 for a bad body, 501 for what MLflow's
    search must answer. A failure says its kind only: the database's own words may name its address."""
    import logging

    from flask import jsonify, request

    body = request.get_json(silent=True)
    try:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return jsonify(work(body))
    except BadRequest as e:
        return jsonify({"error_code": "INVALID_PARAMETER_VALUE", "message": str(e)}), 400
    except Unsupported as e:
        return jsonify({"error_code": "NOT_IMPLEMENTED", "message": f"ask MLflow's runs/search: {e}"}), 501
    except Exception as e:
        logging.getLogger(__name__).exception("mlrb run search failed")
        return jsonify({"error_code": "INTERNAL_ERROR", "message": f"mlrb run search failed ({type(e).__name__})"}), 500


def text(body: dict, key: str) -> str:
    value = body.get(key) or ""
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def readable(body: dict) -> tuple[Any, list[int]]:
    """(the server's SQL store, the body's experiment ids the caller may read, as MLflow's search
    narrows them)."""
    ids = body.get("experiment_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise BadRequest("experiment_ids must be a list of experiment ids")
    store = sql_store()
    try:  # as MLflow's runs/search does: only the experiments the caller can read, under its auth app
        from mlflow.server import auth

        if auth.auth_config:
            ids = auth.filter_experiment_ids(ids)
    except ImportError:
        pass
    try:
        return store, [int(i) for i in ids]
    except ValueError:
        raise Unsupported("an experiment id that is not a number") from None


def sql_store() -> Any:
    """The server's tracking store when it is MLflow's plain SQL store (a subclass, such as one that
    narrows runs to a workspace, may read differently: MLflow's search answers then)."""
    try:
        from mlflow.server.handlers import _get_tracking_store
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = _get_tracking_store()
    except Exception as e:
        raise Unsupported(f"no tracking store to read ({type(e).__name__})") from None
    if type(store) is not SqlAlchemyStore:
        raise Unsupported(f"the server's store is {type(store).__name__}, not MLflow's SQL store")
    return store


def filter_clauses(filter_string: str, dialect: str) -> list[Any]:
    """FILTER_STRING's clauses as SQL conditions on a run, compared as MLflow's search compares them
    on this database; Unsupported for any clause but `tags.KEY = 'VALUE'` or `params.KEY = 'VALUE'`."""
    from mlflow.store.tracking.dbmodels.models import SqlParam, SqlRun, SqlTag
    from mlflow.utils.search_utils import SearchUtils
    from sqlalchemy import select

    try:
        parsed = SearchUtils.parse_search_filter(filter_string)
    except Exception:
        raise Unsupported("a filter MLflow's search parses") from None
    equal = SearchUtils.get_sql_comparison_func("=", dialect)
    clauses = []
    for clause in parsed:
        entity = {"tag": SqlTag, "parameter": SqlParam}.get(clause.get("type"))
        if entity is None or clause.get("comparator") != "=" or not isinstance(clause.get("value"), str):
            raise Unsupported(f"a {clause.get('type')} clause with {clause.get('comparator')}")
        held = select(entity.run_uuid).where(
            entity.run_uuid == SqlRun.run_uuid, equal(entity.key, clause["key"]), equal(entity.value, clause["value"])
        )
        clauses.append(held.exists())
    return clauses


def run_ids(store: Any, experiments: list[int], filter_string: str) -> list[str]:
    """The active runs of EXPERIMENTS that FILTER_STRING matches, in MLflow's search order."""
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlRun
    from sqlalchemy import select

    clauses = filter_clauses(filter_string, store.engine.dialect.name)
    if not experiments:
        return []
    query = (
        select(SqlRun.run_uuid)
        .where(SqlRun.experiment_id.in_(experiments), SqlRun.lifecycle_stage == LifecycleStage.ACTIVE, *clauses)
        .order_by(SqlRun.start_time.desc(), SqlRun.run_uuid)
    )
    with store.ManagedSessionMaker() as session:
        return [row[0] for row in session.execute(query)]


def runs_of(store: Any, experiments: list[int], ids: Sequence[str], params: list[str] | None) -> list[dict]:
    """The runs of IDS still active in EXPERIMENTS, in IDS's order, as MLflow's runs/search writes
    them (PARAMS only, or all when None)."""
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlParam, SqlRun, SqlTag
    from sqlalchemy import select

    if not ids or not experiments:
        return []
    info = select(
        SqlRun.run_uuid,
        SqlRun.name,
        SqlRun.experiment_id,
        SqlRun.user_id,
        SqlRun.status,
        SqlRun.start_time,
        SqlRun.end_time,
        SqlRun.lifecycle_stage,
        SqlRun.artifact_uri,
    ).where(
        SqlRun.run_uuid.in_(ids), SqlRun.experiment_id.in_(experiments), SqlRun.lifecycle_stage == LifecycleStage.ACTIVE
    )
    with store.ManagedSessionMaker() as session:
        found: dict[str, tuple[Any, dict[str, list]]] = {
            row.run_uuid: (row, {"metrics": [], "params": [], "tags": []}) for row in session.execute(info)
        }
        if not found:
            return []
        within = list(found)
        tags = select(SqlTag.run_uuid, SqlTag.key, SqlTag.value).where(SqlTag.run_uuid.in_(within))
        # rows unpacked as tuples, quicker than by name: a lab's store sends millions of rows
        for run, key, value in session.execute(tags):
            found[run][1]["tags"].append({"key": key, "value": value or ""})
        asked = select(SqlParam.run_uuid, SqlParam.key, SqlParam.value).where(SqlParam.run_uuid.in_(within))
        if params is not None:
            asked = asked.where(SqlParam.key.in_(params))
        for run, key, value in session.execute(asked) if params != [] else []:
            found[run][1]["params"].append({"key": key, "value": value})
        metrics = select(
            SqlLatestMetric.run_uuid,
            SqlLatestMetric.key,
            SqlLatestMetric.value,
            SqlLatestMetric.timestamp,
            SqlLatestMetric.step,
            SqlLatestMetric.is_nan,
        ).where(SqlLatestMetric.run_uuid.in_(within))
        for run, key, value, timestamp, step, is_nan in session.execute(metrics):
            found[run][1]["metrics"].append(metric_json(key, value, timestamp, step, is_nan))
    return [run_json(*found[i]) for i in ids if i in found]


def metric_json(key: str, value: float, timestamp: int | None, step: int | None, is_nan: bool) -> dict:
    # NaN is stored as is_nan (its value 0); protobuf's JSON writes it "NaN", as MLflow's search does
    written: float | str = value
    if is_nan:
        written = "NaN"
    elif isinstance(value, float) and math.isinf(value):
        written = "Infinity" if value > 0 else "-Infinity"
    return {"key": key, "value": written, "timestamp": timestamp or 0, "step": step or 0}


def run_json(row: Any, data: dict) -> dict:
    """A run as MLflow's runs/search writes it: a field that is null is left out, and a run without a
    name takes its mlflow.runName tag's (as MLflow's SQL store names it)."""
    name = row.name or next((t["value"] for t in data["tags"] if t["key"] == RUN_NAME_TAG), "")
    info = {
        "run_id": row.run_uuid,
        "run_uuid": row.run_uuid,
        "run_name": name,
        "experiment_id": str(row.experiment_id),
        "user_id": row.user_id,
        "status": row.status,
        "start_time": row.start_time,
        "end_time": row.end_time,
        "artifact_uri": row.artifact_uri,
        "lifecycle_stage": row.lifecycle_stage,
    }
    return {"info": {k: v for k, v in info.items() if v not in (None, "")}, "data": data}
