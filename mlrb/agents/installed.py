"""Agent programs from npm (Claude Code, Codex CLI), installed once per pinned version and
platform into the cache, `<paths.cache_dir>/agents/<package>@<version>-<platform>/`, and mounted
read-only into the run's sandbox with their `bin/` first on the agent's PATH.

    npm install --prefix <staging> <package>@<version>     then renamed into place

npm installs the build for the machine it runs on (a package's optional dependency per
platform), so the folder is per platform: a cache shared by x86-64 and Arm nodes holds both.
A binary's path in the package may name the platform: `{platform}` is npm's name for it
(linux-x64, linux-arm64, darwin-arm64...), `{triple}` the Rust target Codex is built for
(x86_64-unknown-linux-musl, aarch64-unknown-linux-musl...).

A folder in place is whole (the rename is the last step), so a second run, or a compute
node given the cache, uses it without npm. npm reaches the registry it is configured with.
"""

from __future__ import annotations

import fcntl
import os
import platform as platforms
import re
import shutil
import subprocess
from pathlib import Path

from mlrb.core.config import ConfigError

NPM_TIMEOUT_S = 900


ARCHES = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}  # machine -> npm's name
TRIPLES = {
    ("linux", "x64"): "x86_64-unknown-linux-musl",
    ("linux", "arm64"): "aarch64-unknown-linux-musl",
    ("darwin", "x64"): "x86_64-apple-darwin",
    ("darwin", "arm64"): "aarch64-apple-darwin",
}


def this_platform() -> tuple[str, str]:
    """(npm's platform name, the Rust target triple) of this machine."""
    system = "darwin" if os.uname().sysname == "Darwin" else os.uname().sysname.lower()
    arch = ARCHES.get(platforms.machine().lower(), platforms.machine().lower())
    return f"{system}-{arch}", TRIPLES.get((system, arch), f"{arch}-unknown-{system}")


def resolved(bins: dict[str, str]) -> dict[str, str]:
    """The binaries' paths in the package on this machine ({platform} and {triple} filled in)."""
    name, triple = this_platform()
    return {program: path.replace("{platform}", name).replace("{triple}", triple) for program, path in bins.items()}


def location(cache_dir: Path, spec: str) -> Path:
    folder = re.sub(r"[^A-Za-z0-9@._-]", "_", spec.lstrip("@"))
    return Path(cache_dir) / "agents" / f"{folder}-{this_platform()[0]}"


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
            raise ConfigError(
                f"agent {agent} needs {spec}, which is not in the cache ({root}), and npm is not on "
                "the PATH to install it: install Node.js and npm, or copy the folder from a machine "
                "that has it"
            )
        staging = root.with_name(f"{root.name}.installing-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", spec],
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                said = [line for line in (done.stderr + done.stdout).splitlines() if "ERR" in line] or ["no output"]
                raise ConfigError(f"agent {agent}: npm could not install {spec}: {said[0].strip()[:300]}")
            (staging / "bin").mkdir()
            for name, target in resolved(bins).items():
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
