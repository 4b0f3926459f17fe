"""A warm interpreter for the anchors' runs at asset build: `python SCRIPT ...` forked from a
process that has imported what the starter's scripts import, instead of started afresh.

Each anchor command is a fresh `python train.py ...`, and most of a short one is importing
torch and transformers and tearing them down at exit (about 4 s of a core here, and a task
runs 3 to 9 of them at build). `WarmPython` starts
this file once per build under the task environment's interpreter, with the runs' environment;
it imports the modules the starter's scripts import at their top level and then forks one child
per run. The child takes the run's working folder, environment, arguments and standard streams
and runs the script as `__main__`, as `python SCRIPT` would. The arithmetic is the same code on
the same thread count, so the scores are those of fresh processes (the asset fingerprints and
calibration did not change when this came in).

What a run imports only as it goes (the model class an Auto class picks from a config, its
generation code, the weights' loader: 1.5 s of a core for a seq2seq model) the server learns:
each child names, as it ends, the library modules it imported (those found on the server's own
path, never the run's own files; nothing from a run that used a GPU), and the server imports
them before its next fork.

Only a command that is one plain `python SCRIPT.py ARGS` (no shell operators, no interpreter
flags, `python` being this interpreter) is run warm; anything else, or a server that did not
start, goes through bash as before (`WarmPython.run` returns None).

The server side (`serve`) uses the standard library only: it runs in the task's environment,
which does not hold mlrb.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import gc
import importlib.machinery
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import tokenize
import traceback
import types
from pathlib import Path
from typing import NoReturn

READY = "ready"
# Shell syntax that makes a command more than one plain python invocation.
SHELL_SYNTAX = set("();<>|&`\n") | {"$("}


def starter_imports(folder: Path) -> list[str]:
    """What the Python files in `folder` import at their top level, as `module` or
    `module:name` (a `from module import name`, which loads lazily exported names such as
    transformers' models). Modules that are files or packages of the folder itself are left
    out: those are the script's own, found beside it."""
    local = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    found: list[str] = []
    for path in sorted(folder.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found += [f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*"]
    wanted = [name for name in found if name.split(".")[0].split(":")[0] not in local | {"__future__"}]
    return list(dict.fromkeys(wanted))


class WarmPython:
    """One warm interpreter (`python`, the task environment's) for the runs of one build.
    Use as a context manager; `run` is safe to call from several threads at once."""

    def __init__(self, python: str, env: dict[str, str], preload: list[str], scratch: Path):
        self.python = python  # as found on PATH: a venv's python is a link that must not be resolved
        self.socket_path = str(scratch / "warm-python.sock")
        self.log = scratch / "warm-python.log"
        scratch.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.server = subprocess.Popen(
                [self.python, __file__, self.socket_path, *preload],
                env=env,
                cwd=scratch,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.server.stdout is not None
        self.ready = self.server.stdout.readline().strip() == READY

    def __enter__(self) -> WarmPython:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.terminate()
        self.server.wait()
        if self.server.stdout:
            self.server.stdout.close()
        Path(self.socket_path).unlink(missing_ok=True)

    def said(self) -> str:
        """The end of what the server wrote to its log, for an error: the log goes with the build's
        scratch folder."""
        text = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return text[-1500:] or "it wrote nothing"

    def arguments(self, command: str, cwd: Path, env: dict[str, str]) -> list[str] | None:
        """The script and its arguments, as bash would pass them to `python`, when the command
        is one plain `python SCRIPT.py ...` run by this interpreter; else None."""
        if not self.ready or any(mark in command for mark in SHELL_SYNTAX):
            return None
        try:
            words = shlex.split(command)
        except ValueError:  # unbalanced quotes: bash will say what is wrong
            return None
        if len(words) < 2 or words[0] != "python" or not words[1].endswith(".py"):
            return None
        if shutil.which("python", path=env.get("PATH")) != self.python:
            return None
        # bash expands the words (the quoted "$MLRB_DATA", say) as it would for the real run
        expand = subprocess.run(
            ["/bin/bash", "-c", 'python() { printf "%s\\0" "$@"; }\n' + command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
        if expand.returncode != 0:
            return None
        return expand.stdout.decode().split("\0")[:-1]

    def run(self, command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str] | None:
        """Run `command` warm: its exit status and its standard error; None when it must go
        through bash instead (see `arguments`). Standard output is discarded."""
        argv = self.arguments(command, cwd, env)
        if argv is None:
            return None
        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
        with (
            open(os.devnull, "rb") as stdin,
            open(os.devnull, "wb") as stdout,
            tempfile.TemporaryFile() as stderr,
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn,
        ):
            try:
                conn.connect(self.socket_path)
                socket.send_fds(conn, [request], [stdin.fileno(), stdout.fileno(), stderr.fileno()])
                pid = int(conn.recv(64))
            except (OSError, ValueError) as e:
                raise RuntimeError(f"the warm interpreter could not run `{command}` ({e}): {self.said()}") from None
            try:
                answer = conn.recv(64)
            except BaseException:  # interrupted: the run must not go on training without us
                os.kill(pid, signal.SIGKILL)
                raise
            if not answer:
                raise RuntimeError(f"the warm interpreter ended while running `{command}`: {self.said()}")
            stderr.seek(0)
            return int(answer), stderr.read().decode(errors="replace")


def serve(socket_path: str, preload: list[str]) -> None:
    """The server: import `preload`, say READY, then fork a child per request (`run_child`,
    which never returns). Runs until terminated."""
    # As mlrb.core.collector's lasting_imports (this server runs on the standard library alone): the
    # imports' objects are not garbage, so no collection goes through them as they are made.
    gc.disable()
    for name in preload:
        module, _, attribute = name.partition(":")
        try:
            loaded = __import__(module, fromlist=["_"])
            if attribute:
                getattr(loaded, attribute)
        except Exception:  # noqa: BLE001 - the script will import it itself, and fail there if it must
            continue
    gc.enable()
    learned = os.path.join(os.path.dirname(socket_path), "learned-imports")
    os.makedirs(learned, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen(16)
    listener.settimeout(0.05)
    print(READY, flush=True)
    waiting: dict[int, socket.socket] = {}  # a child's pid: the connection its status goes to
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            conn = None
        if conn is not None:
            conn.settimeout(None)
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            # What the server imported is out of the cyclic collector's reach in the child: its
            # collections go through the run's own objects only, and leave the shared pages unwritten.
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                run_child(json.loads(message), fds, learned)
            for fd in fds:
                os.close(fd)
            try:
                conn.send(str(pid).encode())  # first the child's pid, then (below) its exit status
            except OSError:  # the client is gone; its child is still reaped below
                pass
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            done = waiting.pop(pid)
            try:
                done.send(str(128 - code if code < 0 else code).encode())  # a signal, as bash reports it
            except OSError:
                pass
            done.close()
            import_learned(os.path.join(learned, str(pid)))


def import_learned(path: str) -> None:
    """Import the modules a child that ended named in `path` (`name_imports`), for the runs forked
    after it; the file is removed. A module that fails to import here is left to the runs."""
    try:
        with open(path) as f:
            names = f.read().split()
        os.unlink(path)
    except OSError:  # the child died before it could say
        return
    for name in names:
        if name not in sys.modules:
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - the run imports it itself, as before
                continue


def name_imports(path: str, before: set[str], library_path: list[str], own: list[str]) -> None:
    """Write to `path` the modules this child imported (not in `before`) that come from the
    server's own library path and not from the run's folders `own`: what the server may import
    for later runs."""

    def under(entries: list[str]) -> tuple[str, ...]:
        return tuple(os.path.join(os.path.realpath(entry), "") for entry in entries if entry)

    library, run = under(library_path), under(own)
    found = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if name in before or not isinstance(origin, str):
            continue
        origin = os.path.realpath(origin)
        if origin.startswith(library) and not origin.startswith(run):
            found.append(name)
    try:
        with open(path + ".part", "w") as f:
            f.write("\n".join(sorted(found)))
        os.rename(path + ".part", path)
    except OSError:
        pass


def run_child(request: dict, fds: list[int], learned: str | None = None) -> NoReturn:
    """In the forked child: become `python SCRIPT ARGS` in the request's folder and environment,
    and end as python ends (`end`), naming in the folder `learned` the library modules it imported."""
    before, library_path = set(sys.modules), list(sys.path)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script, *args = request["argv"]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))  # as python puts the script's folder first
    if "numpy" in sys.modules:  # a fresh process draws numpy's global seed anew; `random` reseeds itself
        sys.modules["numpy"].random.seed()
    path = os.path.abspath(script)
    main = types.ModuleType("__main__")
    try:
        run_as_main(path, main)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # sys.exit("message"): printed, status 1
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # noqa: BLE001 - printed as python prints an uncaught exception
        frames = e.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename != path:  # from the script's own
            frames = frames.tb_next
        traceback.print_exception(type(e), e, frames or e.__traceback__)
        code = 1
    torch = sys.modules.get("torch")
    on_gpu = torch is not None and getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)()
    if learned is not None and not on_gpu:  # a GPU library may start CUDA as it is imported: no fork could use it then
        own = [request["cwd"], os.path.dirname(os.path.realpath(script))]
        name_imports(os.path.join(learned, str(os.getpid())), before, library_path, own)
    end(code, main)


def end(code: int, main: types.ModuleType) -> NoReturn:
    """End the child as python ends a script (its exit handlers run, then its globals are let go,
    so that a file it left open is flushed and closed), but without tearing down every module
    imported: that takes about a second with torch loaded, and nothing of the run's depends on it."""
    atexit._run_exitfuncs()
    main.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_as_main(path: str, main: types.ModuleType) -> None:
    """Run the script at `path` as python runs one: as the `__main__` module, its __file__ the
    absolute path (sys.argv[0] stays as the command gave it)."""
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    with tokenize.open(path) as source:  # in the encoding it declares, as python reads it
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


if __name__ == "__main__":
    del sys.path[0]  # this file's folder (mlrb/tasks): nothing of the harness is to be imported
    serve(sys.argv[1], sys.argv[2:])
