"""A local sweep's recording processes, forked from one process that has imported MLflow.

A single run's harness records through a recording process (mlrb/store/recording_process.py), a
new interpreter that imports MLflow and its SQL store: 2-3 s of Python work. A local sweep
runs many jobs on one machine, and its own process imports MLflow anyway. So the sweep's
process forks a server (`start`) that holds those imports and listens on a Unix socket; the
socket's address reaches every job through ADDRESS_VAR. A job's harness, and the sweep's
process for its own parent run, ask the server for a recording process (`request`, from
`recording_process.forked_or_new`): the server forks one per request, with the requester's
pipes, output and environment, and it runs the same `recording_process.main` as a single run's.
Single runs and local sweep jobs so record in one way, and a job never imports MLflow.

No fork of the server may inherit an open SQLite connection. SQLite keeps its locks' state per
process and per file, shared by every connection to that file in the process; a fork inherits
that state but not the POSIX locks it stands for. Its own connection to the store then uses
locks it does not hold: with its inherited descriptors closed, its reads fail ('locking
protocol'); with them open, the last real holder of the store, believing itself the last,
checkpoints and deletes the WAL under it, and its writes are lost. So `start` closes the
connections MLflow's stores hold in the sweep's process (`close_store_connections`; they
reopen on their next use) before it forks.

Each request gets a process of its own (C) that forks the recording process (G), waits for it
and sends its exit status back, so that the job can wait for G and kill it as it would a child
of its own (`ServedProcess`). The server forks nothing else, holds no thread and no store
connection, and ends, removing its socket, when the sweep's process closes its end of a pipe
(`Server.close`) or dies. A job that cannot reach it starts a new interpreter, as a single run
does.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from mlrb.core import interrupts
from mlrb.core.collector import lasting_imports

log = logging.getLogger(__name__)

ADDRESS_VAR = "MLRB_RECORDING_SERVER"  # the server's socket, in a local sweep's jobs
MAX_MESSAGE = 1 << 20  # a job's request: its environment, as JSON
REAP_EVERY_S = 1.0
REQUEST_WAIT_S = 30.0  # a fork takes milliseconds; past this, the job starts a new interpreter
# At the sweep's end, its jobs' last forks are ending (a job's result is read before its
# process exits): waited for this long, then left to end on their own.
LAST_FORKS_WAIT_S = 2.0


def serving() -> bool:
    """Whether this process is a job of a local sweep whose recording server it can ask."""
    return bool(os.environ.get(ADDRESS_VAR))


class Server:
    """The sweep's side: the server's process, its socket, and the pipe whose end stops it."""

    def __init__(self, pid: int, address: str, alive: int):
        self.pid, self.address, self.alive = pid, address, alive

    def close(self) -> None:
        """Stop the server, which removes its socket (recording processes it started serve their
        jobs to the end)."""
        if self.alive < 0:
            return
        os.close(self.alive)
        self.alive = -1
        os.waitpid(self.pid, 0)


def close_store_connections() -> None:
    """Close the database connections MLflow's SQL stores keep open in this process (their
    engines' pools; each store reconnects on its next use), so that a fork inherits none."""
    for name in ("mlflow.store.tracking.sqlalchemy_store", "mlflow.store.model_registry.sqlalchemy_store"):
        store = getattr(sys.modules.get(name), "SqlAlchemyStore", None)  # not imported: it opened nothing
        for engine in list(getattr(store, "_engine_map", {}).values()):  # one engine per database URI
            engine.dispose()


def import_ahead() -> None:
    """What every recording process (mlrb/store/recording_process.py) imports before its first
    request: in its own interpreter, or once in a sweep's server, whose forks inherit it. Kept out
    of the collector's way, so that its collections leave these objects (and a fork's shared
    pages) alone."""
    with lasting_imports():
        import mlflow  # noqa: F401

        from mlrb.store import (  # noqa: F401
            record,
            tracing,
            tracking,
        )

        tracing.import_exporter()  # a run exports a trace as each of its steps ends


def start(recording_main: Callable[[list[str]], None]) -> Server | None:
    """Fork the server from this process (a sweep's), whose forks run RECORDING_MAIN
    (`recording_process.main`); None where it cannot serve: a thread runs (it could hold a lock
    the fork would copy held), or no socket. The store's connections this process holds are
    closed first: the server and its forks hold none."""
    import_ahead()  # what every recording process imports, once for all its forks
    with lasting_imports():  # and a SQL store's code (0.7 CPU s), which a sweep's jobs mostly open
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401

    if threading.active_count() > 1:
        return None
    close_store_connections()
    folder = Path(tempfile.mkdtemp(prefix="mlrb-rec-"))  # private to this user
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(str(folder / "socket"))  # fails where TMPDIR is longer than a socket's path may be
        listener.listen(64)
    except OSError:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        return None
    alive_r, alive_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(alive_w)
            serve(listener, alive_r, recording_main)
        except BaseException:  # a job that cannot reach it starts a new interpreter
            code = 1
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # here, so that a killed sweep leaves none either
            os._exit(code)
    os.close(alive_r)
    listener.close()
    return Server(pid, str(folder / "socket"), alive_w)


def serve(listener: socket.socket, alive: int, recording_main: Callable[[list[str]], None]) -> None:
    """Fork a recording process for each job that asks, until the sweep's process is gone."""
    interrupts.ignore_job_signals()  # the sweep's Ctrl-C: its jobs still record themselves
    # Not the sweep's output: a reader of it (a pipe, `| tee`) waits for every copy to close.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    while True:
        ready, _, _ = select.select([listener.fileno(), alive], [], [], REAP_EVERY_S)
        reap()
        if alive in ready:
            deadline = time.monotonic() + LAST_FORKS_WAIT_S
            while reap() and time.monotonic() < deadline:
                time.sleep(0.05)
            return
        if listener.fileno() not in ready:
            continue
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 4)
            if len(fds) == 4 and data:
                start_recording(conn, json.loads(data), fds, listener, alive, recording_main)
        except (OSError, ValueError):
            pass  # that job starts a new interpreter
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()


def reap() -> bool:
    """Wait for the forks that have ended (so that their CPU time counts as the sweep's, as a
    child's does); whether any is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def start_recording(
    conn: socket.socket,
    env: dict[str, str],
    fds: list[int],
    listener: socket.socket,
    alive: int,
    recording_main: Callable[[list[str]], None],
) -> None:
    """C: fork G, the job's recording process, tell the job its pid, then its exit status. G
    starts serving only once the job has its pid: a job that gave up waiting (and started a new
    interpreter on the same pipes) gets no second reader of them."""
    if os.fork() != 0:
        return
    try:
        listener.close()
        os.close(alive)
        child_reads, child_writes_to, out, err = fds
        go_r, go_w = os.pipe()
        g = os.fork()
        if g == 0:
            try:
                conn.close()
                os.close(go_w)
                if os.read(go_r, 1) == b"1":
                    become_recording_process(env, child_reads, child_writes_to, out, err, recording_main)
            finally:
                os._exit(1)
        for fd in (*fds, go_r):
            os.close(fd)
        try:
            conn.send(json.dumps(["started", g]).encode())
            os.write(go_w, b"1")
        except OSError:  # the job is gone, or started a new interpreter instead
            os.kill(g, signal.SIGKILL)
        os.close(go_w)
        _, status = os.waitpid(g, 0)
        conn.send(json.dumps(["ended", os.waitstatus_to_exitcode(status)]).encode())
    finally:
        os._exit(0)


def become_recording_process(
    env: dict[str, str],
    child_reads: int,
    child_writes_to: int,
    out: int,
    err: int,
    recording_main: Callable[[list[str]], None],
) -> None:
    """G: as a new interpreter started by the job would be: the job's environment and output,
    no logging set up by the sweep's process, then `recording_process.main`."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.environ.clear()
    os.environ.update(env)
    root = logging.getLogger()
    for handler in list(root.handlers):  # the sweep's console and log file are not this process's
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    recording_main([str(child_reads), str(child_writes_to)])  # ends the process (exit 0)


class ServedProcess:
    """A job's recording process, forked by the server: what RecordingProcess uses of a Popen."""

    def __init__(self, conn: socket.socket, pid: int, stdout: IO[bytes], stderr: IO[bytes]):
        self.conn, self.pid, self.stdout, self.stderr = conn, pid, stdout, stderr
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("recording process", timeout or 0)
            try:
                kind, code = json.loads(self.conn.recv(4096))
            except (OSError, ValueError):
                kind, code = "ended", -1  # the server's fork is gone: the status is lost
            self.returncode = code if kind == "ended" else -1
            self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def request(address: str, child_reads: int, child_writes_to: int) -> ServedProcess:
    """Ask the server at ADDRESS for a recording process on these pipe ends (the job closes its
    copies); raises OSError when it cannot be asked."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address)
        socket.send_fds(conn, [json.dumps(dict(os.environ)).encode()], [child_reads, child_writes_to, out_w, err_w])
        answer = conn.recv(4096) if select.select([conn], [], [], REQUEST_WAIT_S)[0] else b""
        try:
            _, pid = json.loads(answer)
        except (ValueError, TypeError):
            raise OSError(f"the recording server at {address} did not answer") from None
    except BaseException:
        conn.close()
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return ServedProcess(conn, pid, os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0))
