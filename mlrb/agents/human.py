"""A human baseline (`agent=human`): a person works in the run's sandbox through a
terminal they attach to, under the run's budget clock, and the same scorer scores what they leave.

The harness starts a tmux server of the run's own, its socket in the run folder, whose one pane
runs an interactive bash inside the sandbox (`Sandbox.interactive_argv`: the workspace,
confinement and environment of an agent's commands), and says how to attach:

    tmux -S <run folder>/human/tmux.sock attach

The pane starts with the task's instructions (`instructions` shows them again); the prompt
shows the wall time left. The run ends `ok` when the person exits the shell, `budget_exhausted`
when the budget's wall time runs out (the harness ends the session). Recorded:
- each command line they run, as the run's events: a `shell` tool call with its result (exit
  status, duration, what it printed), all in the session's one step, as an outside agent's
  program is one step;
- the whole terminal as tmux saw it (`pipe-pane`), the run's artifact `agent/terminal.txt`.

How commands are seen: the shell's prompt hooks (PS0 once a command line is read, PROMPT_COMMAND
once it has run) print an escape sequence that terminals ignore (`ESC ] 777 ; mlrb ; ... BEL`),
which the harness reads from the transcript as tmux writes it: this works the same in every
sandbox kind, and puts nothing into the workspace.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from mlrb.agents.base import Agent, AgentContext, AgentOutcome
from mlrb.core import events
from mlrb.core.config import AgentConfig, ConfigError
from mlrb.core.status import Status
from mlrb.sandbox.base import MAX_CAPTURE_BYTES, SandboxError

log = logging.getLogger(__name__)

TOOL = "shell"
SESSION = "mlrb"
TERM = "screen"  # a terminal tmux emulates whose terminfo every system has (ncurses-base)
POLL_S = 0.5  # how often the transcript is read and the session checked (a tmux client each time)
START_TIMEOUT_S = 60  # for the shell to come up in the sandbox (a Docker exec, a bwrap namespace)
MAX_SOCKET_PATH = 100  # a unix socket's path must fit in sun_path (108 bytes with its NUL)
# What reaches the tmux server (and the host side of the pane's command) of the harness's
# environment: enough to find programs and the Docker daemon, never an API key.
TMUX_VARIABLES = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "DOCKER_HOST")

# Run inside the sandbox, in the pane: the shell's setup in a folder of its own outside the
# workspace (the private /tmp where confined), then the person's shell. $1: the instructions, $2: the rc.
LAUNCH = """folder=$(mktemp -d) || exit 1
printf '%s' "$1" > "$folder/instructions.md"
printf '%s' "$2" > "$folder/bashrc"
export MLRB_INSTRUCTIONS="$folder/instructions.md"
exec bash --noprofile --rcfile "$folder/bashrc" -i
"""

# The person's shell's rc. Its history stays in memory (HOME is the workspace: no history file
# there); each command line is marked before it runs (PS0: the time and its text) and after
# (PROMPT_COMMAND: the time and its exit status).
RC = r"""[ -r /etc/bash.bashrc ] && . /etc/bash.bashrc
unset HISTFILE
HISTCONTROL=
instructions() { cat "$MLRB_INSTRUCTIONS"; }
__mlrb_mark() { printf '\033]777;mlrb;%s;%s\007' "$1" "$2"; }
PS0='$(__mlrb_mark start "$EPOCHREALTIME;$(HISTTIMEFORMAT= history 1 | base64 -w0)")'
PROMPT_COMMAND='__mlrb_mark end "$EPOCHREALTIME;$?"'
PS1='[mlrb: $(( (MLRB_DEADLINE - EPOCHSECONDS + 59) / 60 )) min left] \w\$ '
instructions
printf '\n%s\n\n' "$MLRB_GREETING"
__mlrb_mark ready
"""

GREETING = (
    "You are in the run's sandbox, in its workspace. `instructions` shows the task again. "
    "Exit this shell (`exit` or Ctrl-D) when you are done; your workspace is then scored. "
    "At the end of the wall time ({left}) the session ends and it is scored as it is."
)

MARK_PREFIX = b"\x1b]777;mlrb;"
MARK = re.compile(rb"\x1b\]777;mlrb;(start|end|ready);([^\x07]*)\x07")
# Terminal control sequences, taken out of a command's output in its event (the transcript keeps them).
ESCAPES = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def tmux_binary() -> str:
    found = shutil.which("tmux")
    if found is None:
        raise ConfigError(
            "agent=human needs tmux on this machine (the person attaches to the run's terminal with it): "
            "install it (`apt-get install tmux`, `dnf install tmux`)"
        )
    return found


class HumanAgent(Agent):
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.check_config(cfg)

    @classmethod
    def check_config(cls, cfg: AgentConfig) -> None:
        if cfg.options:
            raise ConfigError(
                f"agent {cfg.name} (kind human) takes no options, got agent.options.{next(iter(cfg.options))}"
            )
        tmux_binary()

    def run(self, ctx: AgentContext) -> AgentOutcome:
        if ctx.run_dir is None:
            raise RuntimeError("agent=human needs the run's folder, for its terminal's socket and transcript")
        limit = ctx.budget.exhausted()
        if limit:
            return AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "no budget left before the session started")
        ctx.budget.record_step()
        step = ctx.budget.steps
        ctx.events.emit(events.StepStarted(step, ctx.budget.note()))
        commands = Commands(ctx.events, step)
        terminal = Terminal(ctx.run_dir)
        try:
            terminal.start(
                ctx.sandbox.interactive_argv(
                    ["bash", "-c", LAUNCH, "mlrb-human", ctx.instructions, RC], self.environment(ctx)
                )
            )
            log.info("agent=human: the session is open; attach with: %s", terminal.attach_command())
            started = time.monotonic()
            out_of_time = False
            while terminal.alive():
                commands.feed(terminal.read())
                if not commands.ready and time.monotonic() - started > START_TIMEOUT_S:
                    raise SandboxError(f"the shell did not start in the sandbox: {terminal.tail()}")
                if ctx.budget.remaining_s() <= 0:
                    out_of_time = True
                    break
                time.sleep(POLL_S)
        finally:
            terminal.close()  # the session ends, and the person's processes with it
        commands.feed(terminal.read())  # what it printed last
        if not commands.ready and not out_of_time:
            raise SandboxError(f"the shell did not start in the sandbox: {terminal.tail()}")
        commands.finish("[the session ended at the wall-time limit]" if out_of_time else "", is_error=out_of_time)
        if out_of_time:
            limit = ctx.budget.exhausted() or "wall_time"  # the wall time, or GPU-hours that reach theirs first
            outcome = AgentOutcome(Status.BUDGET_EXHAUSTED, limit, "the session ran out of time")
        else:
            outcome = AgentOutcome(Status.OK, None, f"the person exited the shell after {commands.count} command(s)")
            ctx.events.emit(events.Submitted(step, outcome.message))
        ctx.events.emit(events.StepEnded(step, dataclasses.asdict(outcome)))
        ctx.step_ended(step)
        return outcome

    @staticmethod
    def environment(ctx: AgentContext) -> dict[str, str]:
        """What the shell gets besides the sandbox's environment: its terminal, the deadline (for
        the prompt's time left) and the greeting."""
        left = ctx.budget.remaining_s()
        deadline = int(time.time() + left)
        greeting = GREETING.format(left=f"{left / 60:.0f} min" if left >= 60 else f"{left:.0f} s")
        return {"TERM": TERM, "MLRB_DEADLINE": str(deadline), "MLRB_GREETING": greeting}


class Terminal:
    """The run's tmux server: one session whose pane runs the person's shell, its output appended
    to the transcript by tmux itself."""

    def __init__(self, run_dir: Path):
        self.binary = tmux_binary()
        self.folder = run_dir / "human"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.socket = self.folder / "tmux.sock"
        self.short: Path | None = None  # a folder of its own under /tmp, where the run folder's path is too long
        if len(str(self.socket)) > MAX_SOCKET_PATH:
            self.short = Path(tempfile.mkdtemp(prefix="mlrb-human-"))
            self.socket = self.short / "tmux.sock"
        self.transcript = run_dir / "agent" / "terminal.txt"
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        self.transcript.touch()
        # how much of the transcript has been read: a resumed run's earlier attempts' is theirs
        self.offset = self.transcript.stat().st_size
        self.env = {name: os.environ[name] for name in TMUX_VARIABLES if name in os.environ}
        self.pane_pid: int | None = None

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [self.binary, "-S", str(self.socket), *args], env=self.env, capture_output=True, text=True, timeout=30
        )
        if check and result.returncode != 0:
            raise SandboxError(f"tmux {args[0]} failed: {result.stderr.strip()[-300:]}")
        return result

    def end_earlier_server(self) -> None:
        """A resumed run's earlier server (its harness was killed; tmux lives on) ends, and is
        gone before a new one starts on its socket: a new terminal on the same workspace."""
        if not self.socket.exists() or self.tmux("kill-server", check=False).returncode != 0:
            return
        deadline = time.monotonic() + 10
        while self.tmux("list-sessions", check=False).returncode == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.socket.unlink(missing_ok=True)

    def start(self, argv: list[str]) -> None:
        # The pane's command is a script (a command line this long, or with an argument that ends
        # in ';', is not safe among tmux's own arguments), exec'd: the pane's process is the sandbox's.
        script = self.folder / "shell.sh"
        script.write_text(f"exec {shlex.join(argv)}\n")
        self.end_earlier_server()
        # One tmux command line, so the transcript is piped before the pane's first output is read.
        self.tmux(
            "-f",
            os.devnull,
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            "160",
            "-y",
            "48",
            "/bin/sh",
            str(script),
            ";",
            "pipe-pane",
            "-O",
            "-t",
            SESSION,
            f"cat >> {shlex.quote(str(self.transcript))}",
        )
        shown = self.tmux("display-message", "-p", "-t", SESSION, "#{pane_pid}", check=False)
        if shown.returncode == 0 and shown.stdout.strip().isdigit():
            self.pane_pid = int(shown.stdout.strip())

    def attach_command(self) -> str:
        return f"tmux -S {shlex.quote(str(self.socket))} attach"

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", SESSION, check=False).returncode == 0

    def read(self) -> bytes:
        """What tmux has written to the transcript since the last read."""
        with open(self.transcript, "rb") as transcript:
            transcript.seek(self.offset)
            data = transcript.read()
        self.offset += len(data)
        return data

    def tail(self) -> str:
        text = ESCAPES.sub("", self.transcript.read_bytes()[-2000:].decode(errors="replace")).strip()
        return text.splitlines()[-1] if text else "(it printed nothing)"

    def close(self) -> None:
        """End the session (tmux hangs up the pane's processes), then kill what is left of the pane's
        process group; the sandbox's own close ends the rest."""
        self.tmux("kill-server", check=False)
        if self.pane_pid is not None:
            try:
                os.killpg(self.pane_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.socket.unlink(missing_ok=True)  # tmux leaves it behind
        if self.short is not None:
            shutil.rmtree(self.short, ignore_errors=True)


@dataclasses.dataclass
class OpenCommand:
    id: str
    started: float | None  # the shell's clock (seconds since the epoch)
    output: bytearray


class Commands:
    """The person's command lines, read from their terminal's output, as the run's events: a
    `shell` tool call when one starts, its result when it ends."""

    def __init__(self, sink: events.EventSink, step: int):
        self.sink, self.step = sink, step
        self.pending = b""  # the end of what was read, where a mark may be cut in two
        self.open: OpenCommand | None = None
        self.count = 0
        self.ready = False  # the shell has started in the sandbox

    def feed(self, data: bytes) -> None:
        data = self.pending + data
        done = 0
        for mark in MARK.finditer(data):
            self.printed(data[done : mark.start()])
            done = mark.end()
            kind, value = mark.group(1).decode(), mark.group(2).decode(errors="replace")
            when, _, value = value.partition(";")
            if kind == "ready":
                self.ready = True
            elif kind == "start":
                self.started(command_of(value), seconds(when))
            elif kind == "end" and self.open is not None:  # the first prompt, or an empty line: nothing ran
                self.ended(int(value) if value.isdigit() else None, "", value != "0", seconds(when))
        rest = data[done:]
        cut = rest.rfind(b"\x1b")
        tail = rest[cut:] if cut >= 0 else b""
        # A mark that the read cut in two (a base64 payload holds no ESC): kept for the next read.
        cut_mark = tail and b"\x07" not in tail and (MARK_PREFIX.startswith(tail) or tail.startswith(MARK_PREFIX))
        if cut_mark and len(tail) < MAX_CAPTURE_BYTES:
            self.pending, rest = tail, rest[:cut]
        else:
            self.pending = b""
        self.printed(rest)

    def printed(self, data: bytes) -> None:
        if self.open is not None and len(self.open.output) < MAX_CAPTURE_BYTES:
            self.open.output.extend(data[: MAX_CAPTURE_BYTES - len(self.open.output)])

    def started(self, command: str, when: float | None) -> None:
        if self.open is not None:  # a start with no end before it (a shell within the shell): ended unknown
            self.ended(None, "", False, when)
        self.count += 1
        self.open = OpenCommand(f"human-{self.count}", when, bytearray())
        # Started when the shell says: the harness reads the transcript a moment later.
        started_ns = int(when * 1e9) if when is not None else 0
        self.sink.emit(events.ToolStarted(self.step, TOOL, self.open.id, {"command": command}, started_ns))

    def ended(self, exit_code: int | None, note: str, is_error: bool, when: float | None) -> None:
        command, self.open = self.open, None
        if command is None:
            return
        output = "\n".join(filter(None, [screen_text(bytes(command.output)), note]))
        started, ended = command.started, when if when is not None else time.time()
        duration = max(0.0, ended - started) if started is not None else 0.0
        self.sink.emit(events.ToolEnded(self.step, TOOL, command.id, is_error, exit_code, duration, output))

    def finish(self, note: str, is_error: bool) -> None:
        """The session is over: a command still running (the shell's `exit`, or work the clock stopped)
        ends without an exit status."""
        self.ended(None, note, is_error, None)


def screen_text(output: bytes) -> str:
    """A command's output as its terminal showed it: no control sequences, and of a line rewritten
    in place (a progress bar) its last state."""
    text = ESCAPES.sub("", output.decode(errors="replace"))
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    return "\n".join(lines).strip("\n")


def seconds(value: str) -> float | None:
    """A time from the shell's $EPOCHREALTIME (its decimal point is the locale's)."""
    try:
        return float(value.replace(",", "."))
    except ValueError:
        return None


def command_of(encoded: str) -> str:
    """A command line from its mark: `history 1`'s line, base64, without its number."""
    try:
        line = base64.b64decode(encoded).decode(errors="replace")
    except ValueError:
        return ""
    return re.sub(r"^\s*\d+\*?\s+", "", line).rstrip("\n")
