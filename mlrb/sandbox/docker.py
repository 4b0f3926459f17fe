"""Run the agent's commands in a locked-down container, one per run.

The container has no network (unless the task allows it), runs as an
unprivileged user with no way to gain privileges, has a read-only root
filesystem and only the workspace as a writable mount, sees the task's public
data read-only and nothing else of the host: not the hidden evaluation data,
not the scorer's code, not the harness's environment. CPU, memory and process
limits contain runaway commands. Containers carry labels naming their run and
the harness process that owns them, so those left by a crashed harness are
found and removed when the next run starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.core.config import ConfigError, SandboxConfig
from mlrb.models.endpoint import ModelEndpoint
from mlrb.sandbox.base import (
    AGENT_UID,
    MAX_CAPTURE_BYTES,
    ExecResult,
    IsolatedCommand,
    IsolatedProcess,
    Limits,
    Mount,
    Sandbox,
    SandboxError,
    agents_own,
    capped,
    least_specific_first,
    python_mounts,
    resolve_inside,
    shown_instead,
)

log = logging.getLogger(__name__)

# Docker labels on mlrb's containers: which run made one, and which harness process on which
# host, so that a later harness removes containers whose harness is gone.
LABEL = "mlrb.managed"
RUN_ID_LABEL = "mlrb.run_id"
ROLE_LABEL = "mlrb.role"
HOST_LABEL = "mlrb.harness_host"
PID_LABEL = "mlrb.harness_pid"
STATE_REPOSITORY = "mlrb-agent-state"  # the agent's container kept (keep_state): mlrb-agent-state:<run id>
# What a root user in a container with a writable file system needs to manage its files (Docker's
# default set has them; mlrb's containers drop every capability).
ROOT_FILE_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]


# A whole-run command's wrapper: once the command ends, kill(-1, SIGSTOP) stops every other
# process of the container's user in one step no fork slips past (stopped, not killed: the
# container's keeper stays, so the exec returns its exit status); the run then removes it.
WHOLE_RUN = '"$@"; code=$?; kill -STOP -1 2>/dev/null; exit $code'
# Every process of the container but its init, the keeper it started (`sleep infinity`) and this
# shell: a command line a line (what the agent left running, stopped or not).
LIST_PROCESSES = (
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
    'c=$(tr "\\0" " " < $d/cmdline 2>/dev/null); '
    '[ -z "$c" ] || [ "$c" = "sleep infinity " ] || echo "$c"; done'
)


@dataclass
class DockerOptions:
    # The image the agent's container runs (`bash docker/build.sh` builds the default one here).
    image: str = "mlrb-sandbox:latest"
    # "auto": 1000:1000 when the harness runs as root (the workspace is handed to that
    # user), else the harness's own uid:gid.
    user: str = "auto"
    # Docker network for tasks that allow network access (others get none).
    network_when_allowed: str = "bridge"
    # Mount the harness's Python (venv and interpreter) read-only, so the container
    # has the same ML stack without installing it into the image.
    mount_host_python: bool = True
    # The container's own file system writable, with the capabilities its root user needs to
    # manage files (a Harbor task's container: its agent installs what the task needs there).
    writable_root: bool = False
    # When the agent's container ends, its file system is kept as an image (docker commit), which
    # the run's own scoring of the submission then runs on (a Harbor verifier checks what the agent
    # installed and wrote anywhere in its container); removed once that scoring ends.
    keep_state: bool = False


def connect(options: DockerOptions):
    """A docker client that has answered a ping, or one clear ConfigError."""
    from docker.errors import DockerException

    import docker

    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as e:
        reason = str(e).split("\n")[0][:200]
        raise ConfigError(
            f"sandbox=docker: cannot reach the Docker daemon at {where} ({reason}); "
            "start it (e.g. `sudo systemctl start docker`) or use sandbox=bwrap"
        ) from None
    try:
        client.images.get(options.image)
    except DockerException:
        raise ConfigError(
            f"sandbox=docker: image '{options.image}' not found; build it with `bash docker/build.sh`"
        ) from None
    return client


def run_user(options: DockerOptions) -> str:
    if options.user != "auto":
        return options.user
    if os.geteuid() == 0:
        return f"{AGENT_UID}:{AGENT_UID}"
    return f"{os.getuid()}:{os.getgid()}"


def hand_over(path: Path, user: str) -> None:
    """Give the container's user a host folder (only possible, and only needed, as root)."""
    if os.geteuid() != 0:
        return
    uid, gid = (int(part) for part in user.split(":"))
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, uid, gid, follow_symlinks=False)


def bind_mounts(mounts: list[Mount]) -> list[Any]:
    """Docker's bind mounts, the least specific first (Docker sorts them too, but the order asked
    for is then the order applied), as Mount objects: a path may hold a colon or a space."""
    from docker.types import Mount as DockerMount

    return [docker_mount(DockerMount, m) for m in least_specific_first(mounts, lambda m: m.target)]


def docker_mount(DockerMount: Any, mount: Mount) -> Any:
    if not mount.hides:
        return DockerMount(target=mount.target, source=str(mount.host), type="bind", read_only=not mount.writable)
    instead = shown_instead(mount)
    if instead is None:  # an empty folder in its place, read-only
        return DockerMount(target=mount.target, source=None, type="tmpfs", read_only=True)
    return DockerMount(target=mount.target, source=instead, type="bind", read_only=True)


def gpu_request(cfg: SandboxConfig, limits: Limits, visible: str | None) -> list[Any]:
    """Docker device requests for the run's own GPUs, never "all" by default.

    Device ids come from sandbox.gpu_ids, else from the run's allocation
    ($CUDA_VISIBLE_DEVICES as set by the launcher or SLURM), first `limits.gpus` of them.
    """
    from docker.types import DeviceRequest

    if cfg.gpu_ids is not None:
        ids = [str(i) for i in cfg.gpu_ids]
    elif limits.gpus == 0:
        return []
    else:
        allocated = [d.strip() for d in (visible or "").split(",") if d.strip()]
        if len(allocated) < limits.gpus:
            raise ConfigError(
                f"the task needs {limits.gpus} GPU(s) but the run was allocated "
                f"{len(allocated)} (CUDA_VISIBLE_DEVICES={visible!r}); set sandbox.gpu_ids or launch on GPUs"
            )
        ids = allocated[: limits.gpus]
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])] if ids else []


def labels(run_id: str, role: str) -> dict[str, str]:
    return {
        LABEL: "true",
        RUN_ID_LABEL: run_id,
        ROLE_LABEL: role,
        HOST_LABEL: socket.gethostname(),
        PID_LABEL: str(os.getpid()),
    }


def container_options(
    cfg: SandboxConfig, limits: Limits, run_id: str, role: str, mounts: list[Mount]
) -> dict[str, Any]:
    """Everything asked of Docker for one container (kept pure so it can be checked)."""
    docker_options: DockerOptions = DockerSandbox.parse_options(cfg)
    host_python = python_mounts() if docker_options.mount_host_python else []
    options: dict[str, Any] = dict(
        image=docker_options.image,
        labels=labels(run_id, role),
        user=run_user(docker_options),
        network_mode=docker_options.network_when_allowed if limits.network else "none",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=not docker_options.writable_root,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"},
        pids_limit=cfg.pids_limit,
        init=True,  # reap zombies, forward signals
        mounts=bind_mounts(host_python + mounts),
        device_requests=gpu_request(cfg, limits, os.environ.get("CUDA_VISIBLE_DEVICES")),
        detach=True,
    )
    if docker_options.writable_root:
        options["cap_add"] = list(ROOT_FILE_CAPABILITIES)
    if limits.memory_gb:
        memory = f"{int(limits.memory_gb * 1024)}m"
        options.update(mem_limit=memory, memswap_limit=memory)  # no swap: a memory bomb is OOM-killed
    if limits.cpus:
        options["nano_cpus"] = int(limits.cpus * 1e9)
    return options


def remove_stale(client) -> list[str]:
    """Remove mlrb containers whose harness process on this host is gone."""
    from docker.errors import APIError

    removed = []
    host = socket.gethostname()
    # The listing's own fields, not each container inspected after it (as `containers.list` does):
    # one that another run removes meanwhile would fail the inspection.
    for container in client.api.containers(all=True, filters={"label": f"{LABEL}=true"}):
        info = container.get("Labels") or {}
        if info.get(HOST_LABEL) != host or pid_alive(int(info.get(PID_LABEL, "0"))):
            continue
        try:
            client.api.remove_container(container["Id"], force=True)
        except APIError as error:
            # Another run starting on this host beat us to it (404, or 409 while it removes).
            if getattr(error, "status_code", None) not in (404, 409):
                raise
            continue
        removed.append((container.get("Names") or [container["Id"]])[0].lstrip("/"))
    for image in client.api.images(filters={"label": f"{LABEL}=true"}):  # agents' states (keep_state) left behind
        info = image.get("Labels") or {}
        if info.get(HOST_LABEL) != host or pid_alive(int(info.get(PID_LABEL, "0"))):
            continue
        with contextlib.suppress(APIError):
            client.api.remove_image(image["Id"], force=True)
            removed.append(f"image {(image.get('RepoTags') or [image['Id']])[0]}")
    return removed


# Where a container's programs and libraries live: what the agent changes there, a verifier run on
# its kept state would run as its own (a Python package installed to dist-packages is not one).
SYSTEM_FOLDERS = (
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libexec",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/environment",
)
PACKAGE_FOLDERS = ("/dist-packages/", "/site-packages/")
STARTUP_FILES = ("sitecustomize.py", "usercustomize.py")  # what a Python runs as it starts, wherever it is
# What Docker itself puts in every container (init=True's init, the network's files), mounted in.
DOCKER_MADE = {"/usr/sbin/docker-init", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev", "/proc", "/sys"}
SHADOWING_FOLDERS = ("/usr/local/bin", "/usr/local/sbin")  # before the system's own on PATH
SHADOWED_FOLDERS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def system_tools_changed(changes: list[tuple[str, int]], exists: Callable[[str], bool]) -> list[str]:
    """Of a container's changes (docker diff: path, kind 0 changed, 1 added, 2 deleted), those
    that change the system's own programs: any file (not a folder, which lists what changed in
    it) under SYSTEM_FOLDERS but Python packages, a Python's start-up file, and a program added
    before the system's on PATH under a name that EXISTS there."""
    paths = [path for path, _ in changes]
    found = []
    for path, kind in changes:
        if any(other.startswith(path.rstrip("/") + "/") for other in paths):
            continue  # a folder
        if under(path, SYSTEM_FOLDERS) and not any(part in path for part in PACKAGE_FOLDERS):
            found.append(path)
        elif path.rsplit("/", 1)[-1] in STARTUP_FILES:
            found.append(path)
        elif kind == 1 and under(path, SHADOWING_FOLDERS):
            name = path.rsplit("/", 1)[-1]
            if any(exists(f"{folder}/{name}") for folder in SHADOWED_FOLDERS):
                found.append(path)
    return found


def made_for(path: str, mounted: set[str]) -> bool:
    """Whether Docker made PATH to mount something there (the mount point, or a folder above it)."""
    return path in mounted or any(target.startswith(path.rstrip("/") + "/") for target in mounted)


def under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def exists_in(container: Any, path: str) -> bool:
    from docker.errors import NotFound

    try:
        container.get_archive(path)
        return True
    except NotFound:
        return False


def state_image(run_id: str) -> str:
    """The image an agent's container is kept as (keep_state), named after its run."""
    return f"{STATE_REPOSITORY}:{(run_id or 'run').lower()}"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DockerSandbox(Sandbox):
    kind = "docker"
    confined = True
    numbers_own_gpus = True  # the device request gives the container the run's GPUs only
    options_class = DockerOptions

    @classmethod
    def preflight(cls, cfg: SandboxConfig) -> None:
        from mlrb.sandbox.docker_image import ensure_image  # builds a missing image on first use

        options = cls.parse_options(cfg)
        ensure_image(options.image)
        connect(options)

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
        mounts, environment = self.confined_layout()
        self.client = connect(self.options)
        remove_stale(self.client)  # containers of runs whose harness is gone
        self.user = run_user(self.options)
        hand_over(self.root, self.user)
        if state_dir is not None:  # the agent's own state across attempts: its to write
            hand_over(Path(state_dir), self.user)
        options = container_options(cfg, limits, run_id, "agent", mounts)
        environment.pop("CUDA_VISIBLE_DEVICES", None)  # see numbers_own_gpus
        self.container = self.client.containers.run(
            command=["sleep", "infinity"],
            working_dir=self.workspace,
            environment=environment,
            **options,
        )
        if model_endpoint is not None:
            try:
                self.start_model_bridge(sys.executable if self.options.mount_host_python else "python3")
            except SandboxError:
                self.close()
                raise

    def exec(self, command: str, timeout_s: float, whole_run: bool = False) -> ExecResult:
        timeout_s = max(0.1, timeout_s if whole_run else min(timeout_s, self.cfg.command_timeout_s))
        api = self.client.api
        started = time.monotonic()
        if self.stopped:
            return self.stopped_result(started)
        # `timeout` kills the command's whole process group inside the container at the limit.
        argv = ["timeout", "--signal=KILL", f"{timeout_s:.3f}s", "bash", "-c", command]
        if whole_run:  # the agent's end: the rest of its processes stopped before the exec returns
            argv = ["bash", "-c", WHOLE_RUN, "mlrb", *argv]
        exec_id = api.exec_create(self.container.id, argv, user=self.user, workdir=self.workspace)["Id"]
        out, err = bytearray(), bytearray()
        for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
            for buffer, chunk in ((out, chunk_out), (err, chunk_err)):
                if chunk and len(buffer) <= MAX_CAPTURE_BYTES:
                    buffer.extend(chunk)
        if self.stopped:  # what it printed until then, as a command killed
            result = self.stopped_result(started)
            return ExecResult(137, capped(out), capped(err) + "\n" + result.stderr, result.duration_s)
        exit_code = api.exec_inspect(exec_id)["ExitCode"]
        duration = time.monotonic() - started
        return ExecResult(
            exit_code=exit_code,
            stdout=capped(out),
            stderr=capped(err),
            duration_s=duration,
            timed_out=exit_code == 137 and duration >= timeout_s - 0.05,
        )

    def processes_left(self) -> list[str]:
        """Every process the container holds but its own (those a whole-run command left are
        there still, stopped), listed by a shell run in it."""
        from docker.errors import APIError

        if self.stopped:
            return []
        try:
            code, out = self.container.exec_run(["sh", "-c", LIST_PROCESSES], user=self.user)
        except APIError:
            return []
        return agents_own(out.decode(errors="replace").splitlines()) if code == 0 else []

    def stop(self, reason: str, meanwhile: Callable[[], None] | None = None) -> None:
        """From any thread: the container paused, MEANWHILE run, then its processes killed (the
        kill is delivered as it is unpaused: none runs on); a command under way returns killed.
        `close` removes it."""
        from docker.errors import APIError

        self.stopped = self.stopped or reason
        with contextlib.suppress(APIError):
            self.container.pause()
        if meanwhile is not None:
            meanwhile()
        with contextlib.suppress(APIError):
            self.container.kill()
        with contextlib.suppress(APIError):
            self.container.unpause()

    def hold_still(self, still: bool) -> None:
        """Docker's pause (the cgroup freezer) stops every process of the container at once; a
        container already gone has nothing to stop."""
        from docker.errors import APIError

        if self.stopped:
            return
        try:
            self.container.pause() if still else self.container.unpause()
        except APIError as e:
            if getattr(e, "status_code", None) not in (404, 409):  # removed, or not running any more
                raise SandboxError(f"docker {'pause' if still else 'unpause'} failed: {e}") from None

    def interactive_argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """`docker exec -it` into the run's container, as its user, in the workspace (the container
        has the sandbox's environment already); closing the sandbox removes the container and
        whatever still runs in it."""
        client = shutil.which("docker")
        if client is None:
            raise SandboxError("a shell in the docker sandbox needs Docker's command-line client, `docker`, on PATH")
        host = ["-H", os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
        variables = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
        where = ["-u", self.user, "-w", self.workspace]
        return [client, *host, "exec", "-it", *where, *variables, self.container.id, *argv]

    def write_file(self, path: str, content: str) -> None:
        target = resolve_inside(self.root, path, self.workspace)
        missing = [p for p in [target.parent, *target.parent.parents] if not p.exists()]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        for created in [target, *missing]:  # the agent must own what the harness wrote for it
            hand_over(created, self.user)

    def close(self) -> None:
        """Stop and remove the container; the workspace (a host folder) stays for collection. With
        keep_state, its file system is kept first as the run's state image (the workspace, a
        mount, is not in it: the run's copy of it is what scoring sees)."""
        from docker.errors import NotFound

        if self.options.keep_state and not getattr(self, "state_kept", False):
            self.state_kept = True
            self.keep_state()
        try:
            self.container.remove(force=True)
        except NotFound:
            pass

    def keep_state_now(self) -> None:
        """With keep_state, the container's file system as it is now (the agent held still, its
        container paused, as the harness scores mid-run): the state image a scoring on it runs on
        (and removes)."""
        if self.options.keep_state and not self.stopped:
            self.keep_state(unpause=False)

    def keep_state(self, unpause: bool = True) -> None:
        """The container's file system as the image state_image(run id), labelled as mlrb's (a
        later harness removes one whose harness is gone); a failure is a warning: scoring then runs
        on the task's image, where nothing the agent did outside its workspace counts."""
        from docker.errors import DockerException

        if unpause:
            with contextlib.suppress(DockerException):
                self.container.unpause()  # (stopped by the harness: paused, then killed)
        try:
            self.container.reload()
            mounted = {mount["Destination"] for mount in self.container.attrs.get("Mounts") or []} | DOCKER_MADE
            changed = [
                (entry["Path"], entry["Kind"])
                for entry in self.container.diff() or []
                if not made_for(entry["Path"], mounted)
            ]
            tools = system_tools_changed(changed, lambda path: exists_in(self.container, path))
        except DockerException as e:
            tools = [f"(docker diff failed: {str(e).splitlines()[0][:100]})"]
        if tools:  # scoring on them would run the agent's programs as the verifier's
            log.warning(
                "sandbox=docker: the agent changed the system's own programs (%s): its container is not "
                "kept, and it is scored on the task's image",
                ", ".join(tools[:10]),
            )
            return
        repository, _, tag = state_image(self.run_id).partition(":")
        try:
            self.container.commit(
                repository=repository, tag=tag, pause=False, conf={"Labels": labels(self.run_id, "agent-state")}
            )
        except DockerException as e:
            log.warning(
                "sandbox=docker: keeping the agent's container for scoring failed (%s): it is scored on "
                "the task's image",
                str(e).splitlines()[0][:200],
            )

    @classmethod
    def start_isolated(cls, cfg: SandboxConfig, job: IsolatedCommand) -> IsolatedProcess:
        """A fresh container that sees only `job.mounts`; the host paths are handed to its user."""
        options = cls.parse_options(cfg)
        user = run_user(options)
        for mount in job.mounts:
            if mount.writable:
                hand_over(mount.host, user)
        client = connect(options)
        run_options = container_options(cfg, job.limits, job.run_id, "scorer", job.mounts)
        state = state_image(job.run_id) if job.on_agent_state and options.keep_state else ""
        if state:
            from docker.errors import ImageNotFound

            try:
                client.images.get(state)
                run_options["image"] = state
            except ImageNotFound:
                log.warning(
                    "sandbox=docker: the agent's container was not kept (%s): scored on %s, where nothing "
                    "the agent did outside its workspace counts",
                    state,
                    options.image,
                )
                state = ""
        container = client.containers.run(command=job.argv, working_dir=job.workdir, environment=job.env, **run_options)
        return ContainerProcess(container, job.log_file, user, remove_image=state)


class ContainerProcess(IsolatedProcess):
    """A container started by `DockerSandbox.start_isolated`; its output is copied to the log
    once it has ended."""

    def __init__(self, container, log_file: Path, user: str, remove_image: str = ""):
        self.container, self.log_file, self.user = container, log_file, user
        self.remove_image = remove_image  # the agent's kept state it ran on: removed with it

    def hand_over(self, path: Path) -> None:
        hand_over(path, self.user)

    def wait(self, timeout_s: float) -> int | None:
        code: int | None
        try:
            code = self.container.wait(timeout=timeout_s).get("StatusCode")
        except Exception:  # requests' ReadTimeout / ConnectionError at the timeout
            self.container.kill()
            code = None
        self.log_file.write_bytes(self.container.logs(stdout=True, stderr=True))
        return code

    def close(self) -> None:
        from docker.errors import DockerException, NotFound

        try:
            self.container.remove(force=True)
        except NotFound:
            pass
        image, self.remove_image = self.remove_image, ""
        if image:
            with contextlib.suppress(DockerException):
                self.container.client.images.remove(image, force=True)
