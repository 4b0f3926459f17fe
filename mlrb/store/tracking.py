"""Record a run in MLflow: where the store is, and one small recorder per run.

mlflow is imported lazily (it is slow to import); all calls go through an
explicit MlflowClient and run id, so no global "active run" state is involved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from mlrb.core.config import ConfigError, TrackingConfig
from mlrb.core.messages import SECRET_QUERY, first_line, mask_uri
from mlrb.core.retries import with_retries
from mlrb.core.status import MlflowStatus
from mlrb.core.tags import Tag
from mlrb.store.experiment_view import EXPERIMENT_TAGS

log = logging.getLogger(__name__)

BATCH = 100  # MLflow accepts at most 100 params or tags per log_batch call
SECRET_KEY = re.compile(r"(api_?key|secret|password|passwd|auth_token|access_token|bearer)$", re.IGNORECASE)


def store_location(cfg: TrackingConfig) -> tuple[str, str | None]:
    """(tracking URI, artifact root for new experiments or None for the server's default).
    A new SQLite store is created here, whole (see `create_sqlite_store`)."""
    uri = cfg.named_uri()
    if uri:
        path = sqlite_path(uri)
        if path is not None and not path.exists():
            create_sqlite_store(path, Path("mlruns").resolve().as_uri())
        return uri, None
    root = Path(cfg.dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    artifact_root = (root / "artifacts").as_uri()
    if not (root / "mlflow.db").exists():
        create_sqlite_store(root / "mlflow.db", artifact_root)
    return f"sqlite:///{root / 'mlflow.db'}", artifact_root


def store_named(cfg: TrackingConfig) -> dict[str, str]:
    """Which store CFG names, as a run's record keeps it (mlrb/store/record.py): its URI with any password
    masked, or the absolute folder of its SQLite store."""
    uri = cfg.named_uri()
    return {"uri": mask_uri(uri)} if uri else {"dir": str(Path(cfg.dir).expanduser().resolve())}


def sqlite_path(uri: str) -> Path | None:
    """The database file of an sqlite:/// URI (None for other stores and in-memory ones)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(db: Path) -> Iterator[None]:
    """One process at a time creates or repairs a store (an flock beside it)."""
    import fcntl

    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def create_sqlite_store(db: Path, artifact_root: str) -> None:
    """Create MLflow's tables in a file beside DB, then rename it into place: a store
    is there whole or not at all (an interrupted creation, say a full disk, leaves only
    the temporary file, removed by the next attempt), and of processes starting at once
    one creates it while the others wait for it (two creating the tables at once fail
    with "table already exists")."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with store_lock(db):
        if db.exists():
            return  # another process made it while this one waited
        partial = db.with_name(db.name + ".creating")
        partial.unlink(missing_ok=True)
        make_tables(partial, artifact_root)
        os.replace(partial, db)
        use_wal(db)


def use_wal(db: Path) -> None:
    """Write-ahead logging lets a sweep's jobs read while one writes (the setting is
    stored in the database file, so once is enough). Not for network filesystems:
    on a cluster, point tracking.uri at an MLflow server."""
    import sqlite3

    connection = sqlite3.connect(db, timeout=60)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


# ------------------------------------------------------------- checking the store

CHECK_TIMEOUT_S = 10.0


def secrets_in(cfg: TrackingConfig) -> list[str]:
    """The secrets the store's URI carries (to mask wherever the config is written)."""
    uri = cfg.named_uri()
    if not uri:
        return []
    parts = urlsplit(uri)
    found = []
    if parts.password:
        found.append(parts.password)
    found += [v for k, v in parse_qsl(parts.query) if SECRET_QUERY.search(k) and v]
    return [secret for secret in found if len(secret) >= 3]  # never mask every "a" in a file


def masked(cfg: TrackingConfig) -> dict[str, Any]:
    """The tracking config as it may be recorded (params, config.yaml)."""
    plain = dataclasses.asdict(cfg)
    if plain["uri"]:
        plain["uri"] = mask_uri(plain["uri"])
    return plain


def check_store(cfg: TrackingConfig, wait_for_server: bool = False) -> None:
    """Before a run starts: the store answers, can be written, and has a schema this
    MLflow can use; else one ConfigError naming the store (password masked) and what
    to do. Takes seconds at most (MLflow's own retries would take minutes), unless
    `wait_for_server`: a sweep's job (its launcher checked the store already) waits for
    a tracking server that is away, as long as its writes would (tracking.retry_for_s)."""
    uri = cfg.named_uri()
    shown = mask_uri(uri) if uri else f"sqlite:///{Path(cfg.dir).expanduser().resolve() / 'mlflow.db'}"
    where = "tracking.uri" if cfg.uri else ("$MLFLOW_TRACKING_URI" if uri else "tracking.dir")
    if uri and uri.startswith(("http://", "https://")):
        if not wait_for_server:
            return check_http_store(uri, shown, where)
        # A server that goes away between the wait and the check (a restart) is waited for again.
        deadline = time.monotonic() + cfg.retry_for_s
        while True:
            wait_for_http_server(uri, max(1.0, deadline - time.monotonic()))
            try:
                return check_http_store(uri, shown, where)
            except ConfigError as e:
                if "cannot reach it" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(1.0)
    scheme = urlsplit(uri).scheme if uri else "sqlite"
    if scheme in ("", "file") and uri:
        return check_folder_store(Path(urlsplit(uri).path if scheme else uri), shown, where)
    if sqlite_path(uri or "") is None and scheme != "sqlite" and scheme not in SQL_SCHEMES:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): not a tracking URI mlrb can use; give sqlite:///PATH, "
            "http(s)://HOST:PORT of an MLflow server, or a database URI (postgresql://, mysql://, mssql://)"
        )
    if uri is None or scheme == "sqlite":
        return check_sqlite_store(cfg, shown, where)
    return check_sql_store(uri, shown, where)


def check_folder_store(folder: Path, shown: str, where: str) -> None:
    """MLflow's file store (a folder of runs): it can be created and written."""
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mlrb-check-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): cannot write to {folder} ({e.strerror or e}); choose a writable place"
        ) from None


SQL_SCHEMES = ("postgresql", "mysql", "mssql", "postgresql+psycopg2", "mysql+pymysql")


def check_sqlite_store(cfg: TrackingConfig, shown: str, where: str) -> None:
    import sqlite3

    try:
        uri, artifact_root = store_location(cfg)
    except Exception as e:  # a folder that cannot be made, a full disk (SQLite's "disk I/O error")...
        reason = f"{e.strerror} ({e.filename})" if isinstance(e, OSError) and e.strerror else first_line(e)
        raise ConfigError(
            f"tracking store '{shown}' ({where}): cannot create it: {reason}; check the disk's free space, "
            "or choose a writable folder with tracking.dir=... or tracking.uri=sqlite:///PATH"
        ) from None
    db = sqlite_path(uri)
    if db is None:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): an in-memory store forgets every run; give a file, sqlite:///PATH"
        )
    try:
        connection = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=CHECK_TIMEOUT_S)
        try:
            # A real write, undone: fails on a read-only file, or a folder where the journal cannot be made.
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("CREATE TABLE mlrb_write_check (x INTEGER)")
            connection.rollback()
        finally:
            connection.close()
    except sqlite3.Error as e:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): cannot write to it ({e}); make {db} and its folder writable "
            "or choose another store with tracking.dir=... or tracking.uri=..."
        ) from None
    try:
        open_sql_store(uri)
    except Exception as e:  # MLflow's and SQLAlchemy's errors alike
        repair_sqlite_store(db, artifact_root or Path("mlruns").resolve().as_uri(), shown, where, e)


def open_sql_store(uri: str) -> None:
    """Open the store as the run's client will (MLflow checks its schema on opening) and
    read from it. MLflow keeps the store it opened for this URI, so the run's client uses
    it as it is, without a second schema check (about 0.2 s)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def repair_sqlite_store(db: Path, artifact_root: str, shown: str, where: str, error: Exception) -> None:
    """A store MLflow cannot open: made afresh when it holds no runs (its creation was
    cut short), the broken file kept beside it; else reported."""
    import shutil
    import sqlite3

    from mlrb.store import empty_tables

    reason = first_line(error)
    with store_lock(db):
        runs = empty_tables.rows(db, "runs") or 0  # None: no runs table, the store was never completed
        if runs:
            hint = "run `mlflow db upgrade URI`" if "out-of-date" in reason else "move it away to start a new one"
            raise ConfigError(
                f"tracking store '{shown}' ({where}) holds {runs} runs but MLflow cannot use it ({reason}); {hint}"
            ) from None
        aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copyfile(db, aside)
        fresh = db.with_name(db.name + ".creating")
        fresh.unlink(missing_ok=True)
        make_tables(fresh, artifact_root)
        # Copied into the same file through SQLite (not renamed over it): connections MLflow
        # already holds to it (it keeps one engine per URI) then see the new store.
        source, target = sqlite3.connect(fresh), sqlite3.connect(db)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        fresh.unlink()
    log.warning(
        "tracking store %s was damaged and held no runs (%s); kept as %s and made afresh", shown, reason, aside.name
    )
    open_sql_store(f"sqlite:///{db}")


def make_tables(db: Path, artifact_root: str) -> None:
    """MLflow's tables in a new database file (its engine let go of afterwards): a copy of the
    empty store this MLflow made once (mlrb/store/empty_tables.py), else made by its migrations."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from mlrb.store import empty_tables

    uri = f"sqlite:///{db}"
    copied = empty_tables.copy_to(db)
    try:
        store = SqlAlchemyStore(uri, artifact_root)
    except Exception:
        if not copied:
            raise
        empty_tables.forget()
        SqlAlchemyStore._get_or_create_engine(uri).dispose()  # MLflow keeps it: its connections are to the copy
        db.unlink(missing_ok=True)
        store, copied = SqlAlchemyStore(uri, artifact_root), False
    store.engine.dispose()
    if not copied:
        empty_tables.keep(db)


def check_sql_store(uri: str, shown: str, where: str) -> None:
    """A database server: connect within the time limit."""
    import threading

    outcome: list[Any] = []

    def attempt() -> None:
        try:
            open_sql_store(uri)
            outcome.append(None)
        except Exception as e:  # a driver's or MLflow's error
            outcome.append(e)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(CHECK_TIMEOUT_S)
    if not outcome:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): no answer within {CHECK_TIMEOUT_S:g} s; "
            "check that the database server is up and reachable"
        )
    if outcome[0] is not None:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): cannot use it ({first_line(outcome[0])}); "
            "check the URI, the server and the credentials"
        )


def check_http_store(uri: str, shown: str, where: str) -> None:
    """An MLflow server: it answers an experiment search, with the credentials MLflow
    would send ($MLFLOW_TRACKING_TOKEN, or a user and password)."""
    import urllib.error

    try:
        ask_http_store(uri, CHECK_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        what = "the credentials were refused" if e.code in (401, 403) else "it is not an MLflow tracking server"
        raise ConfigError(
            f"tracking store '{shown}' ({where}): HTTP {e.code} ({what}); "
            "check the URI and MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN"
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"tracking store '{shown}' ({where}): cannot reach it ({reason}); start the server "
            "(`mlflow server`) or fix the URI"
        ) from None
    except ValueError:
        raise ConfigError(
            f"tracking store '{shown}' ({where}): the answer is not MLflow's (not JSON); "
            "check the URI's host, port and path"
        ) from None


def ask_http_store(uri: str, timeout_s: float) -> None:
    """Search the server's experiments once (no retries), as MLflow's client would ask."""
    import base64
    import json
    import urllib.request

    parts = urlsplit(uri)
    host = parts.hostname or ""
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    request = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search?max_results=1")
    user = parts.username or os.environ.get("MLFLOW_TRACKING_USERNAME")
    password = parts.password or os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    elif user and password:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        json.loads(response.read() or b"{}")


AWAY_CHECK_TIMEOUT_S = 5.0


class StoreAway(RuntimeError):
    """The store stopped answering while a run's record was being exported to it."""


def store_away(cfg: TrackingConfig) -> str | None:
    """Why the run's store does not answer now (None: it does, or cannot be asked without
    MLflow). Asked at a run's end while an export waits, so that the run need not sit through
    the store's retries: only a tracking server can be asked; its database counts with it."""
    import urllib.error

    uri = cfg.named_uri() or ""
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        ask_http_store(uri, AWAY_CHECK_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        return f"the tracking server at {mask_uri(uri)} answers HTTP {e.code}" if e.code >= 500 else None
    except (urllib.error.URLError, OSError) as e:
        return f"the tracking server at {mask_uri(uri)} cannot be reached ({getattr(e, 'reason', e)})"
    except ValueError:
        return None  # it answers; what it said is for the export to judge
    return None


def wait_for_http_server(uri: str, retry_for_s: float) -> None:
    """Until the server accepts a connection, retried on MLflow's schedule for its writes
    (urllib3's Retry, as MLflow's client uses); the check that follows says what is wrong."""
    import urllib3

    settings = http_retry_settings(retry_for_s)
    retry = urllib3.util.Retry(
        total=None,
        connect=int(settings["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]),
        read=0,
        redirect=0,
        status=0,
        other=0,
        backoff_factor=int(settings["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"]),
    )
    parts = urlsplit(uri)
    netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"  # no credentials
    try:
        urllib3.PoolManager().request(
            "GET", f"{parts.scheme}://{netloc}/health", retries=retry, timeout=CHECK_TIMEOUT_S
        )
    except urllib3.exceptions.HTTPError:
        pass


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)) and any(isinstance(v, (Mapping, list, tuple)) for v in tree):
        for i, value in enumerate(tree):
            flat.update(flatten(value, f"{prefix}{i}."))
    else:
        flat[prefix[:-1]] = redact(prefix[:-1], tree)
    return flat


def redact(key: str, value: Any) -> str:
    if value is not None and SECRET_KEY.search(key.rsplit(".", 1)[-1]):
        return "***"
    return str(value)


def harness_commit() -> dict[str, str]:
    """The git commit of the harness's own code, when it runs from a checkout."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {Tag.GIT_COMMIT: commit.stdout.strip(), Tag.GIT_DIRTY: str(bool(dirty.stdout.strip()))}
    except (OSError, subprocess.SubprocessError):
        return {}


def chunks(items: list, size: int = BATCH) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


PARAM_CHARS = 6000  # MLflow keeps a param's value up to this length


class MlflowRunWriter:
    """One MLflow run. Create with `open_run`; always end with `finish`."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, attempt: int = 1):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.attempt = attempt

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:PARAM_CHARS]) for k, v in sorted(params.items())]
        for batch in chunks(items):
            with_retries(self.client.log_batch, self.run_id, params=batch)

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for batch in chunks(items):
            with_retries(self.client.log_batch, self.run_id, tags=batch)

    def log_metrics(self, metrics: dict[str, float], step: int = 0, timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric

        now = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None]
        for batch in chunks(items, 1000):
            with_retries(self.client.log_batch, self.run_id, metrics=batch)

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def log_file(self, path: Path, folder: str | None = None) -> None:
        if Path(path).exists():
            with_retries(self.client.log_artifact, self.run_id, str(path), folder)

    def log_folder(self, path: Path, folder: str) -> None:
        """Every file under `path`, as artifacts under `folder`."""
        with_retries(self.client.log_artifacts, self.run_id, str(path), folder)

    def logged_params(self) -> dict[str, str]:
        return with_retries(lambda: self.client.get_run(self.run_id)).data.params

    def log_trace(self, trace: dict[str, Any]) -> None:
        """One step's trace (mlrb/store/tracing.py), linked to the run."""
        from mlrb.store.tracing import export_trace

        export_trace(self.client.tracking_uri, self.experiment_id, self.run_id, trace)

    def finish(self, status: str) -> None:
        """status: FINISHED, FAILED or KILLED."""
        with_retries(lambda: self.client.set_terminated(self.run_id, status))


def experiment_id(client: Any, name: str, artifact_root: str | None) -> str:
    found = with_retries(lambda: client.get_experiment_by_name(name))
    if found is not None:
        return found.experiment_id
    location = f"{artifact_root}/{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}" if artifact_root else None
    try:
        return with_retries(lambda: client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS))
    except Exception:
        # Another job of the same sweep created it first.
        found = with_retries(lambda: client.get_experiment_by_name(name))
        if found is None:
            raise
        return found.experiment_id


def find_runs(client: Any, experiment: str, tags: dict[str, str], statuses: list[str] | None = None) -> list[Any]:
    """Runs of the experiment carrying all these tags (and one of these statuses)."""
    query = " AND ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = with_retries(lambda: client.search_runs([experiment], query, max_results=1000))
    return [r for r in runs if not statuses or r.info.status in statuses]


def reading_client(uri: str) -> Any:
    """A client that reads the store at URI (the report, rescoring): a server that does not answer
    fails it in seconds, not after minutes of retries."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    return MlflowClient(tracking_uri=uri)


def find_run(client: Any, run_id: str) -> Any:
    """The store's run of the record's run RUN_ID: the one tagged with it; for a record made before
    the harness made its own ids, the store's run of that id or the one synced from it; None when
    there is none."""
    from mlflow.exceptions import MlflowException

    experiments = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(experiments, f"tags.`{Tag.RUN_ID}` = '{run_id}'", max_results=2)
    if found:
        return found[0]
    try:
        return client.get_run(run_id)
    except MlflowException:
        pass
    found = client.search_runs(experiments, f"tags.`{Tag.SYNCED_FROM}` = '{run_id}'", max_results=2)
    return found[0] if found else None


class StoreRuns:
    """Every active run of the store, found by the ids a record names its run by (as `find_run`
    finds one): read in one paged search, so that syncing many run folders asks the store a few
    times in all rather than a few times per run."""

    def __init__(self, client: Any):
        experiments = [e.experiment_id for e in with_retries(lambda: client.search_experiments(max_results=50000))]
        self.by_own_id: dict[str, Any] = {}
        self.by_store_id: dict[str, Any] = {}
        self.by_synced_from: dict[str, Any] = {}
        from mlrb.store.run_search import search_all

        for run in search_all(client, experiments) if experiments else []:
            tags = run.data.tags
            self.by_store_id[run.info.run_id] = run
            if tags.get(Tag.RUN_ID):
                self.by_own_id.setdefault(tags[Tag.RUN_ID], run)
            if tags.get(Tag.SYNCED_FROM):
                self.by_synced_from.setdefault(tags[Tag.SYNCED_FROM], run)

    def find(self, run_id: str) -> Any:
        """As `find_run`: the run tagged with RUN_ID, else the store's run of that id, else the one synced from it."""
        return self.by_own_id.get(run_id) or self.by_store_id.get(run_id) or self.by_synced_from.get(run_id)


def client_for(cfg: TrackingConfig) -> tuple[Any, str | None]:
    from mlflow.tracking import MlflowClient

    uri, artifact_root = store_location(cfg)
    if secrets_in(cfg):  # MLflow prints each run's link, built from the URI, password and all
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    if uri.startswith(("http://", "https://")):
        os.environ.update(http_retry_settings(cfg.retry_for_s))
    return MlflowClient(tracking_uri=uri), artifact_root


# ------------------------------------------------------------- a server that goes away

# MLflow's HTTP client retries through urllib3: pauses of 0, 2f, 4f, 8f... seconds (f the
# backoff factor, each pause at most 120 s), at most 10 retries (MLflow's own limit).
MAX_RETRIES, MAX_PAUSE_S, MAX_FACTOR = 10, 120.0, 120


def retry_schedule(retries: int, factor: int) -> list[float]:
    """The pauses MLflow's client makes between attempts of one request."""
    return [0.0] + [min(MAX_PAUSE_S, factor * 2.0**k) for k in range(1, retries)]


def http_retry_settings(retry_for_s: float) -> dict[str, str]:
    """MLflow's retry settings (MLFLOW_HTTP_REQUEST_*) under which each request to a
    tracking server that does not answer is retried, with doubling pauses, for at least
    `retry_for_s` seconds in all (as near it as those settings allow), then fails."""
    for factor in range(1, MAX_FACTOR + 1):
        for retries in range(1, MAX_RETRIES + 1):
            if sum(retry_schedule(retries, factor)) >= retry_for_s:
                return {
                    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
                    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(factor),
                }
    return {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(MAX_RETRIES), "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": str(MAX_FACTOR)}


# ------------------------------------------------------------- a store for a cluster

SQLITE_ON_SLURM = (
    "SQLite on a shared filesystem loses writes under concurrent jobs from many nodes; "
    "use tracking=server tracking.uri=http://HOST:PORT (`python -m mlrb.tracking serve` starts one)"
)


def is_sqlite(cfg: TrackingConfig) -> bool:
    """Whether runs would go to an SQLite file (the default store, or a sqlite:/// URI)."""
    uri = cfg.named_uri()
    return uri is None or uri.startswith("sqlite:")


def check_cluster_store(cfg: TrackingConfig) -> str | None:
    """For a SLURM sweep: an SQLite store is refused (ConfigError) unless the user insists
    (tracking.allow_sqlite_on_slurm=true); then the warning to show, one line."""
    if not is_sqlite(cfg):
        return None
    if not cfg.allow_sqlite_on_slurm:
        raise ConfigError(
            f"launcher=slurm with an SQLite tracking store: {SQLITE_ON_SLURM}; "
            "or tracking.allow_sqlite_on_slurm=true to run anyway"
        )
    return f"launcher=slurm with an SQLite tracking store (tracking.allow_sqlite_on_slurm=true): {SQLITE_ON_SLURM}"


def open_run(
    cfg: TrackingConfig, experiment: str, run_name: str, tags: dict[str, Any], run_id: str, attempt: int
) -> MlflowRunWriter:
    """The store's run of the harness's run RUN_ID (its record's id), for ATTEMPT: the run tagged
    with that id when the store has it (a resumed run, a sweep's job run again, a record synced
    before), else a new one. A run recorded before the harness made its own ids has the store's
    id as its record's: a later attempt of it finds that run by it."""
    client, artifact_root = client_for(cfg)
    exp_id = experiment_id(client, experiment, artifact_root)
    opening = opening_tags({**tags, Tag.RUN_ID: run_id}, attempt)
    found = find_runs(client, exp_id, {Tag.RUN_ID: run_id}) or (older_run(client, run_id) if attempt > 1 else [])
    if found:
        store_id = found[0].info.run_id
        with_retries(lambda: client.update_run(store_id, status=MlflowStatus.RUNNING))
        recorder = MlflowRunWriter(client, store_id, found[0].info.experiment_id, attempt)
        recorder.set_tags(opening)
        return recorder
    run = with_retries(lambda: client.create_run(exp_id, run_name=run_name, tags=opening))
    return MlflowRunWriter(client, run.info.run_id, exp_id, attempt)


def older_run(client: Any, run_id: str) -> list[Any]:
    """The store's run whose id is RUN_ID, as a run recorded before the harness made its own ids."""
    from mlflow.exceptions import MlflowException

    try:
        return [with_retries(lambda: client.get_run(run_id))]
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return []


# What a store call's error says when the store could not be reached at all (an MLflow server
# or a database away past tracking.retry_for_s), as against a call the store refused. The
# network's own words first: `unreachable_sign` names the first found.
# A store whose disk is full cannot take the run now: as if away, and given the record at the run's end
# once the harness has made room (mlrb/run.py's `catch_up_store`), else synced later.
DISK_FULL_SIGNS = ("No space left on device", "Disk quota exceeded", "database or disk is full")
UNREACHABLE_SIGNS = (
    "Connection refused",
    "timed out",
    "Name or service not known",
    "No route to host",
    "Failed to establish a new connection",
    "could not connect to server",
    "Max retries exceeded",
    "failed with exception",
    "failed with error code 50",
    "OperationalError",
    *DISK_FULL_SIGNS,
)


def unreachable_sign(error: BaseException) -> str | None:
    """The words of a store call's error that say the store was away, not that it refused what
    was sent (the recording process hands errors over as RecordingError with the original's text)."""
    text = f"{type(error).__name__}: {error}"
    return next((sign for sign in UNREACHABLE_SIGNS if sign in text), None)


def store_unreachable(error: BaseException) -> bool:
    return unreachable_sign(error) is not None


def store_disk_was_full(store_error: str) -> bool:
    """Whether a store found away (RecordedRun.store_error) was away only because its disk was full."""
    return any(sign in store_error for sign in DISK_FULL_SIGNS)


def opening_tags(tags: dict[str, Any], attempt: int) -> dict[str, str]:
    """The tags a run is opened (or, for a retried sweep job, reopened) with: the caller's, its
    attempt, and no error left from the attempt before."""
    opened = {**{k: str(v) for k, v in tags.items()}, Tag.ATTEMPT: str(attempt)}
    if attempt > 1:
        opened[Tag.ERROR] = ""
    return opened
