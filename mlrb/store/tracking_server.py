"""`python -m mlrb.tracking serve`: a lab's MLflow tracking server, on PostgreSQL.

Checks that PostgreSQL answers (one line and exit status 2 if not), creates the
database when it is not there yet, then runs `mlflow server` with that database as
the backend store and a shared folder (or an S3-compatible bucket) as the artifact
store, and prints the tracking URI that sweeps use (tracking=server tracking.uri=...)
once the server answers. Beside MLflow's routes it serves mlrb's run search (run_search_route.py:
the report and compare read a lab's thousands of runs from it in seconds), through MLflow's app
plugin entry point `mlrb`; `--plain` serves MLflow's routes alone. It runs until stopped (Ctrl-C or SIGTERM stop the server too).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NoReturn
from urllib.parse import unquote, urlsplit

from mlrb.core.messages import first_line, mask_uri

DEFAULT_DB_URI = "postgresql://mlrb@127.0.0.1:5432/mlrb"
CONNECT_TIMEOUT_S = 5
START_TIMEOUT_S = 120
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Host headers the server accepts besides its own names: MLflow's defaults (loopback and
# private addresses), which an explicit --allowed-hosts would otherwise replace.
PRIVATE_HOSTS = ["10.*", "172.16.*", "172.17.*", "172.18.*", "172.19.*", "172.2*", "172.30.*", "172.31.*", "192.168.*"]


class ServeError(Exception):
    """A user-facing problem, reported as one line."""


class Stopped(Exception):
    """A signal asked the server to stop."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlrb.tracking serve",
        description="Start an MLflow tracking server for sweeps on many machines: PostgreSQL as the backend store "
        "(the database is created if missing), a shared folder or bucket as the artifact store.",
    )
    p.add_argument(
        "--backend-store-uri",
        default=os.environ.get("MLRB_TRACKING_DB", DEFAULT_DB_URI),
        help="PostgreSQL database: postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (a password is better "
        f"given as $PGPASSWORD or in ~/.pgpass); default: $MLRB_TRACKING_DB, else {DEFAULT_DB_URI}",
    )
    p.add_argument(
        "--artifacts-destination",
        default="mlflow-artifacts",
        help="where artifacts are kept: a folder every node can reach through the server (e.g. on the "
        "shared filesystem) or s3://BUCKET/PATH (MLFLOW_S3_ENDPOINT_URL for S3-compatible stores); "
        "default: ./mlflow-artifacts",
    )
    p.add_argument("--host", default="0.0.0.0", help="address to listen on; default 0.0.0.0 (every interface)")
    p.add_argument("--port", type=int, default=5000, help="port; default 5000")
    p.add_argument("--workers", type=int, default=None, help="server worker processes (MLflow's default if unset)")
    p.add_argument(
        "--plain",
        action="store_true",
        help="serve MLflow's routes alone, without mlrb's run search (the report and compare then read "
        "runs through MLflow's search, which sends every param of every run)",
    )
    return p


APP_NAME = "mlrb"  # the `mlflow.app` entry point (pyproject.toml): MLflow's app with mlrb's run search


def app_installed() -> bool:
    """Whether mlrb's app is installed where `mlflow server --app-name` looks (an install of mlrb from
    before it had one has not)."""
    from importlib.metadata import entry_points

    return any(e.name == APP_NAME for e in entry_points(group="mlflow.app"))


def postgres_parts(uri: str) -> dict:
    """psycopg's connection arguments from a postgresql:// URI (the database name apart)."""
    parts = urlsplit(uri)
    if parts.scheme.split("+")[0] != "postgresql":
        raise ServeError(
            f"--backend-store-uri '{mask_uri(uri)}' is not a PostgreSQL URI; give "
            "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        )
    database = parts.path.lstrip("/")
    if not database:
        raise ServeError(f"--backend-store-uri '{mask_uri(uri)}' names no database; add /DATABASE (e.g. /mlflow)")
    args = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 5432,
        "dbname": unquote(database),
        "connect_timeout": CONNECT_TIMEOUT_S,
    }
    if parts.username:
        args["user"] = unquote(parts.username)
    if parts.password:
        args["password"] = unquote(parts.password)
    return args


def ensure_database(uri: str) -> bool:
    """Connect to the database, creating it when PostgreSQL says it does not exist.
    True when it was created. ServeError when PostgreSQL cannot be reached or refuses."""
    import psycopg
    from psycopg import sql

    args = postgres_parts(uri)
    where = f"PostgreSQL at {args['host']}:{args['port']}"
    try:
        psycopg.connect(**args).close()
        return False
    except psycopg.OperationalError as e:
        reason = first_line(e).split(": ", 1)[-1]
        if f'database "{args["dbname"]}" does not exist' not in reason:
            hint = (
                "check the user and password"
                if "authentication" in reason or "password" in reason
                else "start it (Debian: pg_ctlcluster 15 main start) or fix --backend-store-uri"
            )
            what = "refused the connection" if "authentication" in reason else "is not reachable"
            raise ServeError(f"{where} {what}: {reason}; {hint}") from None
    try:  # the server's own maintenance database, to create ours from
        with psycopg.connect(**{**args, "dbname": "postgres"}, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(args["dbname"])))
    except psycopg.Error as e:
        raise ServeError(
            f"cannot create database '{args['dbname']}' on {where} ({first_line(e).split(': ', 1)[-1]}); "
            f"ask its admin for it: createdb -O {args.get('user', 'USER')} {args['dbname']}"
        ) from None
    return True


def public_host(host: str) -> str:
    """The name other machines reach this one by (the listening address when it is a specific one)."""
    if host in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return host


def allowed_hosts(host: str) -> str | None:
    """Host headers to accept: MLflow's defaults serve a loopback server; one that listens
    on the network must also accept the names other nodes use for it."""
    if host in LOOPBACK:
        return None
    names = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn(), public_host(host)}
    return ",".join(sorted(names) + [f"{n}:*" for n in sorted(names)] + PRIVATE_HOSTS)


def server_command(args: argparse.Namespace) -> list[str]:
    destination = args.artifacts_destination
    if "://" not in destination:  # a folder: absolute, so the server finds it whatever its working folder
        Path(destination).expanduser().mkdir(parents=True, exist_ok=True)
        destination = str(Path(destination).expanduser().resolve())
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        args.backend_store_uri,
        "--artifacts-destination",
        destination,
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    if args.workers:
        command += ["--workers", str(args.workers)]
    if not args.plain and app_installed():
        command += ["--app-name", APP_NAME]
    hosts = allowed_hosts(args.host)
    if hosts:
        command += ["--allowed-hosts", hosts]
    return command


def wait_until_healthy(url: str, server: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the server at URL answers its health check; ServeError if SERVER exits or TIMEOUT_S passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None:
            raise ServeError(f"mlflow server exited with status {server.returncode} before answering (see above)")
        if time.monotonic() > deadline:
            raise ServeError(f"mlflow server did not answer at {url}/health within {timeout_s:g} s")
        time.sleep(0.5)


def serve(args: argparse.Namespace) -> int:
    created = ensure_database(args.backend_store_uri)
    shown_db = mask_uri(args.backend_store_uri)
    print(
        f"mlrb.tracking: backend store {shown_db}{' (database created)' if created else ''}; "
        f"artifacts in {args.artifacts_destination}",
        flush=True,
    )
    if not args.plain and not app_installed():
        print(
            "mlrb.tracking: warning: mlrb's run search is not installed (reinstall mlrb: pip install -e .); "
            "serving MLflow's routes alone, which the report reads more slowly",
            flush=True,
        )
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": os.environ.get("MLFLOW_DISABLE_TELEMETRY", "true"),
        # MLflow's server-side job runner (GenAI scoring and trace archival: 7 processes) serves
        # nothing mlrb records; off unless asked for
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"),
    }
    # Its own process group: stopping this command stops the server and its workers with it.
    server = subprocess.Popen(server_command(args), env=env, start_new_session=True)

    def stop(signum: int, _frame: object) -> NoReturn:
        raise Stopped(signum)  # the server is stopped below, once out of wait() (it holds a lock)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    try:
        local = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        wait_until_healthy(f"http://{local}:{args.port}", server)
        uri = f"http://{public_host(args.host)}:{args.port}"
        print(
            f"mlrb.tracking: serving at {uri}; run sweeps with: python -m mlrb -m tracking=server "
            f"tracking.uri={uri} ...",
            flush=True,
        )
        print(f"MLFLOW_TRACKING_URI={uri}", flush=True)
        return server.wait()
    except Stopped as e:
        return 128 + e.signum
    finally:
        stop_server(server)


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "serve":
        print(
            f"usage: python -m mlrb.tracking serve [--help] [options]; got {' '.join(argv) or 'no command'}",
            file=sys.stderr,
        )
        sys.exit(2)
    args = parser().parse_args(argv[1:])
    try:
        sys.exit(serve(args))
    except ServeError as e:
        print(f"mlrb.tracking: error: {e}", file=sys.stderr)
        sys.exit(2)
