"""A task folder's asset builder's maker: `env/` and `scripts/` copied, `scripts/prepare.py`
run on the copy, then `public/` = the prepared env/ (the agent's starting workspace, also at
/data) and `hidden/` = the prepared scripts/ (only the scorer sees it); and the folder's
content key, by which its assets are cached."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

from mlrb.tasks.folder.scripts import FolderScripts, TaskFolderError, last_line

# Files larger than this enter the folder's content key by size and mtime, not by content.
HASH_LIMIT_BYTES = 64 * 1024 * 1024


def copy_and_prepare(scripts: FolderScripts, out_dir: Path, prepare_timeout_s: float) -> dict[str, Any]:
    """The folder's files, copied and prepared into out_dir; the manifest's facts."""
    folder, stage = scripts.folder, out_dir / "folder"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(folder / "env", stage / "env", symlinks=True, ignore=skip)
    shutil.copytree(folder / "scripts", stage / "scripts", symlinks=True, ignore=skip)
    if (stage / "scripts" / "prepare.py").is_file():
        prepare(scripts, stage / "scripts", prepare_timeout_s)
    (stage / "env").rename(out_dir / "public")
    (stage / "scripts").rename(out_dir / "hidden")
    stage.rmdir()
    return {"folder": str(folder)}


def prepare(scripts: FolderScripts, copied: Path, timeout_s: float) -> None:
    """scripts/prepare.py, run once from the copied scripts/ (it may write into ../env and into scripts/)."""
    try:
        proc = scripts.run(["prepare.py"], cwd=copied, home=copied, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        raise TaskFolderError(f"{scripts.folder}/scripts/prepare.py took longer than {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise TaskFolderError(f"{scripts.folder}/scripts/prepare.py exited {proc.returncode}: {last_line(proc.stderr)}")


def folder_digest(folder: Path) -> str:
    """A task folder's content key: a changed file gets the assets rebuilt."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        stat = path.stat()
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        if stat.st_size > HASH_LIMIT_BYTES:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
