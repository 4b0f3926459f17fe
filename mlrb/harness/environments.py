"""A task's own Python environment: a venv of the requirements the task declares (a packaged
task's `requirements` in its config, a task folder's `requirements.txt`), built once into the
cache and shown to the agent, the anchors' runs and the task's own scoring scripts in place of
the harness's. It holds the task's libraries and not mlrb (nor anything else of the harness's).

A task that declares nothing runs on the harness's libraries, with mlrb itself hidden from
the agent (mlrb/sandbox/base.py harness_hidden).

    <cache>/environments/<key>/               the venv (venvs cannot move: it is built in place)
    <cache>/environments/<key>/mlrb-environment.json   written last: the requirements, what pip
                                                         installed (pip freeze) and the interpreter
    <cache>/environments/<key>.requirements.txt   what pip was asked to install
    <cache>/environments/<key>.log            pip's output of the last build

The key is the requirements' text and the interpreter's version and platform: pinned
requirements give the same environment on every machine of a kind. Building needs the package
index (PyPI or the user's pip configuration); `python -m mlrb.prefetch` builds ahead for
compute nodes without one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from mlrb.core.config import ConfigError

DONE = "mlrb-environment.json"
BUILD_TIMEOUT_S = 1800


def key(requirements: list[str]) -> str:
    interpreter = f"{platform.python_implementation()}-{platform.python_version()}-{platform.machine()}"
    text = json.dumps({"python": interpreter, "requirements": requirements})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def location(requirements: list[str], cache_dir: Path) -> Path:
    return Path(cache_dir).expanduser() / "environments" / key(requirements)


def is_built(root: Path) -> bool:
    return (root / DONE).is_file()


def ensure(task_name: str, requirements: list[str], cache_dir: Path) -> Path | None:
    """The environment's folder, built first if needed; None when the task declares no
    requirements (it runs on the harness's libraries). ConfigError (one line) if pip fails."""
    if not requirements:
        return None
    root = location(requirements, cache_dir)
    if is_built(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per key; the others wait and use it
        if not is_built(root):
            build(task_name, requirements, root)
    return root


def build(task_name: str, requirements: list[str], root: Path) -> None:
    """A fresh venv (from the interpreter the harness runs on, without its packages) with the
    requirements installed; nothing is left behind when it fails."""
    shutil.rmtree(root, ignore_errors=True)  # a build that was cut off
    log_file = root.with_suffix(".log")
    (root.parent / f"{root.name}.requirements.txt").write_text("\n".join(requirements) + "\n")
    steps = [
        [sys.executable, "-m", "venv", str(root)],
        [
            str(root / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "-r",
            str(root.parent / f"{root.name}.requirements.txt"),
        ],
    ]
    with open(log_file, "w") as log:
        for argv in steps:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            try:
                code = subprocess.run(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S
                ).returncode
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                shutil.rmtree(root, ignore_errors=True)
                why = f"took longer than {BUILD_TIMEOUT_S} s" if code is None else last_error(log_file)
                raise ConfigError(
                    f"{task_name}: its Python environment ({', '.join(requirements)}) could not be built: {why} "
                    f"(log: {log_file}). Without the package index, build it ahead with "
                    f"`python -m mlrb.prefetch` where pip can reach one (same cache folder)"
                )
    frozen = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    facts = {"requirements": requirements, "installed": frozen.split(), "python": platform.python_version()}
    (root / DONE).write_text(json.dumps(facts, indent=2))  # last: the build is whole


def last_error(log_file: Path) -> str:
    lines = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["(no output)"])[-1][:300]


def installed(root: Path) -> list[str]:
    """What pip installed into a built environment, pinned (name==version)."""
    return json.loads((root / DONE).read_text())["installed"]
