"""MLflow in a process of its own, beside a single run's harness process.

Importing MLflow and its SQL store takes a single run 2-3 s of Python work, more than
anything else the harness does for a short run. Started as soon as `python -m mlrb` has
read its command line, this process does that work on another core while the harness
composes its config, loads the task and imports the agent's SDK. Then it is the run's
exporter (mlrb/store/record.py): it checks the store, and writes each line the harness appends to
`record.jsonl` to the store with `record.export`, reading the line from the file (the first,
`opened`, opens the store's run). The harness process never imports
MLflow.

The two talk in JSON lines over a pair of pipes, one request and one answer at a time:

- `check_store` (the tracking config, whether to wait for a server that is away): the
  answer is empty, or a config error to refuse the run with in one line;
- `export` (the tracking config, a record's path, a byte offset and a length): the answer
  comes once the lines are in the store. The record's first line (`opened`) opens the
  store's run of the record's run id, or finds it (a resumed run): that export's answer is
  the store's run id and experiment id. The harness does not wait for it: the process
  exports in the order asked, and the harness waits for what is left at the run's end
  (`ExportedStoreRun.flush`). So the harness never waits for the store during a run.

A failed request is answered with its kind (`config`, or `failed` with the error's type and
message, which `tracking.store_unreachable` reads) and mlrb's log lines of each request come
back with its answer (a warning about a damaged store, say), so the harness logs them where it
logs its own: the run's log file and the console. No object crosses the pipe but JSON data.

One thread of the harness does the sending and receiving, so that a signal (which Python
delivers to the main thread) never cuts a request in half; the main thread only waits.

The process ignores SIGINT, SIGTERM and SIGHUP (a Ctrl-C or a closed terminal reaches the
whole process group): the harness, which handles them, still records the run as killed
through it. It ends when the harness closes its end of the pipe, at the run's end or when
the harness dies.

Every run records this way: a single run's, a SLURM job's, one run by `mlrb.cli.main()`
called from Python, through a new interpreter; a local sweep's job and the sweep's own parent
run, through a process forked by the sweep's recording server (mlrb/store/recording_server.py),
which has imported MLflow once. `forked_or_new` is where that is chosen, and nowhere else.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mlrb.core import interrupts
from mlrb.core.config import ConfigError, TrackingConfig

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 10.0  # the process ends as soon as it reads the end of its pipe
# At a run's end, while an export is waited for, the store is asked whether it still answers.
FLUSH_POLL_S, ASK_EVERY_S = 0.5, 5.0


class RecordingError(RuntimeError):
    """The recording process failed a request (its error's type and message), or ended while
    the harness still needed it."""


class Pending:
    """The answer to one request, once the recording process gives it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: dict[str, Any] = {}

    def resolve(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.done.set()

    def result(self) -> Any:
        """The request's value (or its error, raised), once what it logged is in the harness's log."""
        self.done.wait()
        for name, level, message in self.answer.get("log", []):
            logging.getLogger(name).log(level, "%s", message)
        if self.answer.get("ok"):
            return self.answer.get("value")
        error = ConfigError if self.answer.get("error") == "config" else RecordingError
        raise error(self.answer.get("message", "the recording process gave no answer"))


def failed(message: str) -> dict[str, Any]:
    return {"ok": False, "error": "failed", "message": message}


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
        [sys.executable, "-m", "mlrb.store.recording_process", str(child_reads), str(child_writes_to)],
        pass_fds=(child_reads, child_writes_to),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def forked_or_new(child_reads: int, child_writes_to: int) -> Any:
    """A local sweep's process (for its parent run) and its jobs ask the sweep's recording server
    to fork the process (MLflow is imported there once, mlrb/store/recording_server.py); any
    other run, or one that cannot reach the server, starts a new one (`spawn`)."""
    from mlrb.store import recording_server

    if recording_server.serving():
        try:
            return recording_server.request(os.environ[recording_server.ADDRESS_VAR], child_reads, child_writes_to)
        except OSError as e:
            log.debug("recording server not reached (%s): a new interpreter records instead", e)
    return spawn(child_reads, child_writes_to)


# How a process is started where no recording server forks one: a new interpreter. The tests
# fork a warm process instead (tests/warm_start.py); the choice of the two stays `forked_or_new`'s.
spawn: Callable[[int, int], Any] = new_interpreter


class RecordingProcess:
    """The harness's side: requests go to the process in order, one at a time."""

    def __init__(self, start_process: Callable[[int, int], Any] | None = None) -> None:
        """START_PROCESS(child_reads, child_writes_to) starts the process (`forked_or_new` unless
        given): a Popen, or what RecordingProcess uses of one (its stdout, stderr, wait and kill)."""
        to_child, child_reads = os.pipe()[::-1]
        child_writes_to, from_child = os.pipe()[::-1]
        self.process = (start_process or forked_or_new)(child_reads, child_writes_to)
        os.close(child_reads)
        os.close(child_writes_to)
        # What MLflow and Python print there (its INFO lines, warnings) goes where the harness's
        # own output goes at that moment: during a run, its standard error is the run's log
        # file (mlrb/core/console.py), as it was when MLflow ran in the harness's process.
        assert self.process.stdout is not None and self.process.stderr is not None
        self.echoes = [
            threading.Thread(target=echo, args=(stream.fileno(), fd), name=f"recording-echo-{fd}", daemon=True)
            for stream, fd in ((self.process.stdout, 1), (self.process.stderr, 2))
        ]
        for thread in self.echoes:
            thread.start()
        self.sending: IO[bytes] = os.fdopen(to_child, "wb")
        self.receiving: IO[bytes] = os.fdopen(from_child, "rb")
        self.requests: queue.SimpleQueue[tuple[bytes, Pending] | None] = queue.SimpleQueue()
        self.ended: str | None = None  # why the process can take no more requests
        self.used = False  # a request was sent: the process may have written to the store
        self.abandoned = False  # its exports wait for a store that is away: not waited for at the end
        self.io = threading.Thread(target=self.exchange, name="recording-io", daemon=True)
        self.io.start()

    def exchange(self) -> None:
        """The I/O thread: send each request, wait for its answer, hand it over."""
        while (item := self.requests.get()) is not None:
            request, pending = item
            if self.ended is None:
                try:
                    self.sending.write(request)
                    self.sending.flush()  # the whole line, however many writes the pipe takes
                    answer = self.receiving.readline()
                    if not answer.endswith(b"\n"):  # the process ended before it answered
                        raise EOFError
                    pending.resolve(json.loads(answer))
                    continue
                except (EOFError, OSError):
                    code = self.process.wait()
                    self.ended = f"the recording process (MLflow) ended unexpectedly, exit code {code}"
                except ValueError as e:  # not JSON: this request fails, not the next
                    pending.resolve(failed(f"the recording process answered what is not JSON ({e})"))
                    continue
            pending.resolve(failed(self.ended))
        try:
            self.sending.close()
        except OSError:  # what a process that ended could not take
            pass

    def submit(self, operation: str, **args: Any) -> Pending:
        """Send a request now; its answer comes later (Pending.result)."""
        pending = Pending()
        self.used = True
        request = {"op": operation, "cwd": os.getcwd(), "args": args}
        self.requests.put(((json.dumps(request, default=str) + "\n").encode("utf-8"), pending))
        return pending

    def call(self, operation: str, **args: Any) -> Any:
        return self.submit(operation, **args).result()

    def close(self) -> None:
        """Let the process end once every request sent so far is answered, and wait for it. One
        that was never asked anything (the command stopped before its run: a config refused,
        --help) is ended at once: it has written nothing, and it would hold the harness's
        standard output and error open (a pipe's reader waits for them) until its imports are
        done. So is one left exporting to a store that is away (`abandoned`): the record
        keeps what it did not write, and `python -m mlrb.sync` uploads it."""
        if self.abandoned or not self.used:
            self.process.kill()
        self.requests.put(None)
        self.io.join(CLOSE_WAIT_S)
        try:
            self.process.wait(CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for thread in self.echoes:
            thread.join(CLOSE_WAIT_S)  # its last words are written before the harness ends

    # ------------------------------------------------------------- what a run asks

    def start_check(self, cfg: TrackingConfig, wait_for_server: bool = False) -> Pending:
        """`tracking.check_store`, started now (the process opens the store while the
        harness goes on); its result() raises the ConfigError, if any."""
        return self.submit("check_store", tracking=dataclasses.asdict(cfg), wait_for_server=wait_for_server)

    def store_run(self, cfg: TrackingConfig) -> ExportedStoreRun:
        """The run's exporter to the store CFG names: nothing is asked of the store until the
        record's first line (`opened`) is exported."""
        return ExportedStoreRun(self, cfg)


class ExportedStoreRun:
    """Exports each new line of a run's record, in order, through the recording process, while
    the harness goes on; the harness waits for the exports only at the run's end. The record's
    `opened` line opens (or finds) the store's run: its id in the store is known once that
    export is answered (`opened_as`)."""

    def __init__(self, process: RecordingProcess, cfg: TrackingConfig):
        from mlrb.store import tracking

        self.process = process
        self.cfg = cfg
        self.store = tracking.store_named(cfg)  # where `python -m mlrb.sync` uploads the record
        self.sent: list[Pending] = []  # the exports not yet seen answered, in order
        self.opening: Pending | None = None  # the export of the `opened` line

    def export(self, path: Path, offset: int, length: int, opens: bool = False) -> None:
        """Have the process write the record's bytes [offset, offset + length) to the store,
        after the lines sent before; returns at once. OPENS: they hold the `opened` line. An
        earlier export that failed raises here."""
        self.answered()
        pending = self.process.submit(
            "export",
            tracking=dataclasses.asdict(self.cfg),
            path=str(Path(path).resolve()),
            offset=offset,
            length=length,
        )
        if opens:
            self.opening = pending
        self.sent.append(pending)

    def answered(self) -> None:
        """Drop the exports answered so far; the first that failed raises its error."""
        while self.sent and self.sent[0].done.is_set():
            self.sent.pop(0).result()

    @property
    def opened_as(self) -> tuple[str, str] | None:
        """The store's run id and experiment id, once the `opened` line's export is answered (None
        before, or when it failed); its error is left to `answered` and `flush`."""
        pending = self.opening
        if pending is None or not pending.done.is_set() or not pending.answer.get("ok"):
            return None
        run_id, experiment_id = pending.answer["value"]
        return run_id, experiment_id

    def wait_opened(self) -> tuple[str, str]:
        """The store's run id and experiment id, waiting for the `opened` line's export (its
        error, or an earlier one, raised)."""
        if self.opening is None:
            raise RecordingError("the record's opened line was never exported")
        self.opening.done.wait()
        self.answered()
        opened = self.opened_as
        if opened is None:  # answered() raised its error, unless it was already seen
            raise RecordingError(self.opening.answer.get("message", "the store's run was not opened"))
        return opened

    def flush(self) -> None:
        """Wait until every export sent is in the store (or raise the first that failed). While
        one is waited for, the store is asked every ASK_EVERY_S whether it still answers:
        StoreAway at once if not, rather than the store's minutes of retries."""
        from mlrb.store import tracking

        asked = 0.0
        while self.sent:
            if not self.sent[0].done.wait(FLUSH_POLL_S) and time.monotonic() - asked > ASK_EVERY_S:
                asked = time.monotonic()
                reason = tracking.store_away(self.cfg)
                if reason:
                    self.process.abandoned = True
                    raise tracking.StoreAway(reason)
            self.answered()


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
    """At the harness's end: every request answered, the process ended."""
    global _started
    if _started is not None:
        _started.close()
        _started = None


# ------------------------------------------------------------- the recording process itself


class Exporter:
    """The recording process's side: the store's run of each record it exports, and what each
    request does."""

    def __init__(self) -> None:
        self.recorders: dict[str, Any] = {}  # by record file: the store's run its lines go to
        self.not_opened: dict[str, str] = {}  # by record file: why its store's run could not be opened

    def check_store(self, tracking: dict[str, Any], wait_for_server: bool) -> None:
        from mlrb.store import tracking as store

        store.check_store(TrackingConfig(**tracking), wait_for_server=wait_for_server)

    def export(self, tracking: dict[str, Any], path: str, offset: int, length: int) -> list[str] | None:
        """Write the record's lines to the store; an `opened` line opens (or finds) the store's run
        of the record's run id. Returns that run's id and experiment id, when a line opened it."""
        from mlrb.store import record
        from mlrb.store import tracking as store

        opened_as = None
        for line in record.lines_at(Path(path), offset, length):
            if line["kind"] == "opened":
                try:
                    recorder = store.open_run(
                        TrackingConfig(**tracking),
                        line["experiment"],
                        line["run_name"],
                        line["tags"],
                        line["run_id"],
                        int(line["attempt"]),
                    )
                except Exception as e:
                    self.not_opened[path] = f"{type(e).__name__}: {e}"
                    raise
                self.recorders[path] = recorder
                opened_as = [recorder.run_id, recorder.experiment_id]
            elif path in self.recorders:
                record.export(self.recorders[path], [line], Path(path).parent)
            else:
                raise RuntimeError(f"the store's run was not opened ({self.not_opened.get(path, 'no opened line')})")
        return opened_as


OPERATIONS: dict[str, Callable[..., Any]] = {
    "check_store": Exporter.check_store,
    "export": Exporter.export,
}


class Collect(logging.Handler):
    """mlrb's log lines of one request, sent back with its answer as (logger, level, message)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[list[Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append([record.name, record.levelno, record.getMessage()])

    def take(self) -> list[list[Any]]:
        lines, self.lines = self.lines, []
        return lines


def answer(exporter: Exporter, request: dict[str, Any]) -> dict[str, Any]:
    try:
        if os.getcwd() != request["cwd"]:
            os.chdir(request["cwd"])  # relative paths in the config mean what they mean to the harness
        return {"ok": True, "value": OPERATIONS[request["op"]](exporter, **request["args"])}
    except ConfigError as e:
        return {"ok": False, "error": "config", "message": str(e)}
    except Exception as e:  # an MLflow, SQLAlchemy or OS error: the harness says what failed
        return failed(f"{type(e).__name__}: {e}")


def serve(receiving: IO[bytes], sending: IO[bytes]) -> None:
    exporter = Exporter()
    collect = Collect()
    mlrb_log = logging.getLogger("mlrb")
    mlrb_log.addHandler(collect)
    mlrb_log.setLevel(logging.INFO)
    mlrb_log.propagate = False
    for line in receiving:  # until the harness is done (or gone)
        try:
            reply = answer(exporter, json.loads(line))
        except ValueError as e:  # not JSON (a request's own fields are checked as it is answered)
            reply = failed(f"the recording process cannot read the request ({e})")
        reply["log"] = collect.take()
        sending.write((json.dumps(reply, default=str) + "\n").encode("utf-8"))
        sending.flush()


def main(argv: list[str]) -> None:
    # The harness decides what a Ctrl-C, a SIGTERM, a closed terminal or a SLURM job's signal does,
    # and records it through this process (a terminal or SLURM signals every process of the run).
    interrupts.ignore_job_signals()
    receiving, sending = os.fdopen(int(argv[0]), "rb"), os.fdopen(int(argv[1]), "wb")
    from mlrb.store import recording_server

    recording_server.import_ahead()  # the point of this process: these run while the harness composes its config
    serve(receiving, sending)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to tear down: every write was committed when its request was answered


if __name__ == "__main__":
    main(sys.argv[1:])
