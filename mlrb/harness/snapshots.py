"""Per-step snapshots of the agent's workspace, as MLAgentBench keeps them, so that any
step can be scored after the run (`python -m mlrb.rescore RUN_ID --step N`).

After each step the files that differ from the workspace's starting state are stored
content-addressed (`objects/<sha256>`: a file unchanged since an earlier step, or
identical to another, costs nothing more), and one line per step goes to
`steps.jsonl`: `{"step": N, "changed": {path: sha256}, "deleted": [path], "too_large": {path: bytes},
"time": unix seconds, "agent_s": seconds, "notes": [line]}`. A step's workspace is its starting files
plus that line's changes; its times (when the snapshot was taken, the step's end, and where the agent's
wall-time clock stood then) place it on the anytime curves (mlrb/analysis/anytime.py). Lines written
before times were kept have none. `notes` (only when there are some) says what the walk left out
(mlrb/harness/workspace.py's caps, special files, unreadable files); files past the step's read budget
are named in `too_large`, as files too large to keep are.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import time
from pathlib import Path

from mlrb.core import disk
from mlrb.harness import workspace
from mlrb.harness.workspace import File, Notes, ReadBudget, Snapshot, walk

STEPS = "steps.jsonl"
OBJECTS = "objects"
# Files larger than this are named in a step's line but not kept (say, a checkpoint): those the
# workspace's snapshot knows by size and time.
MAX_FILE_BYTES = workspace.MAX_HASH_FILE_BYTES


class StepSnapshots:
    """The snapshot store of one run, in `root`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        # path -> (size, mtime_ns, sha256): a file not touched since the last step is not read again
        self._seen: dict[str, tuple[int, int, str]] = {}

    def take(self, step: int, work: Path, start: Snapshot, agent_s: float | None = None) -> dict:
        """Store what differs in `work` from its starting state `start`, as step `step`, with
        the agent's clock (`agent_s`, its budget's elapsed seconds) when given. A step whose state
        equals the previous one's is written as well (cheap: no new object). Bounded as
        mlrb/harness/workspace.py's walk is, and by its read budget: what is left out is in the line's notes."""
        (self.root / OBJECTS).mkdir(parents=True, exist_ok=True)
        notes = Notes(f"step {step}")
        budget = ReadBudget(workspace.MAX_READ_BYTES)
        changed: dict[str, str] = {}
        too_large: dict[str, int] = {}
        present = set()
        for file in walk(work, notes):
            present.add(file.rel)
            if file.size > MAX_FILE_BYTES:
                too_large[file.rel] = file.size
                continue
            try:  # work the agent left running may remove or rewrite a file meanwhile: skip it this step
                digest = self._keep(file, start.hashes.get(file.rel), budget)
            except OSError:
                notes.add(workspace.UNREADABLE, file.rel)
                continue
            if digest is None:
                notes.add(workspace.NOT_READ, file.rel)
                too_large[file.rel] = file.size
            elif digest != start.hashes.get(file.rel):
                changed[file.rel] = digest
        entry = {
            "step": step,
            "changed": changed,
            # (a starter file a capped walk did not reach is still there)
            "deleted": sorted(rel for rel in set(start.hashes) - present if not workspace.is_file_there(work, rel)),
            "too_large": too_large,
            "time": time.time(),
        }
        if agent_s is not None:
            entry["agent_s"] = agent_s
        if notes:
            entry["notes"] = notes.lines()
        with open(self.root / STEPS, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
        return entry

    def _keep(self, file: File, start_digest: str | None, budget: ReadBudget) -> str | None:
        """FILE's sha256, its object stored when it differs from the start; a file not touched since
        the last step is not read again. None when reading it would pass the read BUDGET."""
        known = self._seen.get(file.rel)
        if known and known[:2] == (file.size, file.mtime_ns) and not self._missing(known[2], start_digest):
            return known[2]
        if not budget.take(file.size):
            return None
        fd, info = workspace.open_file(file.path)
        try:
            digest = workspace.hash_fd(fd, info.st_size)
            self._seen[file.rel] = (file.size, file.mtime_ns, digest)
            if self._missing(digest, start_digest):
                self._store(fd, info.st_size, digest)
        finally:
            os.close(fd)
        return digest

    def _missing(self, digest: str, start_digest: str | None) -> bool:
        """Whether a file with DIGEST needs an object that is not stored yet."""
        return digest != start_digest and not (self.root / OBJECTS / digest).exists()

    def _store(self, fd: int, size: int, digest: str) -> None:
        """The object DIGEST, written whole or not at all (a full disk leaves no half object)."""
        blob = self.root / OBJECTS / digest

        def copy(part: Path) -> None:
            out = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                workspace.copy_bytes(fd, out, size)
            finally:
                os.close(out)

        disk.replace_whole(blob, blob.with_name(f"{digest}.part"), copy)

    def steps(self) -> list[dict]:
        return load_steps(self.root)


def load_steps(root: Path) -> list[dict]:
    """Every step's line, in order (the last line for a step taken twice wins)."""
    file = Path(root) / STEPS
    if not file.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in file.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            by_step[entry["step"]] = entry
    return [by_step[step] for step in sorted(by_step)]


def find_step(root: Path, step: int) -> dict | None:
    return next((entry for entry in load_steps(root) if entry["step"] == step), None)


def state_key(entry: dict) -> str:
    """Steps with the same key left the same workspace (scored once)."""
    return json.dumps([entry["changed"], entry["deleted"]], sort_keys=True)


def without(entry: dict, globs: list[str]) -> dict:
    """A step's line minus its changes to files matching `globs`: materialised, that step's
    workspace with those (read-only) files restored."""

    def kept(rel: str) -> bool:
        return not any(fnmatch.fnmatch(rel, pattern) for pattern in globs)

    return {**entry, "changed": {rel: sha for rel, sha in entry["changed"].items() if kept(rel)},
            "deleted": [rel for rel in entry["deleted"] if kept(rel)]}  # fmt: skip


def materialise(root: Path, entry: dict, start_files: Path, dest: Path) -> Path:
    """Rebuild a step's workspace in `dest` (replaced): the starting files, then the step's changes."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(start_files, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in entry["deleted"]:
        (dest / rel).unlink(missing_ok=True)
    for rel, digest in entry["changed"].items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        workspace.remove(target)  # a starter file, or a starter folder the agent made a file
        shutil.copyfile(Path(root) / OBJECTS / digest, target)
    return dest
