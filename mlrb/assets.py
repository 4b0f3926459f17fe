"""Build a task's assets once and share them between runs.

Assets live in `<cache_dir>/<task>/<hash of what determines them>/`. Concurrent
runs of a sweep may ask for the same assets at once: one builds under a file
lock, into a temporary folder renamed into place when complete, so nobody ever
sees half-built assets; the others wait and reuse them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

from mlrb.tasks.base import Task

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def asset_dir(task: Task, cache_dir: Path) -> Path:
    key = json.dumps(task.asset_key(), sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir).expanduser() / task.name / f"{task.cfg.scale}-{digest}"


def ensure_assets(task: Task, cache_dir: Path) -> Path:
    target = asset_dir(task, cache_dir)
    if (target / MANIFEST).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / MANIFEST).exists():  # built by another run while we waited
            return target
        staging = target.parent / f"{target.name}.building"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        log.info("building %s assets (%s scale) in %s", task.name, task.cfg.scale, target)
        started = time.monotonic()
        facts = task.build_assets(staging)
        manifest = {"key": task.asset_key(), "build_seconds": round(time.monotonic() - started, 1), **facts}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        make_readable(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


def make_readable(root: Path) -> None:
    """Let any user read the assets: a container's unprivileged user reads them through
    read-only mounts (some writers, e.g. safetensors, create files as owner-only)."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
