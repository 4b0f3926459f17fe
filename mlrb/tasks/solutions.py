"""A task's solutions part: runs a solution's shell command (an anchor's, a known checkpoint's
training) the way the scripted baseline agent runs it, so that what the anchors measure at
asset build is what a run of that command would hand in.

Each run starts from a fresh copy of the task's starting files, in the agent's environment
(the public data at $MLRB_DATA, the run's seed at $MLRB_SEED, the task's own Python
environment), on one thread and with fixed hashing, so that an anchor does not depend on the
machine. With `warm()` (warm_python.py), a plain `python SCRIPT` command runs in a child of an
interpreter that has done the starter scripts' imports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mlrb.task_kit.warm_python import WarmPython, starter_imports


@dataclass(frozen=True)
class Solutions:
    # The files a solution's workspace starts from (the starter files; a folder task's prepared env/).
    starting_files: Path
    # The assets' public/ folder, the solution's $MLRB_DATA.
    public: Path
    # The task's own Python environment (mlrb/harness/environments.py); None: the harness's libraries.
    environment: Path | None = None

    def environment_for(self, workspace: Path, seed: int) -> dict[str, str]:
        """The environment of a solution's run: the agent's (a run's default seed is 0, as at
        asset build), on one thread, the hub offline unless HF_HUB_OFFLINE says otherwise."""
        from mlrb.sandbox.base import agent_environment

        env = agent_environment(str(workspace), str(Path(self.public).resolve()), seed, self.environment)
        env.update(
            HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"),
            HF_DATASETS_OFFLINE=os.environ.get("HF_DATASETS_OFFLINE", "1"),
            # Anchors must not depend on the machine's core count or on hash order.
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONHASHSEED="0",
        )
        return env

    def run(self, command: str, workspace: Path, seed: int = 0, warm: WarmPython | None = None) -> Path:
        """Run `command` in a fresh workspace at `workspace` (made from the starting files) at
        `seed`; with `warm`, a plain `python SCRIPT` runs in a child of that interpreter.
        Returns the workspace; raises RuntimeError with the command's error if it fails."""
        shutil.rmtree(workspace, ignore_errors=True)
        shutil.copytree(self.starting_files, workspace, ignore=shutil.ignore_patterns("__pycache__"))
        env = self.environment_for(workspace, seed)
        ran = warm.run(command, workspace, env) if warm else None
        if ran is None:
            proc = subprocess.run(
                ["/bin/bash", "-c", command],
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
            ran = proc.returncode, proc.stderr
        returncode, stderr = ran
        if returncode != 0:
            raise RuntimeError(f"`{command}` exited {returncode}: {stderr.strip()[-2000:]}")
        return workspace

    @contextlib.contextmanager
    def warm(self) -> Iterator[WarmPython]:
        """A warm interpreter for these solutions' runs: the task environment's python with the
        starter scripts' imports done, in a solution's environment."""
        with tempfile.TemporaryDirectory(prefix="mlrb-warm-") as scratch:
            env = self.environment_for(Path(scratch), 0)
            python = shutil.which("python", path=env["PATH"]) or sys.executable
            with WarmPython(python, env, starter_imports(self.starting_files), Path(scratch)) as warm:
                yield warm
