"""Build a task's assets once, share them between runs, and check them before each use.

Assets live in `<cache_dir>/<task>/<hash of what determines them>/`. Concurrent
runs of a sweep may ask for the same assets at once: one builds under a file
lock, into a temporary folder renamed into place when complete, so nobody ever
sees half-built assets; the others wait and reuse them.

The manifest records the SHA-256 of every file. Each use checks them: a changed,
truncated, missing or added file gets the folder rebuilt; if that fails, an
`AssetError` names the file (an infrastructure error of the run, never the
agent's). The hash of that table is the assets' fingerprint, recorded on every run.

Hashing every file at every use costs as much as reading the assets: at full scale, GBs,
twice a run (as it starts and again before scoring), in every job of a sweep. So a full
check that finds the folder whole also records each file's size, times and inode beside
the folder (`<folder>.verified.json`, outside what a run mounts), and a later check whose
files all stat the same is done without reading them. Any write to a file, and `touch`
setting its time back, changes its ctime, which only the kernel sets: a changed file is
read again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import NamedTuple

from mlrb.harness import environments
from mlrb.tasks.base import Task
from mlrb.tasks.handling import asset_key, build_assets, in_environment

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
VERIFIED = ".verified.json"  # the suffix of the record of the last full check, beside the folder
# A file changed this recently is not recorded as checked: a write in the same tick of the file
# system's clock as the check would leave its times as they were (git's "racy" files).
RACY_S = 2.0


class AssetError(RuntimeError):
    """The cached assets are damaged and could not be rebuilt."""


def asset_dir(task: Task, cache_dir: Path) -> Path:
    key = json.dumps(asset_key(task), sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir).expanduser() / task.name / f"{task.scale}-{digest}"


class Prepared(NamedTuple):
    """What a run of a task needs built: its assets and its own Python environment."""

    path: Path  # the verified asset folder
    environment: Path | None  # the task's own Python environment (mlrb/harness/environments.py); None: the harness's


def ensure_assets(task: Task, cache_dir: Path) -> Path:
    """The task's verified asset folder, built (or rebuilt, if damaged) when needed (`prepare`)."""
    return prepare(task, cache_dir).path


def prepare(task: Task, cache_dir: Path) -> Prepared:
    """The task's own Python environment, built first (its anchors run in it), and its verified
    asset folder, built (or rebuilt, if damaged) when needed, by the task in that environment."""
    environment = environments.ensure(task.name, list(task.requirements), cache_dir)
    return Prepared(built(in_environment(task, environment), cache_dir), environment)


def built(task: Task, cache_dir: Path) -> Path:
    target = asset_dir(task, cache_dir)
    if intact(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        damage = problems(target)  # another run may have built or repaired it while we waited
        if not damage:
            return target
        if not (target / MANIFEST).exists():
            build(task, target)
            return target
        log.warning("%s assets in %s are damaged (%s); rebuilding them", task.name, target, "; ".join(damage[:3]))
        try:
            build(task, target)
        except Exception as e:
            raise AssetError(
                f"{task.name} assets in {target} are damaged ({damage[0]}) and could not be rebuilt: "
                f"{type(e).__name__}: {e}"
            ) from e
    return target


def build(task: Task, target: Path) -> None:
    staging = target.parent / f"{target.name}.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    log.info("building %s assets (%s scale) in %s", task.name, task.scale, target)
    started = time.monotonic()
    facts = build_facts(task, staging)
    make_readable(staging)
    files = file_hashes(staging)
    manifest = {
        "key": asset_key(task),
        "build_seconds": round(time.monotonic() - started, 1),
        **facts,
        "fingerprint": fingerprint_of(files),
        "files": files,
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    if target.exists():  # damaged: out of the way first, so the rename below is atomic
        damaged = target.parent / f"{target.name}.damaged"
        shutil.rmtree(damaged, ignore_errors=True)
        target.rename(damaged)
        shutil.rmtree(damaged, ignore_errors=True)
    staging.rename(target)


def build_facts(task: Task, staging: Path) -> dict:
    """Build (and calibrate) the assets. Calibration evaluates models on the scale's eval
    device; on a GPU that happens in a child process, so that this one (the harness, which
    lives for the whole run) never holds a CUDA context."""
    if not task.judge.device.startswith("cuda"):
        return build_assets(task, staging)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(build_assets, task, staging).result()


def file_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under root except the manifest (links by their target's text)."""
    hashes = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        if path.is_symlink():
            hashes[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            hashes[rel] = sha256_of(path)
    return hashes


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fingerprint_of(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def problems(target: Path) -> list[str]:
    """What is wrong with an asset folder (empty: nothing); each problem names its file."""
    manifest_file = target / MANIFEST
    if not manifest_file.exists():
        return ["not built"]
    try:
        expected = json.loads(manifest_file.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return [f"{MANIFEST} is unreadable or records no file hashes"]
    actual = file_hashes(target)
    found = []
    for rel in sorted(set(expected) | set(actual)):
        if rel not in actual:
            found.append(f"{rel} is missing")
        elif rel not in expected:
            found.append(f"{rel} was added")
        elif actual[rel] != expected[rel]:
            found.append(f"{rel} has changed (sha256 {actual[rel][:12]}, built as {expected[rel][:12]})")
    return found


def intact(target: Path) -> bool:
    """Whether the folder holds what its manifest records: at once when every file stats as it did
    at the last full check that found it whole (`problems`), else by that full check, which is
    then recorded when it finds nothing wrong."""
    record = target.parent / f"{target.name}{VERIFIED}"
    try:
        before = file_stats(target)  # before hashing: a file changed meanwhile is read again next time
    except OSError:
        return not problems(target)
    try:
        if json.loads(record.read_text()) == before:
            return True
    except (OSError, ValueError):
        pass
    if problems(target):
        return False
    if max((ctime for _, _, ctime, _ in before.values()), default=0) > time.time_ns() - RACY_S * 1e9:
        return True  # checked in full; recorded by a later check, once its files are no longer new
    staged = record.with_name(f"{record.name}.{os.getpid()}")
    try:
        staged.write_text(json.dumps(before))
        staged.replace(record)
    except OSError:  # a cache we may not write: checked in full each time, as before
        staged.unlink(missing_ok=True)
    return True


def file_stats(root: Path) -> dict[str, list[int]]:
    """Each file's (links' too) size, modification and change times and inode under root, the
    manifest included; {} for a folder that is not there."""
    if not root.is_dir():
        return {}
    stats = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode):
            stats[path.relative_to(root).as_posix()] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    return stats


def fingerprint(target: Path) -> str:
    """The fingerprint of a built asset folder (the hash of its file-hash table)."""
    return json.loads((target / MANIFEST).read_text())["fingerprint"]


def make_readable(root: Path) -> None:
    """Let any user read the assets: a container's unprivileged user reads them through
    read-only mounts (some writers, e.g. safetensors, create files as owner-only)."""
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
