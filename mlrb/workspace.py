"""The agent's workspace: set it up from the task's starter files, and afterwards
say what the agent changed (a patch) and take its submission out of its reach."""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# Files larger than this, or not UTF-8, appear in the patch by size and hash only.
MAX_TEXT_DIFF_BYTES = 512_000


@dataclass
class Snapshot:
    """The workspace's starting state: every file's hash, and the text of text files."""

    hashes: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


def prepare(starter_dir: Path, workspace: Path) -> Snapshot:
    if workspace.exists() and any(workspace.iterdir()):
        raise FileExistsError(f"workspace {workspace} is not empty")
    workspace.mkdir(parents=True, exist_ok=True)
    if starter_dir.is_dir():
        shutil.copytree(starter_dir, workspace, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return snapshot(workspace)


def snapshot(root: Path) -> Snapshot:
    snap = Snapshot()
    for path, rel in walk(root):
        data = path.read_bytes()
        snap.hashes[rel] = hashlib.sha256(data).hexdigest()
        text = as_text(data)
        if text is not None:
            snap.texts[rel] = text
    return snap


def walk(root: Path):
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            yield path, path.relative_to(root).as_posix()


def as_text(data: bytes):
    if len(data) > MAX_TEXT_DIFF_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def diff(before: Snapshot, root: Path) -> str:
    """A unified diff of the workspace against its starting state (git-style headers)."""
    after = snapshot(root)
    chunks = []
    for rel in sorted(set(before.hashes) | set(after.hashes)):
        old_hash, new_hash = before.hashes.get(rel), after.hashes.get(rel)
        if old_hash == new_hash:
            continue
        old_text = before.texts.get(rel, "" if old_hash is None else None)
        new_text = after.texts.get(rel, "" if new_hash is None else None)
        header = f"diff --mlrb a/{rel} b/{rel}\n"
        if old_text is None or new_text is None:
            size = (root / rel).stat().st_size if new_hash else 0
            state = "added" if old_hash is None else "deleted" if new_hash is None else "changed"
            chunks.append(f"{header}Binary file {rel} {state} ({size} bytes, sha256 {new_hash or '-'})\n")
            continue
        lines = difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile="/dev/null" if old_hash is None else f"a/{rel}",
            tofile="/dev/null" if new_hash is None else f"b/{rel}",
        )
        body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        chunks.append(header + body)
    return "".join(chunks)


def restore_read_only(starter_dir: Path, workspace: Path, globs: list[str], before: Snapshot) -> list[str]:
    """Put back every starter file matching `globs` that the agent changed or removed."""
    restored = []
    for rel, digest in sorted(before.hashes.items()):
        if not any(fnmatch.fnmatch(rel, pattern) for pattern in globs):
            continue
        target = workspace / rel
        current = hashlib.sha256(target.read_bytes()).hexdigest() if target.is_file() else None
        if current != digest:
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(starter_dir / rel, target)
            restored.append(rel)
    return restored


def collect(workspace: Path, submission: str, dest: Path) -> bool:
    """Copy the submission ("." for the whole workspace) out of the workspace; False when there is none."""
    source = (workspace / submission).resolve()
    inside = workspace.resolve() in source.parents or (submission == "." and source == workspace.resolve())
    if not inside or not source.exists():
        return False
    if source.is_dir():
        # symlinks=True: a link planted in the submission is copied as a link, never followed.
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest, follow_symlinks=False)
    return True
