"""MLflow in a process of its own, beside a single run's harness process.

Importing MLflow and its SQL store takes a single run 2-3 s of Python work, more than
anything else the harness does for a short run. Started as soon as `python -m mlrb` has
read its command line, this process does that work on another core while the harness
composes its config, loads the task and imports the agent's SDK. Then it is the run's
exporter (mlrb/record.py): it checks the store, opens the run, and writes each line the
harness appends to `record.jsonl` to the store with `record.export_lines`, reading the line
from the file, as a sweep's job does in its own process. The harness process never imports
MLflow.

The two talk in JSON lines over a pair of pipes, one request and one answer at a time:

- `check_store` (the tracking config, whether to wait for a server that is away): the
  answer is empty, or a config error to refuse the run with in one line;
- `open_run` (the tracking config, experiment, run name, tags, resume tags): the answer is
  the store's run id, its experiment's id and the attempt;
- `export` (the record's path, a byte offset and a length): the answer comes once the lines
  are in the store, so a line is in the store when its call returns, as in one process.

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

A local sweep's jobs record the same way, through a process forked by their sweep's recording
server (mlrb/recording_server.py). A SLURM sweep's jobs and `mlrb.cli.main()` called from
Python record in their own process (`record.LOCAL`): their processes may live on after one
run, or import MLflow anyway.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mlrb.config import ConfigError, TrackingConfig

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 10.0  # the process ends as soon as it reads the end of its pipe


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
        [sys.executable, "-m", "mlrb.recording_process", str(child_reads), str(child_writes_to)],
        pass_fds=(child_reads, child_writes_to), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


# How the process is started: the tests start it from a warm process instead (tests/warm_start.py).
spawn: Callable[[int, int], Any] = new_interpreter


class RecordingProcess:
    """The harness's side: requests go to the process in order, one at a time."""

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
        self.sending: IO[bytes] = os.fdopen(to_child, "wb")
        self.receiving: IO[bytes] = os.fdopen(from_child, "rb")
        self.requests: queue.SimpleQueue[tuple[bytes, Pending] | None] = queue.SimpleQueue()
        self.ended: str | None = None  # why the process can take no more requests
        self.used = False  # a request was sent: the process may have written to the store
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
        done."""
        if not self.used:
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

    def open_run(self, cfg: TrackingConfig, experiment: str, run_name: str, tags: dict[str, Any],
                 resume_tags: dict[str, str] | None = None,
                 reopen: tuple[str, int] | None = None) -> RemoteStoreRun:  # fmt: skip
        run_id, experiment_id, attempt = self.call(
            "open_run", tracking=dataclasses.asdict(cfg), experiment=experiment, run_name=run_name,
            tags={k: str(v) for k, v in tags.items()}, resume_tags=resume_tags, reopen=reopen,
        )  # fmt: skip
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
        self.process.call("export", path=str(Path(path).resolve()), offset=offset, length=length)


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
    """The recording process's side: the run it opened, and what each request does."""

    def __init__(self) -> None:
        self.recorder: Any = None

    def check_store(self, tracking: dict[str, Any], wait_for_server: bool) -> None:
        from mlrb import tracking as store

        store.check_store(TrackingConfig(**tracking), wait_for_server=wait_for_server)

    def open_run(self, tracking: dict[str, Any], experiment: str, run_name: str, tags: dict[str, str],
                 resume_tags: dict[str, str] | None, reopen: list[Any] | None = None) -> list[Any]:  # fmt: skip
        from mlrb import tracking as store

        self.recorder = store.open_run(TrackingConfig(**tracking), experiment, run_name, tags, resume_tags=resume_tags,
                                       reopen=(reopen[0], int(reopen[1])) if reopen else None)  # fmt: skip
        return [self.recorder.run_id, self.recorder.experiment_id, self.recorder.attempt]

    def export(self, path: str, offset: int, length: int) -> None:
        from mlrb.record import export_lines

        export_lines(self.recorder, Path(path), offset, length)


OPERATIONS: dict[str, Callable[..., Any]] = {
    "check_store": Exporter.check_store,
    "open_run": Exporter.open_run,
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
    # The harness decides what a Ctrl-C, a SIGTERM or a closed terminal does, and records it
    # through this process (a terminal signals its whole process group).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    receiving, sending = os.fdopen(int(argv[0]), "rb"), os.fdopen(int(argv[1]), "wb")
    # The point of this process: these imports run while the harness composes its config.
    import mlflow  # noqa: F401

    from mlrb import record, tracking  # noqa: F401
    from mlrb.agents import tracing  # noqa: F401

    serve(receiving, sending)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to tear down: every write was committed when its request was answered


if __name__ == "__main__":
    main(sys.argv[1:])
