"""Every run of a store's experiments in one search, fast enough for a lab's store of 10,000 runs.

MLflow's client pages through a search one page after another and turns each page's JSON into
protobuf messages before it makes runs of them; for a run with a hundred params that parsing costs
the client as much as the server spends on the page. Against a tracking server this module asks for
the pages itself, a few at a time (the server's workers answer them at once), and makes the runs
straight from the JSON: the same `Run` entities, in the same order, as `client.search_runs` pages
return (less the runs' dataset inputs and model outputs, which nothing here reads). Any other store (SQLite, a database URI) is paged through the client, as before.

A server started with `python -m mlrb.tracking serve` also has mlrb's own run search
(mlrb/store/run_search_route.py): the run ids in one query, then the runs a thousand at a time, with
only the params asked for, read from its database in a few SQL queries. The first search of a server
finds out whether it has those routes (the answer is kept per server); a server without them, or a
search they cannot answer exactly (say, a filter with `>`), goes through MLflow's search as above.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlrb.core.retries import with_retries
from mlrb.store.run_search_route import GET, IDS, MAX_RUN_IDS, VERSION

PAGE = 250  # runs a page: small enough that a busy server answers one well within the client's timeout
AT_ONCE = 4  # pages asked for at once (a server's default workers)
SEARCH = "/api/2.0/mlflow/runs/search"
NO_ROUTE = (404, 405)  # a server without mlrb's run search (a plain MLflow server, or one behind a proxy)
# MLflow's search answers these: mlrb's run search cannot answer this one exactly (501), or the server's
# auth turned the request away (a basic-auth server that denies a route it has no rule for); MLflow's
# search then says whether the caller may read the runs at all.
ASK_MLFLOW = (401, 403, 501)
LIGHT: dict[str, bool] = {}  # server URL -> whether it has mlrb's run search (found by its first search)


def search_all(
    client: Any, experiment_ids: Sequence[str], filter_string: str = "", params: Sequence[str] | None = None
) -> list[Any]:
    """Every active run of these experiments that FILTER_STRING matches, newest first (as MLflow orders
    a search), read page by page. PARAMS, when given, are the params the caller reads: a server with
    mlrb's run search sends only those (any other store sends them all)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    creds = getattr(store, "get_host_creds", None)
    if creds is None or not creds().host.startswith(("http://", "https://")):
        return paged(client, experiment_ids, filter_string)
    host = creds().host
    if LIGHT.get(host, True):
        found = light_search(creds, [str(e) for e in experiment_ids], filter_string, params)
        if found is not None:
            return found
    ask = PageAsker(creds, [str(e) for e in experiment_ids], filter_string)
    runs, token = ask(None)
    size = offset_of(token)
    if size is None:  # a server whose page tokens are not offsets: one page after another
        while token:
            page, token = ask(token)
            runs += page
        return runs
    with ThreadPoolExecutor(AT_ONCE) as pool:
        while token:  # the next AT_ONCE pages at once, from the offset the last token named
            start = offset_of(token) or size
            tokens = [token, *(offset_token(start + k * PAGE) for k in range(1, AT_ONCE))]
            answers = list(pool.map(ask, tokens))
            token = None
            for page, next_token in answers:
                runs += page
                token = next_token
                if not next_token:
                    break
    return runs


class NoLightSearch(Exception):
    """The server cannot answer this search through mlrb's run search."""


def light_search(
    host_creds: Any, experiment_ids: list[str], filter_string: str, params: Sequence[str] | None
) -> list[Any] | None:
    """The runs through mlrb's run search: their ids in one answer, then the runs MAX_RUN_IDS at a
    time, AT_ONCE requests at once; None when the server has no such search or cannot answer this one."""
    host = host_creds().host
    try:
        listed = post(host_creds, IDS, {"experiment_ids": experiment_ids, "filter": filter_string})
    except NoLightSearch as e:
        if e.args[0] in NO_ROUTE:
            LIGHT[host] = False
        return None
    if listed.get("version") != VERSION or not isinstance(listed.get("run_ids"), list):
        LIGHT[host] = False  # another version of the routes: MLflow's search is the one both understand
        return None
    LIGHT[host] = True
    ids = listed["run_ids"]
    body = {"experiment_ids": experiment_ids, "params": None if params is None else list(params)}
    chunks = [ids[i : i + MAX_RUN_IDS] for i in range(0, len(ids), MAX_RUN_IDS)]
    try:
        with ThreadPoolExecutor(AT_ONCE) as pool:
            # each answer made into runs as it comes, while the server still works on the others
            answers = list(pool.map(lambda chunk: runs_in(post(host_creds, GET, {**body, "run_ids": chunk})), chunks))
    except NoLightSearch:
        return None
    return [run for runs in answers for run in runs]


def runs_in(answer: dict) -> list[Any]:
    return [run_of(run) for run in answer.get("runs", [])]


def post(host_creds: Any, endpoint: str, body: dict) -> dict:
    """The server's JSON answer to BODY at ENDPOINT; NoLightSearch(status) when the server has no such
    route or cannot answer it; any other failure as MLflow's client raises it."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    def once() -> Any:
        answer = http_request(host_creds(), endpoint, "POST", json=body)
        if answer.status_code in (*NO_ROUTE, *ASK_MLFLOW):
            raise NoLightSearch(answer.status_code)
        return verify_rest_response(answer, endpoint)

    return json.loads(with_retries(once).content)


def paged(client: Any, experiment_ids: Sequence[str], filter_string: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = with_retries(client.search_runs, list(experiment_ids), filter_string, max_results=PAGE, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def offset_of(token: str | None) -> int | None:
    """The offset a page token of MLflow's own servers names (base64 of {"offset": N}); None for
    another kind of token, or none."""
    if not token:
        return None
    try:
        found = json.loads(base64.b64decode(token, validate=True))
    except ValueError:
        return None
    offset = found.get("offset") if isinstance(found, dict) and len(found) == 1 else None
    return offset if isinstance(offset, int) and offset >= 0 else None


def offset_token(offset: int) -> str:
    return base64.b64encode(json.dumps({"offset": offset}).encode()).decode()


class PageAsker:
    """One page of the search at a page token: (its runs, the next page's token or None)."""

    def __init__(self, host_creds: Any, experiment_ids: list[str], filter_string: str):
        self.host_creds = host_creds
        self.body = {
            "experiment_ids": experiment_ids,
            "filter": filter_string,
            "run_view_type": "ACTIVE_ONLY",
            "max_results": PAGE,
        }

    def __call__(self, token: str | None) -> tuple[list[Any], str | None]:
        from mlflow.utils.rest_utils import http_request, verify_rest_response

        body = {**self.body, **({"page_token": token} if token else {})}

        def once() -> Any:
            answer = http_request(self.host_creds(), SEARCH, "POST", json=body)
            return verify_rest_response(answer, SEARCH)

        found = json.loads(with_retries(once).content)
        return [run_of(run) for run in found.get("runs", [])], found.get("next_page_token") or None


def run_of(found: dict[str, Any]) -> Any:
    """A `Run` from its JSON, as `Run.from_proto` makes it from the parsed message (absent fields are
    the message's defaults: "" and 0; no end time is None)."""
    from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunInputs, RunTag

    info, data = found.get("info", {}), found.get("data", {})
    run_info = RunInfo(
        run_id=info.get("run_id", ""),
        run_name=info.get("run_name", ""),
        experiment_id=info.get("experiment_id", ""),
        user_id=info.get("user_id", ""),
        status=info.get("status", "RUNNING"),
        start_time=int(info.get("start_time", 0)),
        end_time=int(info.get("end_time", 0)) or None,
        lifecycle_stage=info.get("lifecycle_stage", ""),
        artifact_uri=info.get("artifact_uri", ""),
    )
    # positional arguments, quicker than keywords: a lab's store makes hundreds of thousands of these
    metrics = [
        Metric(
            m.get("key", ""),
            float(m.get("value", 0.0)),
            int(m.get("timestamp", 0)),
            int(m.get("step", 0)),
            m.get("model_id") or None,
            m.get("dataset_name") or None,
            m.get("dataset_digest") or None,
            m.get("run_id") or None,
        )
        for m in data.get("metrics", [])
    ]
    params = [Param(p.get("key", ""), p.get("value", "")) for p in data.get("params", [])]
    tags = [RunTag(t.get("key", ""), t.get("value", "")) for t in data.get("tags", [])]
    return Run(run_info, RunData(metrics=metrics, params=params, tags=tags), RunInputs([], []))
