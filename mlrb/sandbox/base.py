"""The sandbox interface: run a command, read and write files, in the run's workspace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mlrb.config import SandboxConfig


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False


class Sandbox(Protocol):
    #: The workspace and data folder as paths inside the sandbox.
    workspace: str
    data_dir: str

    def __init__(self, cfg: SandboxConfig, workspace: Path, data_dir: Path, run_id: str) -> None: ...

    def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run a shell command in the workspace; kill it (and its children) at the timeout."""
        ...

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...

    def close(self) -> None:
        """Stop everything still running in the sandbox."""
        ...
