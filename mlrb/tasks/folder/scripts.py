"""How a task folder's own scripts run (prepare.py, main.py, eval.py): on the task's Python,
in a child process, so the harness never imports a task's code, with the sandboxes'
allow-listed environment (no secrets), fixed hashing and threads, and nothing written into
the (read-only, hashed) assets."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mlrb.core.config import ConfigError
from mlrb.sandbox.base import sandbox_environment


class TaskFolderError(ConfigError):
    """The task folder itself is broken (its prepare.py, baseline or eval.py fails): found when
    its assets are built, before a run is recorded (`builds_at_preflight`), it is one line."""


@dataclass(frozen=True)
class FolderScripts:
    # The task folder, as the user named it (errors name its files).
    folder: Path
    # The interpreter the scripts run on, and the task's own environment it belongs to (None: the harness's).
    python: str
    environment: Path | None = None

    def env(self, home: Path) -> dict[str, str]:
        """The scripts' environment; the hub's offline flags stay the user's (a prepare.py may download)."""
        return sandbox_environment(
            str(home),
            {
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0",
                "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                "HF_DATASETS_OFFLINE": os.environ.get("HF_DATASETS_OFFLINE", "1"),
            },
            self.environment,
        )

    def run(self, args: list[str], cwd: Path, home: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """`python ARGS` in `cwd`; raises subprocess.TimeoutExpired past `timeout_s`."""
        return subprocess.run(
            [self.python, *args],
            cwd=cwd,
            env=self.env(home),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"
