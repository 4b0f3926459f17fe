"""`python -m mlrb ARGS` for the tests, started warm: forked from a process that has already
imported what such a command imports (mlrb's CLI and run, Hydra, the model SDKs, MLflow)
rather than a new interpreter that imports it all again.

The suite is CPU-bound (docs/development.md), and those imports were most of a short run's
CPU time: `import anthropic` alone takes about 2 CPU s, MLflow and its SQL store 3 more in
the run's recording process, Hydra and mlrb about 1. Each test process keeps one warm
process (its "zygote"), started on first use; every command is a fork of it, so each starts
from the same clean state, in its own process, with its own exit status, standard output
and error, as a new interpreter would.

What the command then does is what `python -m mlrb` does: the same `mlrb.__main__`, the same
sandboxes, scorer and store. A single run's recording process (mlrb/store/recording_process.py) is
forked from the warm harness too, through `recording_process.spawn` (which a local sweep's
process uses only where its recording server does not serve), and runs the same
`recording_process.main`.

A new interpreter is still started (`cold`) where a fork could differ from one:
- the folder holds an `mlrb` package other than the one imported here (a fresh clone);
- the environment differs in what an interpreter or a library reads as it starts or
  imports (PYTHON*, HOME, the temp folder, the locale, the thread counts, MLflow's logging, ...);
- MLRB_TEST_COLD_START=1, to compare.
MLRB_TEST_WARM_LOG=FILE appends each command's test, module and why it started cold (or warm).
Tests of what a new interpreter imports, of its start-up time or of signals sent to a
command's process run their commands with subprocess themselves, as users type them.

Commands written in bash (the documented blocks: `python -m mlrb ...` as a page shows it) find
`python` on PATH: `python_on_path()` puts a small `python` first there, which hands
`python -m mlrb...` to the warm process over a Unix socket (its standard streams with it) and
waits for the fork's exit status; anything else it runs as the venv's python itself
(`exec`), as it does where the warm process says the command must start cold. A local sweep's
jobs, which submitit's local executor starts as `PYTHON -u -m submitit.core._submit FOLDER`,
start through the same `python` (a forked command's executors are given it): each job is a
fork too, whose `python` passes on the signals its controller sends and takes the job with it
when it is killed.
"""

from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# What a command imports before it does anything of its own; a fork finds them imported.
PRELOAD = (
    "mlrb.cli", "mlrb.run", "mlrb.store.recording_process", "mlrb.store.record", "mlrb.store.tracking", "mlrb.store.tracing",
    "mlrb.sweep", "hydra", "omegaconf", "submitit", "anthropic", "openai", "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",  # a SQLite store's tables, SQLAlchemy, alembic
)  # fmt: skip
# Read by an interpreter as it starts, or by a module the zygote imports as it is imported
# (prefixes; numpy, pandas and pyarrow come with MLflow): a command whose environment differs
# from the zygote's in one of these starts cold. The rest is read when it is used, or by a
# module the command imports itself (torch, transformers, the Hugging Face hub), so what a
# test process gains by calling mlrb or a library in-process (MLFLOW_HTTP_REQUEST_*,
# MLRB_SWEEP_*, TORCHINDUCTOR_CACHE_DIR, lm-eval's HF_XET_HIGH_PERFORMANCE) leaves its commands
# warm: mlrb reads only TMPDIR as it is imported.
READ_AT_START = ("PYTHON", "HOME", "TMPDIR", "TEMP", "TMP", "LANG", "LC_", "XDG_", "OMP_", "MKL_", "OPENBLAS",
                 "ARROW_", "LD_", "MLFLOW_CONFIGURE_LOGGING", "MLFLOW_LOGGING_")  # fmt: skip
TESTS = Path(__file__).resolve().parent
# The environment the zygote starts with: the test process's as conftest set it up, before
# any test changed it.
STARTING_ENV = dict(os.environ)


def run(module: str, args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` from CWD with ENV (the whole environment), its output as text,
    as subprocess.run(..., capture_output=True, text=True, timeout=TIMEOUT) gives it."""
    command, cwd = [sys.executable, "-m", module, *args], Path(cwd)
    reason = why_cold(cwd, env)
    note_start(dict(os.environ), module, reason)
    zygote = Zygote.get() if reason is None else None
    if zygote is None:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return zygote.run(command, module, args, cwd, env, timeout)


def note_start(env: dict[str, str], module: str, reason: str | None, how: str = "") -> None:
    """Append to ENV's MLRB_TEST_WARM_LOG, where set, which command started cold and why (or warm)."""
    if log := env.get("MLRB_TEST_WARM_LOG"):
        with open(log, "a") as out:
            test = env.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
            out.write(f"{test}\t{module}\t{reason or 'warm'}{how}\n")


def warm_enough(cwd: Path, env: dict[str, str]) -> bool:
    """Whether a fork of the zygote behaves as a new interpreter would, run from CWD with ENV."""
    return why_cold(cwd, env) is None


def why_cold(cwd: Path, env: dict[str, str]) -> str | None:
    """Why a command run from CWD with ENV must start as a new interpreter; None if it need not."""
    if os.environ.get("MLRB_TEST_COLD_START") == "1":
        return "MLRB_TEST_COLD_START=1"
    package = cwd / "mlrb"
    if (package / "__init__.py").is_file() and package.resolve() != Path(importlib.import_module("mlrb").__path__[0]):
        return f"another mlrb in {cwd}"  # `python -m mlrb` there imports that folder's mlrb
    keys = {k for k in {*env, *STARTING_ENV} if k.startswith(READ_AT_START)}
    differ = sorted(k for k in keys if env.get(k) != STARTING_ENV.get(k))
    return f"environment differs in {', '.join(differ)}" if differ else None


def python_on_path(env: dict[str, str]) -> dict[str, str]:
    """ENV with a `python` first on its PATH that runs `python -m mlrb...` warm (the module docstring);
    ENV itself where there is no warm process or every command is to start cold."""
    if os.environ.get("MLRB_TEST_COLD_START") == "1" or (zygote := Zygote.get()) is None:
        return env
    return {**env, "PATH": f"{zygote.program.parent}:{env['PATH']}"}


# The `python` of python_on_path(): `python -m mlrb...` is sent to the warm process, which forks it
# with this program's standard streams and says its pid, then its exit status, which this program
# exits with (a signal it gets goes on to the command); anything else is the venv's python, as is a
# command the warm process says must start cold (why_cold) or one it cannot be reached for.
SHIM = """import json, os, signal, socket, sys

PYTHON = sys.executable
args = sys.argv[1:]
flags = []
while args and args[0] == "-u":  # unbuffered: how submitit's local executor starts a job
    flags.append(args.pop(0))


def as_a_new_interpreter():
    os.execv(PYTHON, [PYTHON, *flags, *args])


if len(args) < 2 or args[0] != "-m" or not args[1].startswith(("mlrb", "submitit.core._submit")):
    as_a_new_interpreter()
try:
    warm = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    warm.connect(SOCKET_PATH)
    request = {"module": args[1], "args": args[2:], "cwd": os.getcwd(), "env": dict(os.environ),
               "unbuffered": bool(flags), "watch": os.getpid()}
    socket.send_fds(warm, [json.dumps(request).encode()], [0, 1, 2])
    answer = json.loads(warm.recv(4096) or b'{"cold": "the warm process ended"}')
except OSError:
    answer = {"cold": "no warm process"}
if "cold" in answer:
    as_a_new_interpreter()
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, lambda signum, frame: os.kill(answer["pid"], signum))
ended = warm.recv(4096)
code = json.loads(ended)["exit"] if ended else 1
if code < 0:  # ended by a signal: so does this program
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def text(data: bytes) -> str:
    """As subprocess's text mode decodes: UTF-8, universal newlines."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


class Zygote:
    """This test process's warm process, and how to start a command from it."""

    _one: Zygote | None = None
    _failed = False
    _starting = threading.Lock()  # commands run from threads at once start one zygote

    @classmethod
    def get(cls) -> Zygote | None:
        with cls._starting:
            if cls._one is None and not cls._failed:
                try:
                    cls._one = Zygote()
                except Exception as e:  # say why once; the commands start cold
                    cls._failed = True
                    print(f"warm_start: no warm process ({e}); commands start cold", file=sys.stderr)
            return cls._one

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # where the `python` of python_on_path() reaches it, and that program
        self.folder = Path(tempfile.mkdtemp(prefix="mlrb-warm-"))
        socket_path = self.folder / "socket"
        self.program = self.folder / "bin" / "python"
        self.program.parent.mkdir()
        # -I -S: it starts in milliseconds, with nothing of the environment's or the venv's
        self.program.write_text(f"#!{sys.executable} -IS\n" + SHIM.replace("SOCKET_PATH", repr(str(socket_path))))
        self.program.chmod(0o755)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(socket_path))
        listener.listen(16)
        self.errors = tempfile.TemporaryFile()  # what it says if it fails (not a pipe: none reads it)
        self.process = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r}); import warm_start; "
             f"warm_start.serve({theirs.fileno()}, {listener.fileno()}, {str(self.program)!r})"],
            pass_fds=(theirs.fileno(), listener.fileno()), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.errors, env=STARTING_ENV, cwd=TESTS,
        )  # fmt: skip
        theirs.close()
        listener.close()
        self.control = ours
        self.lock = threading.Lock()
        if self.control.recv(64) != b"ready":  # sent after its imports
            raise RuntimeError(self.said() or "it ended")
        atexit.register(self.close)

    def said(self) -> str:
        self.process.kill()
        self.process.wait()
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        self.control.close()  # it ends when it reads the end of its socket
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, command: list[str], module: str, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:  # fmt: skip
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report, report_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        devnull = os.open(os.devnull, os.O_RDONLY)
        request = json.dumps({"module": module, "args": args, "cwd": str(cwd), "env": env}).encode()
        try:
            with self.lock:
                socket.send_fds(self.control, [request], [devnull, out_w, err_w, report_theirs.fileno()])
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)
            report_theirs.close()
        outputs: dict[int, bytes] = {}
        readers = [threading.Thread(target=read_all, args=(fd, outputs), daemon=True) for fd in (out_r, err_r)]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + timeout
        started = report.recv(64)
        if not started:
            report.close()
            raise RuntimeError(f"warm_start: the warm process ended: {self.said()}")
        pid = json.loads(started)["pid"]
        report.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            code = json.loads(report.recv(64))["exit"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)  # as subprocess.run does: the command only, not what it started
            for reader in readers:
                reader.join(5)
            # bytes, as subprocess.run gives them on a timeout even in text mode
            raise subprocess.TimeoutExpired(
                command, timeout, outputs.get(out_r, b""), outputs.get(err_r, b"")
            ) from None
        finally:
            report.close()
        for reader in readers:
            reader.join(max(1.0, deadline - time.monotonic()))
        return subprocess.CompletedProcess(command, code, text(outputs.get(out_r, b"")), text(outputs.get(err_r, b"")))


def read_all(fd: int, outputs: dict[int, bytes]) -> None:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    outputs[fd] = b"".join(chunks)


# ------------------------------------------------------------- in the zygote


WARM_PYTHON = ""  # in the zygote: the `python` of python_on_path()


def serve(control_fd: int, listener_fd: int, program: str) -> None:
    """The zygote: import, say so, then fork a command for each request (from the test process,
    or from the `python` of python_on_path() on the listening socket) until the test process
    closes its socket. It stays single-threaded, so that a fork is safe."""
    global WARM_PYTHON
    WARM_PYTHON = program
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # as mlrb.cli.main sets it before MLflow starts
    from mlrb.core.collector import lasting_imports

    # What is imported stays shared with the forks: no collection goes through (copies) it.
    with lasting_imports():
        for name in PRELOAD:
            importlib.import_module(name)
        importlib.import_module("mlrb.store.tracing").import_exporter()  # as a recording process does
        # Each command's first step (mlrb.cli.main): Hydra's plugin discovery and the schema made a
        # structured config, 20 ms a command, the same in every fork.
        importlib.import_module("mlrb.core.config").register_schema()
    sys.path.remove(str(TESTS))
    if others := other_threads():
        raise SystemExit(f"the imports started threads ({', '.join(others)}): a fork would not be safe")
    control = socket.socket(fileno=control_fd)
    listener = socket.socket(fileno=listener_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped as they end
    control.send(b"ready")

    def start(request: dict[str, Any], fds: list[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            control.close()
            listener.close()
            wait_for(request, fds)
        for fd in fds:
            os.close(fd)

    while True:
        ready, _, _ = select.select([control, listener], [], [])
        if control in ready:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
            if not message:
                return  # the test process is done (or gone)
            start(json.loads(message), fds)
        if listener in ready:
            answer_the_python_on_path(listener, start)


def answer_the_python_on_path(listener: socket.socket, start: Any) -> None:
    """One request of python_on_path()'s `python`: forked with its streams, its socket the report's
    (pid, then exit status); or told to start cold, as run() would start it."""
    connection, _ = listener.accept()
    fds: list[int] = []
    try:
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
        reason = why_cold(Path(request["cwd"]), request["env"]) if len(fds) == 3 else "no streams"
        note_start(request["env"], request["module"], reason, " (python on PATH)")
    except (OSError, ValueError, KeyError) as error:
        reason = f"a bad request: {error}"
    if reason is None:
        start(request, [*fds, connection.detach()])
        return
    for fd in fds:
        os.close(fd)
    try:
        connection.send(json.dumps({"cold": reason}).encode())
    except OSError:
        pass
    connection.close()


def other_threads() -> list[str]:
    """The names of this process's threads besides the main one, but for pyarrow's jemalloc
    (imported with MLflow), which keeps its own locks safe across a fork."""
    names = [(Path("/proc/self/task") / task / "comm").read_text().strip() for task in os.listdir("/proc/self/task")]
    return [name for name in names[1:] if name != "jemalloc_bg_thd"]


def wait_for(request: dict[str, Any], fds: list[int]) -> None:
    """A waiter: fork the command, tell the test process its pid, then its exit status."""
    stdin, stdout, stderr, report = fds
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        os.close(report)
        become(request, stdin, stdout, stderr)
    for fd in (stdin, stdout, stderr):
        os.close(fd)
    tell(report, {"pid": pid})
    status = wait_watching(pid, request["watch"]) if request.get("watch") else os.waitpid(pid, 0)[1]
    tell(report, {"exit": os.waitstatus_to_exitcode(status)})
    os._exit(0)


def wait_watching(pid: int, watched: int) -> int:
    """The wait status of command PID, killed if the `python` that asked for it (WATCHED) is killed
    first: killing it kills the command, as killing the command's own process would. Both are
    waited on at once through their pidfds, with no polling."""
    command = os.pidfd_open(pid)
    try:
        gone = os.pidfd_open(watched)
    except ProcessLookupError:  # it died before its command was waited for
        gone = None
    try:
        ready = select.select([command, gone], [], [])[0] if gone is not None else []
        if command not in ready:
            os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]
    finally:
        os.close(command)
        if gone is not None:
            os.close(gone)


def tell(report: int, what: dict[str, int]) -> None:
    """Say WHAT to whoever asked for the command, unless they are gone (the command runs on)."""
    try:
        os.write(report, json.dumps(what).encode())
    except OSError:
        pass


def become(request: dict[str, Any], stdin: int, stdout: int, stderr: int) -> None:
    """The command itself: `python -m MODULE ARGS` as a new interpreter would run it, then
    the interpreter's end (its threads joined, its atexit functions run)."""
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]  # as `python -m` puts the folder it runs from first
    sys.argv = ["-m", *request["args"]]  # argv[0] becomes the module's file, as for `python -m`
    main = sys.modules["__main__"].__dict__  # the zygote's: the module runs in it, as in a new one
    for name in [name for name in main if name != "__builtins__"]:
        del main[name]
    from mlrb.store import recording_process

    recording_process.spawn = forked_recording_process
    start_local_jobs_warm()
    if request.get("unbuffered"):  # `python -u`: each write goes straight to its file
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name)
            raw = io.FileIO(fd, "w", closefd=False)
            setattr(sys, name, io.TextIOWrapper(raw, stream.encoding, stream.errors, write_through=True))  # type: ignore[arg-type]
    try:
        runpy._run_module_as_main(request["module"])  # type: ignore[attr-defined]  # what `python -m` runs
    except SystemExit as e:
        end(e.code)
    except BaseException as e:  # printed as an interpreter prints it: from the module's frames on
        traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
        end(1, interrupted=isinstance(e, KeyboardInterrupt))
    end(0)


def start_local_jobs_warm() -> None:
    """A local sweep's jobs start through python_on_path()'s `python` (submitit's local executor
    runs `PYTHON -u -m submitit.core._submit FOLDER`, PYTHON its `python` argument, else this
    interpreter): each is forked from the warm process, as the commands are."""
    from submitit.local import local

    executor = local.LocalExecutor
    original = executor.__init__

    def init(self: Any, folder: Any, max_num_timeout: int = 3, max_pickle_size_gb: float = 1.0,
             python: str | None = None) -> None:  # fmt: skip
        original(self, folder, max_num_timeout, max_pickle_size_gb, python or WARM_PYTHON or None)

    executor.__init__ = init  # type: ignore[method-assign]


def end(code: Any, interrupted: bool = False) -> None:
    """What an interpreter does at its end, short of freeing its modules: join the threads
    that are not daemons, run the atexit functions, flush, exit (by SIGINT after an
    uncaught Ctrl-C)."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code or 0)


class ForkedProcess:
    """What mlrb.store.recording_process needs of a subprocess.Popen, for a forked process."""

    def __init__(self, pid: int, stdout: int, stderr: int):
        self.pid = pid
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["mlrb.store.recording_process"], timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)


def forked_recording_process(child_reads: int, child_writes_to: int) -> Any:
    """The run's recording process, forked from the warm harness (MLflow is imported already);
    a new interpreter instead when the harness has started a thread by then. A harness that
    opened its store (a sweep's process) closes its connections first: a fork must inherit none
    (mlrb/store/recording_server.py)."""
    from mlrb.store import recording_process, recording_server

    if threading.active_count() > 1 or other_threads():
        return recording_process.new_interpreter(child_reads, child_writes_to)
    recording_server.close_store_connections()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd > 2 and fd not in (child_reads, child_writes_to):
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the listing's own descriptor
            recording_process.main([str(child_reads), str(child_writes_to)])
        finally:
            os._exit(1)
    os.close(out_w)
    os.close(err_w)
    return ForkedProcess(pid, out_r, err_r)
