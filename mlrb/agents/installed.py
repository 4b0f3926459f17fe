"""Agent programs from npm (Claude Code, Codex CLI), installed once per pinned version into
the cache, `<paths.cache_dir>/agents/<package>@<version>/`, and mounted read-only into the
run's sandbox with their `bin/` first on the agent's PATH.

    npm install --prefix <staging> <package>@<version>     then renamed into place

A folder in place is whole (the rename is the last step), so a second run, or a compute
node given the cache, uses it without npm. npm reaches the registry it is configured with.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

from mlrb.config import ConfigError

NPM_TIMEOUT_S = 900


def location(cache_dir: Path, spec: str) -> Path:
    return Path(cache_dir) / "agents" / re.sub(r"[^A-Za-z0-9@._-]", "_", spec.lstrip("@"))


def is_installed(root: Path, bins: dict[str, str]) -> bool:
    return all((root / "bin" / name).exists() for name in bins)


def ensure(agent: str, spec: str, bins: dict[str, str], cache_dir: Path) -> Path:
    """The installed package's folder (installed now if it is not there); ConfigError in one
    line when it cannot be (no npm, a version the registry lacks, no binary where it should be)."""
    if not re.fullmatch(r"(@[\w.-]+/)?[\w.-]+@\d[\w.+-]*", spec):
        raise ConfigError(
            f"agent {agent}: install spec '{spec}' must name a package and its exact version (NAME@1.2.3)"
        )
    root = location(cache_dir, spec)
    if is_installed(root, bins):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install per version; the others wait and use it
        if is_installed(root, bins):
            return root
        npm = shutil.which("npm")
        if npm is None:
            raise ConfigError(f"agent {agent} needs {spec}, which is not in the cache ({root}), and npm is not on "
                              "the PATH to install it: install Node.js and npm, or copy the folder from a machine "
                              "that has it")  # fmt: skip
        staging = root.with_name(f"{root.name}.installing-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            done = subprocess.run([npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", spec],
                                  capture_output=True, text=True, timeout=NPM_TIMEOUT_S, stdin=subprocess.DEVNULL)  # fmt: skip
            if done.returncode != 0:
                said = [line for line in (done.stderr + done.stdout).splitlines() if "ERR" in line] or ["no output"]
                raise ConfigError(f"agent {agent}: npm could not install {spec}: {said[0].strip()[:300]}")
            (staging / "bin").mkdir()
            for name, target in bins.items():
                if not (staging / target).is_file():
                    raise ConfigError(
                        f"agent {agent}: {spec} installed, but it has no {target} (the binary for {name})"
                    )
                (staging / "bin" / name).symlink_to(Path("..") / target)
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"agent {agent}: npm install {spec} took over {NPM_TIMEOUT_S} s") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root
