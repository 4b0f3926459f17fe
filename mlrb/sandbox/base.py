"""The sandbox interface: run a command, read and write files, in the run's workspace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from mlrb.config import SandboxConfig


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

    cpus: Optional[float] = None
    memory_gb: Optional[float] = None
    gpus: int = 0
    network: bool = False


def limits_for(task, cfg: SandboxConfig) -> Limits:
    hw = task.spec.hardware
    return Limits(
        cpus=cfg.cpus if cfg.cpus is not None else hw.cpus,
        memory_gb=cfg.memory_gb if cfg.memory_gb is not None else hw.memory_gb,
        gpus=hw.gpus,
        network=task.cfg.network,
    )


def resolve_inside(root: Path, path: str, alias: str = "") -> Path:
    """Host path of `path` (relative, or absolute under `alias`, the workspace as the
    agent sees it); anything that leaves the workspace, links included, is refused."""
    if alias and (path == alias or path.startswith(alias.rstrip("/") + "/")):
        path = path[len(alias) :].lstrip("/") or "."
    resolved = (root / path).resolve()
    if resolved != root and root not in resolved.parents:
        raise PermissionError(f"{path} is outside the workspace")
    return resolved


class Sandbox(Protocol):
    #: The workspace and data folder as paths inside the sandbox.
    workspace: str
    data_dir: str

    def __init__(self, cfg: SandboxConfig, workspace: Path, data_dir: Path, run_id: str, limits: Limits) -> None: ...

    # Optional: `@classmethod preflight(cls, cfg: SandboxConfig) -> None` raising ConfigError
    # when the sandbox cannot work (say a dead Docker daemon); called before a run is recorded.

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run a shell command in the workspace; kill it (and its children) at the timeout."""
        ...

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...

    def close(self) -> None:
        """Stop everything still running in the sandbox."""
        ...
