"""What a Harbor task folder holds, and what mlrb reads of it: task.toml's limits (its field
names as Harbor's own TaskConfig has them), the Dockerfile's WORKDIR, and the image built from
environment/ (sandbox=docker)."""

from __future__ import annotations

import fcntl
import math
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mlrb.core.config import ConfigError
from mlrb.tasks.harbor import own_settings
from mlrb.tasks.harbor import steps as multi_step

TASK_TOML, INSTRUCTION, DOCKERFILE = "task.toml", "instruction.md", "environment/Dockerfile"
TEST, SOLVE = "tests/test.sh", "solution/solve.sh"
REQUIRED = (INSTRUCTION, TASK_TOML, DOCKERFILE, TEST)
REQUIRED_WITH_STEPS = (TASK_TOML, DOCKERFILE)  # each step brings its instruction (and its test.sh, or the task's)
AGENT_TIMEOUT_S = VERIFIER_TIMEOUT_S = 600.0  # Harbor's defaults
IMAGE_PREFIX = "mlrb-harbor-"
# Folders a WORKDIR cannot be the agent's workspace at: the root, the kernel's, and mlrb's own in
# its sandboxes (the data, the agent's state, the model bridge, the verifier's).
NOT_A_WORKSPACE = ("/proc", "/dev", "/sys", "/data", "/agent-state", "/run/mlrb", "/tests", "/logs")
# The host's folders that the bwrap sandbox shows read-only: no workspace can be made inside them there.
HOST_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@dataclass(frozen=True)
class Settings:
    agent_timeout_s: float
    verifier_timeout_s: float
    cpus: int | None  # Harbor allows a fraction: rounded up
    memory_gb: float | None
    gpus: int
    workdir: str  # [environment] workdir, else the Dockerfile's last WORKDIR ("": none)
    verifier_env: dict[str, str]  # [verifier] env: test.sh's variables
    solution_env: dict[str, str]  # [solution] env: solve.sh's
    agent_user: str  # [agent] user ("": the image's; Harbor's default, root)
    network_mode: str  # what the task asks of the agent's network ("": nothing)
    steps: tuple[multi_step.Step, ...] = ()  # [[steps]]: () for a task of one step
    reward_strategy: str = ""  # multi_step_reward_strategy ("mean" unless it says "final"; "": one step)


def check(path: str) -> Path:
    """The folder, checked: a ConfigError naming the first thing missing."""
    if not path:
        raise ConfigError("task.path is not set: give the Harbor task folder, e.g. task.path=/path/to/task")
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir() and any(char in path for char in "*?["):
        raise ConfigError(f"task.path '{path}' names several folders: run them as a sweep, with -m")
    if not folder.is_dir():
        raise ConfigError(f"task.path '{path}' is not a folder: give a Harbor task folder (instruction.md, task.toml)")
    if not (folder / TASK_TOML).is_file():
        raise ConfigError(f"Harbor task folder {folder} has no {TASK_TOML} (a Harbor task needs {', '.join(REQUIRED)})")
    settings = read_settings(folder)
    required = REQUIRED_WITH_STEPS if settings.steps else REQUIRED
    for rel in required:
        if not (folder / rel).is_file():
            raise ConfigError(f"Harbor task folder {folder} has no {rel} (a Harbor task needs {', '.join(required)})")
    multi_step.check_folder(folder, settings.steps)
    return folder


def read_settings(folder: Path) -> Settings:
    """task.toml's limits; a ConfigError naming the file and the bad value."""
    file = folder / TASK_TOML
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{file}: not valid TOML ({e})") from None
    agent, verifier, environment, solution = (
        table(data, file, name) for name in ("agent", "verifier", "environment", "solution")
    )
    own_settings.refuse_unsupported(data, file)
    verifier_env = own_settings.environment(verifier, "verifier", file, own_settings.VERIFIER_OWN)
    task_steps, strategy = multi_step.read(
        data, file, lambda values, where: own_settings.environment(values, where, file, own_settings.VERIFIER_OWN)
    )
    memory_mb = environment.get("memory_mb")
    if memory_mb is None and isinstance(environment.get("memory"), str):  # Harbor's older spelling, "2G"
        memory_mb = size_mb(environment["memory"], file)
    return Settings(
        agent_timeout_s=number(agent, "timeout_sec", None, file, "agent") or AGENT_TIMEOUT_S,
        verifier_timeout_s=number(verifier, "timeout_sec", None, file, "verifier") or VERIFIER_TIMEOUT_S,
        cpus=math.ceil(cpus) if (cpus := number(environment, "cpus", None, file, "environment")) else None,
        memory_gb=megabytes / 1024
        if (megabytes := number({"memory_mb": memory_mb}, "memory_mb", None, file, "environment"))
        else None,
        gpus=gpu_count(environment, file),
        workdir=str(environment.get("workdir") or dockerfile_workdir(folder / DOCKERFILE)),
        verifier_env=verifier_env,
        solution_env=own_settings.environment(solution, "solution", file),
        agent_user=own_settings.agent_user(agent, file),
        network_mode=own_settings.network_mode(data, file),
        steps=task_steps,
        reward_strategy=strategy,
    )


def workspace_at(workdir: str) -> str:
    """Where the agent's workspace appears for a WORKDIR ("": the sandbox's own /workspace, for
    none, the root, or one of the sandbox's own folders)."""
    folder = "/" + "/".join(part for part in workdir.split("/") if part not in ("", "."))
    if folder == "/" or ".." in folder.split("/") or within(folder, NOT_A_WORKSPACE):
        return ""
    return folder


def within(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def not_reproduced(dockerfile: Path, workdir: str) -> list[str]:
    """What of the Dockerfile a sandbox without its image cannot give the agent: its RUN steps, its
    ENV and USER, and what it copies outside the WORKDIR (environment/'s files are there)."""
    lines = dockerfile.read_text().replace("\\\n", " ").splitlines()  # a step continued on the next line: one
    found: list[str] = []
    for line in lines:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        step = words[0].upper()
        if step in ("RUN", "ENV", "USER", "ENTRYPOINT"):
            found.append(f"{step} {' '.join(words[1:])[:60]}")
        elif step in ("COPY", "ADD") and len(words) > 2:
            target = words[-1]
            if target.startswith("/") and not (workdir and within(target.rstrip("/") or "/", (workdir,))):
                found.append(f"{step} to {target}")
    return found


def image_files(image: str, workdir: str, home: Path) -> Path:
    """What the task's IMAGE holds at WORKDIR, copied out once per image into HOME/<image id>
    (beside the task's assets, under a lock: a sweep's jobs may start at once): the agent's
    starting files in the task's container."""
    image_id = docker("image", "inspect", "-f", "{{.Id}}", image).split(":")[-1][:16]
    kept = home / image_id
    if (kept / "done").exists():
        return kept / "files"
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (kept / "done").exists():
            return kept / "files"
        staging = home / "making"
        shutil.rmtree(staging, ignore_errors=True)
        (staging / "files").mkdir(parents=True)
        container = docker("create", "--entrypoint", "/bin/true", image).strip()
        try:
            docker("cp", f"{container}:{workdir}/.", str(staging / "files"))
        finally:
            docker("rm", "-f", container)
        (staging / "done").touch()
        shutil.rmtree(kept, ignore_errors=True)
        staging.rename(kept)
    return kept / "files"


def numeric_user(image: str, user: str) -> str:
    """USER as uid:gid, a name looked up in the task's IMAGE (its own /etc/passwd)."""
    if re.fullmatch(r"\d+(:\d+)?", user):
        return user if ":" in user else f"{user}:{user}"
    name = user.partition(":")[0]
    ids = [
        docker("run", "--rm", "--network", "none", "--entrypoint", "id", image, flag, name).strip()
        for flag in ("-u", "-g")
    ]
    return ":".join(ids)


def docker(*args: str) -> str:
    """A docker command's output; a ConfigError with its last line when it fails."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()] or ["(no output)"]
        raise ConfigError(f"docker {args[0]} failed: {last[-1].strip()[:300]}")
    return proc.stdout


def table(data: dict, file: Path, name: str) -> dict:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{file}: [{name}] must be a table, not {value!r}")
    return value


def number(values: dict, key: str, default: float | None, file: Path, where: str) -> float | None:
    value = values.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{file}: [{where}] {key} = {value!r}; it must be a positive number")
    return float(value)


def gpu_count(environment: dict, file: Path) -> int:
    """[environment] gpus: a whole number, 0 (Harbor's default) or more."""
    value = environment.get("gpus", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{file}: [environment] gpus = {value!r}; it must be a whole number, 0 or more")
    return value


def size_mb(text: str, file: Path) -> float:
    found = re.fullmatch(r"\s*([0-9.]+)\s*([GMK])\s*", text.upper())
    if not found:
        raise ConfigError(f"{file}: [environment] memory = {text!r}; write it as '2G' or '512M' (or memory_mb)")
    return float(found[1]) * {"G": 1024, "M": 1, "K": 1 / 1024}[found[2]]


def dockerfile_workdir(dockerfile: Path) -> str:
    """The Dockerfile's last absolute WORKDIR ("" when it has none)."""
    found = ""
    for line in dockerfile.read_text().splitlines() if dockerfile.is_file() else []:
        words = line.split()
        if len(words) == 2 and words[0].upper() == "WORKDIR" and words[1].startswith("/"):
            found = words[1]
    return found


def image_tag(folder: Path) -> str:
    name = re.sub(r"[^a-z0-9_.-]+", "-", folder.name.lower()).strip(".-") or "task"
    return f"{IMAGE_PREFIX}{name}:latest"


def build_image(folder: Path, timeout_s: float = 1800.0) -> str:
    """The task's image, built on this machine from environment/ (Docker's cache makes a second
    build quick); its tag. A build that fails is one ConfigError with Docker's last line."""
    tag = image_tag(folder)
    try:
        proc = subprocess.run(
            ["docker", "build", "-q", "-t", tag, str(folder / "environment")],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise ConfigError("sandbox=docker: the docker command is not installed (it builds the task's image)") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{folder / DOCKERFILE}: docker build took longer than {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()] or ["(no output)"]
        raise ConfigError(f"{folder / DOCKERFILE}: docker build failed: {last[-1].strip()[:300]}")
    return tag
