"""The sandbox interface: every kind (bwrap, docker, unconfined) implements `Sandbox`.

A sandbox holds one run's agent: `exec` runs a shell command in its workspace,
`read_file`/`write_file` reach the workspace only, `close` ends every process the
agent started. `preflight` says before a run is recorded whether the kind can
work on this machine. `start_isolated` starts one command (the scorer) in a fresh
sandbox of the same kind that sees only the folders it is given (`run_isolated`:
started and waited for). `interactive_argv`, where a kind has it, is the command line of a
person's shell inside (agent=human).

Errors, as the agent loop sees them:
- a command that fails or times out is an `ExecResult`, never an exception;
- `read_file`/`write_file` raise PermissionError for paths outside the workspace,
  FileNotFoundError / IsADirectoryError as the file system does: tool errors the
  model is told about;
- `SandboxError` (and anything else) means the sandbox itself broke: an
  infrastructure failure of the run, not the agent's.
"""

from __future__ import annotations

import abc
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from omegaconf import OmegaConf

from mlrb.core.config import ConfigError, SandboxConfig, describe_omegaconf_error
from mlrb.models.endpoint import ModelEndpoint

#: Where the workspace and the task's public data appear inside confined sandboxes.
WORKSPACE, DATA = "/workspace", "/data"
STATE = "/agent-state"  # the agent's own state, kept across a run's attempts (mlrb/run_files/resume.py)
AGENT_UID = 1000
MAX_CAPTURE_BYTES = 1_000_000

# The only variables of the harness's environment that reach a sandbox.
# CUDA_VISIBLE_DEVICES: the run's own GPUs, as the launcher allocated them.
PASSED_VARIABLES = ("LANG", "LC_ALL", "TZ", "TERM", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, died): an infrastructure error."""


class SandboxStopped(SandboxError):
    """The sandbox was stopped from outside the run (SIGTERM to the job's processes: SLURM
    stopping or requeuing a job with no warning signal first): the run is not over, it goes on
    when its job runs again (mlrb/run_files/resume.py)."""


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


@dataclass
class Limits:
    """What the task at its scale asks of the machine, after the sandbox config's overrides."""

    cpus: float | None = None
    memory_gb: float | None = None
    gpus: int = 0
    network: bool = False


M = TypeVar("M")


@dataclass
class Mount:
    """A host folder or file shown inside a sandbox (at the same path unless `inside` is set);
    or, with `hides`, a folder or file of an earlier mount made empty and read-only there."""

    host: Path
    inside: str = ""
    writable: bool = False
    hides: bool = False

    @property
    def target(self) -> str:
        return self.inside or str(self.host)


def least_specific_first(mounts: list[M], target: Callable[[M], str]) -> list[M]:
    """Mounts in the order to apply them: a mount hides whatever an earlier one showed under
    its target, so a folder comes before anything mounted inside it (a writable run folder
    inside a read-only source tree stays writable, wherever the user runs from). Stable:
    mounts at one depth keep their order. `target` says where each one lands."""
    return sorted(mounts, key=lambda mount: len(Path(target(mount)).parts))


@dataclass
class IsolatedCommand:
    """One command in a fresh sandbox: what it sees, its environment, its limits."""

    argv: list[str]
    mounts: list[Mount]
    workdir: str
    env: dict[str, str]
    timeout_s: float
    log_file: Path
    limits: Limits = field(default_factory=Limits)
    run_id: str = ""
    # Run on what the run's agent left of its sandbox beyond its workspace (a Docker sandbox that
    # keeps its state: its container's file system), where the kind kept it; else as usual.
    on_agent_state: bool = False


# Inside a confined sandbox: the proxy's socket, the bridge to it, and the bridge's port on the
# sandbox's own loopback (mlrb/sandbox/model_bridge.py).
MODEL_SOCKET = "/run/mlrb/model.sock"
MODEL_BRIDGE = Path(__file__).with_name("model_bridge.py")
BRIDGE_INSIDE = "/run/mlrb/model_bridge.py"
COMMAND_LINE_CHARS = 200  # of a process left running, as the harness notes it
BRIDGE_PORT = 8787


class IsolatedProcess(abc.ABC):
    """A command started in a fresh sandbox (`Sandbox.start_isolated`). Closing it (also on
    leaving a `with` block) kills it if it still runs and frees what it held."""

    def hand_over(self, path: Path) -> None:
        """Make `path`, written under one of its writable mounts since the start, usable by the
        sandbox's user; needed only where that user is another one (Docker, as root)."""
        return None

    @abc.abstractmethod
    def wait(self, timeout_s: float) -> int | None:
        """Its exit code, or None once it has been killed at the timeout."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill it if it still runs; free what it held. Safe to call twice."""

    def __enter__(self) -> IsolatedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupProcess(IsolatedProcess):
    """A process of this host in a session of its own, killed as a group (the bwrap sandbox's
    own, or the unconfined scorer); `release` runs once it is gone."""

    def __init__(
        self,
        argv: list[str],
        job: IsolatedCommand,
        release: Callable[[], None] = lambda: None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ):
        self.release = release
        self.log = open(job.log_file, "wb")
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self.log.close()
            release()
            raise

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.close()
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            kill_group(self.proc.pid)
        self.proc.wait()
        self.log.close()
        release, self.release = self.release, lambda: None
        release()


def kill_group(pid: int) -> None:
    """SIGKILL the process group (session) that `pid` leads, if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def limits_for(task, cfg: SandboxConfig) -> Limits:
    hw = task.hardware
    return Limits(
        cpus=cfg.cpus if cfg.cpus is not None else hw.cpus,
        memory_gb=cfg.memory_gb if cfg.memory_gb is not None else hw.memory_gb,
        gpus=hw.gpus,
        network=task.rules.network,
    )


def held_hardware(cfg: SandboxConfig, limits: Limits, environ: Mapping[str, str] = os.environ) -> tuple[int, float]:
    """The GPUs and CPU cores a run's agent holds, for its compute's account (mlrb/core/compute.py):
    the GPUs it was given (gpus.given: sandbox.gpu_ids, else the task's count from its allocation)
    and the sandbox's CPU limit (sandbox.cpus, else the task's at its scale); with no CPU limit,
    every core this process may use."""
    from mlrb.sandbox.gpus import given

    cpus = limits.cpus if limits.cpus is not None else float(len(os.sched_getaffinity(0)))
    return given(cfg.gpu_ids, limits.gpus, environ), float(cpus)


def sandbox_environment(
    home: str, extra: dict[str, str] | None = None, task_environment: Path | None = None
) -> dict[str, str]:
    """The whole environment of anything run in a sandbox, from an allow-list: no variable
    of the harness (API keys, tokens, the tracking URI) reaches it. `python` on its PATH is the
    task's own environment's (mlrb/harness/environments.py), else the harness's."""
    env = {name: os.environ[name] for name in PASSED_VARIABLES if name in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    python_bin = Path(task_environment) / "bin" if task_environment else Path(sys.executable).parent
    env.update(
        PATH=f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        HOME=home,
        # The tiny tasks need nothing from the hub; full-scale assets are prepared beforehand.
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    env["MLRB_PATH"] = env["PATH"]  # what a login shell restores (docker/Dockerfile's /etc/profile.d)
    return env


def agent_environment(
    workspace: str, data_dir: str, seed: int, task_environment: Path | None = None, state_dir: str | None = None
) -> dict[str, str]:
    """MLRB_SEED is the run's seed, so that a script can draw its randomness from it (the
    tasks' baseline and reference commands pass it on as --seed): a sweep over seeds then
    measures their seed noise, as calibration does."""
    variables = {
        "MLRB_WORKSPACE": workspace,
        "MLRB_DATA": data_dir,
        "MLRB_SEED": str(seed),
        "MLRB_BUDGET_FILE": f"{workspace}/.mlrb_budget.json",  # what is left of its budget (mlrb/harness/agent_clock.py)
    }
    if state_dir is not None:  # a folder of its own kept across the run's attempts (mlrb/run_files/resume.py)
        variables["MLRB_STATE_DIR"] = state_dir
    return sandbox_environment(workspace, variables, task_environment)


def python_mounts() -> list[Mount]:
    """The harness's interpreter and venv, read-only at the same paths, so the sandbox
    has the same ML stack without installing anything into it."""
    return [Mount(Path(p)) for p in sorted({sys.prefix, sys.base_prefix})]


def task_environment_mounts(task_environment: Path | None) -> list[Mount]:
    """A task's own venv, read-only at its own path (its interpreter links to the base one,
    which python_mounts shows)."""
    return [Mount(Path(task_environment))] if task_environment else []


def harness_hidden() -> list[Mount]:
    """mlrb's own files in the venv that python_mounts shows, hidden from the agent: with
    `pip install .` the venv holds the whole harness (the asset builders would rebuild the
    hidden sets), with an editable one its finder, .pth and metadata. Only the scorer needs it."""
    return [Mount(Path(path), hides=True) for path in sorted(installed_harness())]


# What the agent's sandbox shows in place of a package of the harness: an __init__.py that refuses.
BLOCKED_PACKAGE = Path(__file__).with_name("blocked_package")


def shown_instead(mount: Mount) -> str | None:
    """What a hiding mount shows in place of what it hides: /dev/null for a file, for a package
    one whose import fails (an empty folder would import as a namespace package), None for
    another folder (an empty one, read-only)."""
    if not mount.host.is_dir():
        return os.devnull
    return str(BLOCKED_PACKAGE) if (mount.host / "__init__.py").exists() else None


@functools.cache
def installed_harness() -> frozenset[str]:
    """The highest folders and files of mlrb's installed distribution that hold nothing else
    (mlrb/ whole; in hydra_plugins/, a namespace it shares, only its own launcher's folder)."""
    import sysconfig
    from importlib import metadata

    # Installed in the venv, not a source tree's egg-info that the current folder may put first.
    venv_sites = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    dist = next(iter(metadata.distributions(name="mlrb", path=venv_sites)), None)
    if dist is None:
        return frozenset()
    site = os.path.normpath(str(dist.locate_file("")))
    owned = {os.path.normpath(str(dist.locate_file(f))) for f in dist.files or ()}
    roots = set()
    for path in owned:  # a compiled cache beside other packages' (site-packages/__pycache__) alone
        in_site = path.startswith(site + os.sep) and "__pycache__" not in path
        roots.add(highest_owned(path, site, owned) if in_site else path)
    return frozenset(r for r in roots if not any(r.startswith(other + os.sep) for other in roots))


def highest_owned(path: str, site: str, owned: set[str]) -> str:
    """The highest folder between site-packages and `path` whose files are all in `owned`
    (compiled caches aside), else `path` itself."""
    parts = Path(path).relative_to(site).parts
    for depth in range(1, len(parts)):
        folder = os.path.join(site, *parts[:depth])
        files = (os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)
        if all(f in owned or "__pycache__" in f for f in files):
            return folder
    return path


def resolve_inside(root: Path, path: str, alias: str = "") -> Path:
    """Host path of `path` (relative, or absolute under `alias`, the workspace as the
    agent sees it); anything that leaves the workspace, links included, is refused."""
    if alias and (path == alias or path.startswith(alias.rstrip("/") + "/")):
        path = path[len(alias) :].lstrip("/") or "."
    resolved = (root / path).resolve()
    if resolved != root and root not in resolved.parents:
        raise PermissionError(f"{path} is outside the workspace")
    return resolved


def agents_own(command_lines: list[str]) -> list[str]:
    """COMMAND_LINES without the harness's own processes in the sandbox (the model bridge), each cut
    to COMMAND_LINE_CHARS."""
    return [line.strip()[:COMMAND_LINE_CHARS] for line in command_lines if line.strip() and BRIDGE_INSIDE not in line]


LEFT_RUNNING = "processes the agent left running, killed at its end"  # the workspace note's start


def left_running_note(command_lines: list[str], most: int = 10) -> str:
    """The workspace note that names what the agent left running ("" for nothing)."""
    if not command_lines:
        return ""
    more = f"; and {len(command_lines) - most} more" if len(command_lines) > most else ""
    return f"{LEFT_RUNNING} ({len(command_lines)}): " + "; ".join(command_lines[:most]) + more


def command_line(pid: int) -> str:
    """The command line of this host's process PID ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def capped(data: bytes | bytearray) -> str:
    text = bytes(data[:MAX_CAPTURE_BYTES]).decode(errors="replace")
    if len(data) > MAX_CAPTURE_BYTES:
        text += f"\n[... output truncated at {MAX_CAPTURE_BYTES} bytes ...]"
    return text


class Sandbox(abc.ABC):
    """One run's sandbox. Subclasses set `kind`, `confined`, `options_class` and implement
    the abstract methods; `read_file`/`write_file` act on the host side of the workspace."""

    kind: ClassVar[str]
    #: Whether the agent is kept from the host (hidden data, keys, network, other processes).
    confined: ClassVar[bool]
    #: The dataclass that `sandbox.options` is checked against.
    options_class: ClassVar[type]
    #: Whether what runs inside sees only the run's GPUs, numbered from 0 (a container): then
    #: the host's CUDA_VISIBLE_DEVICES (say "5") would name a GPU it does not have, and is not passed.
    numbers_own_gpus: ClassVar[bool] = False

    #: The workspace and data folder as paths inside the sandbox.
    workspace: str
    data_dir: str

    #: Where agents inside reach the run's metering proxy (None: the sandbox was given none).
    model_url: str | None = None
    #: Why the harness stopped the agent's processes from outside (`stop`), once it has.
    stopped: str | None = None

    def __init__(
        self,
        cfg: SandboxConfig,
        workspace: Path,
        data_dir: Path,
        run_id: str,
        limits: Limits,
        seed: int = 0,
        task_environment: Path | None = None,
        model_endpoint: ModelEndpoint | None = None,
        agent_tools: Path | None = None,
        state_dir: Path | None = None,
        workspace_at: str = "",
    ):
        self.cfg = cfg
        # Where a confined kind shows the workspace (the task's own folder, say a Harbor task's
        # WORKDIR /app; "": WORKSPACE). An unconfined one shows the host's folder as it is.
        self.workspace_at = workspace_at or WORKSPACE
        self.options = self.parse_options(cfg)
        self.root = Path(workspace).resolve()
        self.host_data_dir = Path(data_dir).resolve()
        self.run_id = run_id
        self.limits = limits
        self.seed = seed
        self.task_environment = task_environment  # the task's own venv (read-only, first on PATH), or None
        self.model_endpoint = model_endpoint
        self.agent_tools = agent_tools  # an agent's programs (mlrb/agents/installed.py): read-only, same path
        self.state_dir = state_dir  # the agent's own state across the run's attempts: writable, at STATE
        self.killed_left: list[str] = []  # what a `whole_run` command left running, killed at its end

    @classmethod
    def parse_options(cls, cfg: SandboxConfig) -> Any:
        """`sandbox.options` as this kind's typed options; ConfigError names a bad key."""
        from omegaconf.errors import OmegaConfBaseException

        try:
            node = OmegaConf.merge(OmegaConf.structured(cls.options_class), cfg.options or {})
            return OmegaConf.to_object(node)
        except OmegaConfBaseException as e:
            raise ConfigError(describe_omegaconf_error(e, prefix="sandbox.options.")) from None

    @classmethod
    @abc.abstractmethod
    def preflight(cls, cfg: SandboxConfig) -> None:
        """Raise ConfigError (one line naming the fix) if this kind cannot work here.
        Called before the run is recorded."""

    @classmethod
    @abc.abstractmethod
    def start_isolated(cls, cfg: SandboxConfig, job: IsolatedCommand) -> IsolatedProcess:
        """Start `job` in a fresh sandbox, its output going to `job.log_file`; the caller waits
        for it and closes it."""

    @classmethod
    def run_isolated(cls, cfg: SandboxConfig, job: IsolatedCommand) -> int | None:
        """Run `job` to completion in a fresh sandbox; its exit code, or None at its timeout."""
        with cls.start_isolated(cfg, job) as process:
            return process.wait(job.timeout_s)

    @abc.abstractmethod
    def exec(self, command: str, timeout_s: float, whole_run: bool = False) -> ExecResult:
        """Run a shell command in the workspace; kill it (and its children) at the timeout, which
        `sandbox.command_timeout_s` caps unless the command is the agent's `whole_run` (the
        baseline's script, an outside agent's program: only the budget's wall time bounds it).
        A `whole_run` command's end is the agent's: every process it left is stopped or killed
        before this returns, so nothing of the agent works after it."""

    def stop(self, reason: str, meanwhile: Callable[[], None] | None = None) -> None:
        """End every process of the agent, from any thread, a command of it running or not (the
        harness enforcing a limit, say the workspace's disk): first all stand still, then MEANWHILE
        runs (say, removing what they wrote: nothing writes more meanwhile), then all are killed.
        A command under way returns as killed, and the sandbox runs nothing more; `close` still
        frees the rest. A kind that cannot hold them still first (the unconfined one) kills them,
        then runs MEANWHILE."""
        self.stopped = self.stopped or reason
        self.close()
        if meanwhile is not None:
            meanwhile()

    def processes_left(self) -> list[str]:
        """The command lines of the processes the agent left running, which its end kills: those a
        `whole_run` command left (killed as it ended), then those still running now (called at the
        agent's end, before `close`). The harness's own (the model bridge) are not the agent's. A
        kind that cannot see them says none."""
        return list(self.killed_left)

    def keep_state_now(self) -> None:
        """What the agent left outside its workspace, kept now for a scoring that runs on it (a
        Harbor step's verifier, mid-run) while the sandbox goes on; a kind whose scoring runs on the
        workspace alone keeps nothing."""
        return None

    def stopped_result(self, started: float) -> ExecResult:
        """What a command gets once the harness has stopped the sandbox."""
        return ExecResult(137, "", f"mlrb stopped the sandbox: {self.stopped}", time.monotonic() - started)

    def hold_still(self, still: bool) -> None:
        """Stop (True) or resume (False) every process the agent has in the sandbox, at once: while
        the harness's clock stands still (scoring mid-run), nothing of the agent runs. Called
        between the agent's steps, never while a command of it is being run; a closed sandbox
        has nothing to stop. A kind that cannot (the unconfined one) does nothing."""
        return None

    def interactive_argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The command line that, run on this host in a terminal (agent=human's tmux pane), runs
        `argv` inside the sandbox on that terminal: in the workspace, confined and with the
        environment as `exec`'s commands are, plus `env`. No timeout bounds it: whoever started it
        ends it, and closing the sandbox ends what it started inside (the unconfined kind aside).
        Optional for a kind: SandboxError where it has none, or cannot give one here."""
        raise SandboxError(f"sandbox={self.kind} has no interactive shell for a person (agent=human)")

    def confined_layout(self) -> tuple[list[Mount], dict[str, str]]:
        """For a sandbox that shows the agent paths of its own (bwrap, Docker): the workspace at
        `workspace_at` (WORKSPACE unless the task names its own folder; writable) and the data at
        DATA, as mounts (the harness's own files in the venv hidden), and the agent's environment there."""
        self.workspace, self.data_dir = self.workspace_at, DATA
        mounts = [Mount(self.root, self.workspace, writable=True), Mount(self.host_data_dir, DATA), *harness_hidden()]
        mounts += task_environment_mounts(self.task_environment)
        if self.model_endpoint is not None:
            mounts += [Mount(self.model_endpoint.socket, MODEL_SOCKET), Mount(MODEL_BRIDGE, BRIDGE_INSIDE)]
        if self.agent_tools is not None:
            mounts.append(Mount(Path(self.agent_tools)))
        if self.state_dir is not None:
            mounts.append(Mount(Path(self.state_dir), STATE, writable=True))
        return mounts, agent_environment(
            self.workspace, DATA, self.seed, self.task_environment, STATE if self.state_dir is not None else None
        )

    def start_model_bridge(self, python: str) -> None:
        """In a confined sandbox given a model endpoint: start the bridge to it in the background
        and set `model_url`; raise SandboxError when it does not come up."""
        log = "/tmp/mlrb-model-bridge.log"
        result = self.exec(
            f"nohup {python} -I -S {BRIDGE_INSIDE} {MODEL_SOCKET} {BRIDGE_PORT} > {log} 2>&1 & "
            f"for i in $(seq 200); do grep -q ready {log} 2>/dev/null && exit 0; sleep 0.05; done; cat {log}; exit 1",
            timeout_s=30,
        )
        if result.exit_code != 0:
            raise SandboxError(f"the model bridge did not start in the sandbox: {result.stdout.strip()[-300:]}")
        self.model_url = f"http://127.0.0.1:{BRIDGE_PORT}"

    def read_file(self, path: str) -> str:
        return resolve_inside(self.root, path, self.workspace).read_text(errors="replace")

    def write_file(self, path: str, content: str) -> None:
        target = resolve_inside(self.root, path, self.workspace)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process the agent started; the workspace stays for collection."""
