"""The docker sandbox's image, built on first use.

`sandbox=docker` on a machine without the image builds it with docker/build.sh
(no registry needed), showing the script's steps as they happen. Where building
cannot work (no build script, no debootstrap and no base image, not root), it
stops with one line giving the exact command to run. Jobs of a sweep that start
together build it once: the others wait on a lock, then find it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from mlrb.core.config import ConfigError

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "build.sh"
BASE_IMAGE = "mlrb-base:bookworm"  # what build.sh makes with debootstrap when no BASE_IMAGE is given
LOCK = Path(os.environ.get("TMPDIR", "/tmp")) / "mlrb-sandbox-image.lock"
HEARTBEAT_S = 30


def build_command(image: str) -> str:
    prefix = "" if image == "mlrb-sandbox:latest" else f"IMAGE={image} "
    script = BUILD_SCRIPT if BUILD_SCRIPT.exists() else Path("docker/build.sh")
    return f"{prefix}bash {script}"


def why_not_buildable(client) -> str:
    """Why build.sh cannot run here ('' when it can)."""
    if not BUILD_SCRIPT.exists():
        return "the build script is not installed (it ships with the mlrb repository)"
    if has_image(client, BASE_IMAGE) or os.environ.get("BASE_IMAGE"):
        return ""
    if not shutil.which("debootstrap"):
        return "building its base needs debootstrap (apt-get install debootstrap)"
    if os.geteuid() != 0:
        return "building its base with debootstrap needs root"
    return ""


def has_image(client, image: str) -> bool:
    from docker.errors import DockerException

    try:
        client.images.get(image)
        return True
    except DockerException:
        return False


def ensure_image(image: str) -> None:
    """Build the sandbox image if it is missing; a dead daemon is left to the sandbox's own check."""
    from docker.errors import DockerException

    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException:
        return
    if has_image(client, image):
        return
    problem = why_not_buildable(client)
    if problem:
        raise ConfigError(
            f"sandbox=docker: image '{image}' not found and {problem}; build it with `{build_command(image)}`"
        )
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job may be building it right now
        if not has_image(client, image):
            build(image)


def build(image: str) -> None:
    command = build_command(image)
    print(f"mlrb: sandbox image '{image}' not found: building it now (first use; a few minutes): {command}", flush=True)
    started = time.monotonic()
    env = {**os.environ, "IMAGE": image}
    process = subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            print(f"mlrb: still building '{image}' ({time.monotonic() - started:.0f} s)", flush=True)

    threading.Thread(target=heartbeat, daemon=True).start()
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip())
        print(f"  {line.rstrip()}", flush=True)
    done.set()
    if process.wait() != 0:
        last = next((line for line in reversed(lines) if line.strip()), f"exit status {process.returncode}")
        raise ConfigError(f"sandbox=docker: building image '{image}' failed ({last}); run `{command}` to see why")
    print(f"mlrb: built '{image}' in {time.monotonic() - started:.0f} s", flush=True)
