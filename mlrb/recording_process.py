"""MLflow in a process of its own, beside a single run's harness process.

Importing MLflow and its SQL store takes a single run 2-3 s of Python work, more than
anything else the harness does for a short run. Started as soon as `python -m mlrb` has
read its command line, this process does that work on another core while the harness
composes its config, loads the task and imports the agent's SDK. Then it checks the store,
opens the run and writes the run's record to it (mlrb/record.py): the harness appends each
line to `record.jsonl` and tells the process where the line lies; the process reads it from
the file and writes it with `record.export_lines`, as a sweep's job does in its own process.
The harness process never imports MLflow.

The process takes three calls: `check_store`, `open_run` and `export`. The harness waits for
each answer, so a line is in the store when its call returns, as it would be in one process.
One thread of the harness does the sending and receiving, so that a signal (which Python
delivers to the main thread) never cuts a message in half; the main thread only waits.

The process ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C or a closed terminal reaches the
whole process group): the harness, which handles them, still records the run as killed
through it. It ends when the harness closes its end of the pipe, at the run's end or when
the harness dies.

A local sweep's jobs record the same way, through a process forked by their sweep's recording
server (mlrb/recording_server.py). A SLURM sweep's jobs and `mlrb.cli.main()` called from
Python record in their own process (`record.LOCAL`): their processes may live on after one
run, or import MLflow anyway.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mlrb.config import ConfigError, TrackingConfig

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 10.0  # the process ends as soon as it reads the end of its pipe
# Exceptions whose class the harness may rebuild from a pickle without importing MLflow or SQLAlchemy.
PICKLED_EXCEPTIONS = ("builtins", "mlrb.")


class RecordingError(RuntimeError):
    """The recording process failed a call (its error, with the original type's name), or
    ended while the harness still needed it."""


class Pending:
    """The answer to one call, once the recording process gives it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None
        self.logged: list[dict[str, Any]] = []

    def resolve(self, ok: bool, value: Any, logged: list[dict[str, Any]] | None = None) -> None:
        self.ok, self.value, self.logged = ok, value, logged or []
        self.done.set()

    def result(self) -> Any:
        """The call's value (or its error, raised), once what it logged is in the harness's log."""
        self.done.wait()
        for fields in self.logged:
            logging.getLogger(fields["name"]).handle(logging.makeLogRecord(fields))
        if not self.ok:
            raise self.value
        return self.value


def echo(source: int, target: int) -> None:
    """Copy what the recording process writes to SOURCE onto the harness's file descriptor
    TARGET, until the process ends."""
    while chunk := os.read(source, 65536):
        try:
            while chunk:
                chunk = chunk[os.write(target, chunk) :]
        except OSError:  # the harness's own output is gone (a closed pipe): drop it, keep reading
            pass


def new_interpreter(child_reads: int, child_writes_to: int) -> subprocess.Popen:
    """The recording process: a new interpreter running `main`, with its ends of the two pipes
    and its output on pipes of its own."""
    return subprocess.Popen(
        [sys.executable, "-m", "mlrb.recording_process", str(child_reads), str(child_writes_to)],
        pass_fds=(child_reads, child_writes_to), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


# How the process is started: the tests start it from a warm process instead (tests/warm_start.py).
spawn: Callable[[int, int], Any] = new_interpreter


class RecordingProcess:
    """The harness's side: calls go to the process in order, one at a time."""

    def __init__(self, start_process: Callable[[int, int], Any] | None = None) -> None:
        """START_PROCESS(child_reads, child_writes_to) starts the process (`spawn` unless given):
        a Popen, or what RecordingProcess uses of one (its stdout, stderr, wait and kill)."""
        to_child, child_reads = os.pipe()[::-1]
        child_writes_to, from_child = os.pipe()[::-1]
        self.process = (start_process or spawn)(child_reads, child_writes_to)
        os.close(child_reads)
        os.close(child_writes_to)
        # What MLflow and Python print there (its INFO lines, warnings) goes where the harness's
        # own output goes at that moment: during a run, its standard error is the run's log
        # file (mlrb/console.py), as it was when MLflow ran in the harness's process.
        assert self.process.stdout is not None and self.process.stderr is not None
        self.echoes = [
            threading.Thread(target=echo, args=(stream.fileno(), fd), name=f"recording-echo-{fd}", daemon=True)
            for stream, fd in ((self.process.stdout, 1), (self.process.stderr, 2))
        ]
        for thread in self.echoes:
            thread.start()
        self.sending = Connection(to_child, readable=False)
        self.receiving = Connection(from_child, writable=False)
        self.calls: queue.SimpleQueue[tuple[tuple, Pending] | None] = queue.SimpleQueue()
        self.ended: str | None = None  # why the process can take no more calls
        self.used = False  # a call was sent: the process may have written to the store
        self.io = threading.Thread(target=self.exchange, name="recording-io", daemon=True)
        self.io.start()

    def exchange(self) -> None:
        """The I/O thread: send each call, wait for its answer, hand it over."""
        while (item := self.calls.get()) is not None:
            call, pending = item
            if self.ended is None:
                try:
                    self.sending.send(call)  # pickled whole before anything is written
                    pending.resolve(*self.receiving.recv())  # read whole before it is unpickled
                    continue
                except (EOFError, OSError):
                    code = self.process.wait()
                    self.ended = f"the recording process (MLflow) ended unexpectedly, exit code {code}"
                except Exception as e:  # a call or an answer pickle cannot carry: this call fails, not the next
                    pending.resolve(False, RecordingError(f"{call[0]}: {type(e).__name__}: {e}"))
                    continue
            pending.resolve(False, RecordingError(self.ended))
        self.sending.close()

    def submit(self, operation: str, *args: Any) -> Pending:
        """Send a call now; its answer comes later (Pending.result)."""
        pending = Pending()
        self.used = True
        self.calls.put(((operation, os.getcwd(), args), pending))
        return pending

    def call(self, operation: str, *args: Any) -> Any:
        return self.submit(operation, *args).result()

    def close(self) -> None:
        """Let the process end once every call sent so far is answered, and wait for it. One
        that was never called (the command stopped before its run: a config refused, --help)
        is ended at once: it has written nothing, and it would hold the harness's standard
        output and error open (a pipe's reader waits for them) until its imports are done."""
        if not self.used:
            self.process.kill()
        self.calls.put(None)
        self.io.join(CLOSE_WAIT_S)
        try:
            self.process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for thread in self.echoes:
            thread.join(CLOSE_WAIT_S)  # its last words are written before the harness ends

    # ------------------------------------------------------------- what a run calls

    def start_check(self, cfg: TrackingConfig, wait_for_server: bool = False) -> Pending:
        """`tracking.check_store`, started now (the process opens the store while the
        harness goes on); its result() raises the ConfigError, if any."""
        return self.submit("check_store", cfg, wait_for_server)

    def open_run(self, cfg: TrackingConfig, experiment: str, run_name: str, tags: dict[str, Any],
                 resume_tags: dict[str, str] | None = None) -> RemoteStoreRun:  # fmt: skip
        run_id, experiment_id, attempt = self.call("open_run", cfg, experiment, run_name, tags, resume_tags)
        return RemoteStoreRun(self, run_id, experiment_id, attempt)


class RemoteStoreRun:
    """The run the recording process opened: it exports each new line of the run's record."""

    def __init__(self, process: RecordingProcess, run_id: str, experiment_id: str, attempt: int):
        self.process = process
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.attempt = attempt

    def export(self, path: Path, offset: int, length: int) -> None:
        """Have the process write the record's bytes [offset, offset + length) to the store."""
        self.process.call("export", str(Path(path).resolve()), offset, length)


def portable(error: BaseException) -> BaseException:
    """The error itself when the other side can rebuild it without importing anything heavy
    (builtins and mlrb's own), else a RecordingError naming its type and message."""
    if type(error).__module__.startswith(PICKLED_EXCEPTIONS):
        try:
            pickle.loads(pickle.dumps(error))
            return error
        except Exception:  # an exception class pickle cannot rebuild (its own __init__)
            pass
    return RecordingError(f"{type(error).__name__}: {error}")


# ------------------------------------------------------------- the harness's one process

_started: RecordingProcess | None = None


def start(start_process: Callable[[int, int], Any] | None = None) -> RecordingProcess:
    """Start the process for this harness process's run (once), with START_PROCESS if given."""
    global _started
    if _started is None:
        _started = RecordingProcess(start_process)
        atexit.register(stop)  # `end_process` stops it itself: os._exit skips atexit
    return _started


def running() -> RecordingProcess | None:
    return _started


def stop() -> None:
    """At the harness's end: every call answered, the process ended."""
    global _started
    if _started is not None:
        _started.close()
        _started = None


# ------------------------------------------------------------- the recording process itself


class Served:
    """The recording process's state: the run's recorder."""

    def __init__(self) -> None:
        self.recorder: Any = None

    def check_store(self, cfg: TrackingConfig, wait_for_server: bool) -> None:
        from mlrb import tracking

        tracking.check_store(cfg, wait_for_server=wait_for_server)

    def open_run(self, cfg: TrackingConfig, experiment: str, run_name: str, tags: dict[str, Any],
                 resume_tags: dict[str, str] | None) -> tuple[str, str, int]:  # fmt: skip
        from mlrb import tracking

        self.recorder = tracking.open_run(cfg, experiment, run_name, tags, resume_tags=resume_tags)
        return self.recorder.run_id, self.recorder.experiment_id, self.recorder.attempt

    def export(self, path: str, offset: int, length: int) -> None:
        from mlrb.record import export_lines

        export_lines(self.recorder, Path(path), offset, length)


OPERATIONS: dict[str, Callable[..., Any]] = {
    "check_store": Served.check_store,
    "open_run": Served.open_run,
    "export": Served.export,
}


class Collect(logging.Handler):
    """mlrb's log records of one call, sent back with its answer: the harness logs them where
    it logs its own (the run's log file, the console)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc_text = self.formatter.formatException(record.exc_info) if record.exc_info and self.formatter else None
        self.records.append({"name": record.name, "levelno": record.levelno, "levelname": record.levelname,
                             "msg": record.getMessage(), "exc_text": exc_text, "created": record.created})  # fmt: skip

    def take(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records


def serve(receiving: Connection, sending: Connection) -> None:
    served = Served()
    collect = Collect()
    collect.setFormatter(logging.Formatter())
    mlrb_log = logging.getLogger("mlrb")
    mlrb_log.addHandler(collect)
    mlrb_log.setLevel(logging.INFO)
    mlrb_log.propagate = False
    while True:
        try:
            operation, cwd, args = receiving.recv()
        except EOFError:  # the harness is done (or gone)
            return
        try:
            if os.getcwd() != cwd:
                os.chdir(cwd)  # relative paths in the config mean what they mean to the harness
            answer = (True, OPERATIONS[operation](served, *args))
        except ConfigError as e:
            answer = (False, e)
        except Exception as e:  # an MLflow, SQLAlchemy or OS error: the harness says what failed
            log.debug("recording: %s failed", operation, exc_info=True)
            answer = (False, portable(e))
        logged = collect.take()
        try:
            sending.send((*answer, logged))
        except (pickle.PicklingError, TypeError, AttributeError) as e:  # an answer pickle cannot carry
            sending.send((False, RecordingError(f"{operation}: its answer cannot be sent back ({e})"), logged))


def main(argv: list[str]) -> None:
    # The harness decides what a Ctrl-C, a SIGTERM or a closed terminal does, and records it
    # through this process (a terminal signals its whole process group).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    receiving, sending = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    # The point of this process: these imports run while the harness composes its config.
    import mlflow  # noqa: F401

    from mlrb import record, tracking  # noqa: F401
    from mlrb.agents import tracing  # noqa: F401

    serve(receiving, sending)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to tear down: every write was committed when its call was answered


if __name__ == "__main__":
    # Run as the module it is (not as __main__), so that what it pickles back, a RecordingError
    # say, names a class the harness can find: mlrb.recording_process's.
    from mlrb.recording_process import main as serve_the_harness

    serve_the_harness(sys.argv[1:])
