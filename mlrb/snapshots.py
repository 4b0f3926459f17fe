"""Per-step snapshots of the agent's workspace, as MLAgentBench keeps them, so that any
step can be scored after the run (`python -m mlrb.rescore RUN_ID --step N`).

After each step the files that differ from the workspace's starting state are stored
content-addressed (`objects/<sha256>`: a file unchanged since an earlier step, or
identical to another, costs nothing more), and one line per step goes to
`steps.jsonl`: `{"step": N, "changed": {path: sha256}, "deleted": [path], "too_large": {path: bytes},
"time": unix seconds, "agent_s": seconds}`. A step's workspace is its starting files plus that
line's changes; its times (when the snapshot was taken, the step's end, and where the agent's
wall-time clock stood then) place it on the anytime curves (mlrb/anytime.py). Lines written
before times were kept have none.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import time
from pathlib import Path

from mlrb.workspace import Snapshot, walk

STEPS = "steps.jsonl"
OBJECTS = "objects"
# Files larger than this are named in a step's line but not kept (say, a checkpoint).
MAX_FILE_BYTES = 256 * 1024 * 1024


class StepSnapshots:
    """The snapshot store of one run, in `root`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        # path -> (size, mtime_ns, sha256): a file not touched since the last step is not read again
        self._seen: dict[str, tuple[int, int, str]] = {}

    def take(self, step: int, workspace: Path, start: Snapshot, agent_s: float | None = None) -> dict:
        """Store what differs in `workspace` from its starting state `start`, as step `step`, with
        the agent's clock (`agent_s`, its budget's elapsed seconds) when given. A step whose state
        equals the previous one's is written as well (cheap: no new object)."""
        (self.root / OBJECTS).mkdir(parents=True, exist_ok=True)
        changed: dict[str, str] = {}
        too_large: dict[str, int] = {}
        present = set()
        for path, rel in walk(workspace):
            present.add(rel)
            try:  # work the agent left running may remove or rewrite a file meanwhile: skip it this step
                stat = path.stat()
                if stat.st_size > MAX_FILE_BYTES:
                    too_large[rel] = stat.st_size
                    continue
                digest = self._digest(path, rel, stat.st_size, stat.st_mtime_ns)
                blob = self.root / OBJECTS / digest
                if digest != start.hashes.get(rel) and not blob.exists():
                    shutil.copyfile(path, blob)
            except OSError:
                continue
            if digest != start.hashes.get(rel):
                changed[rel] = digest
        entry = {
            "step": step,
            "changed": changed,
            "deleted": sorted(set(start.hashes) - present),
            "too_large": too_large,
            "time": time.time(),
        }
        if agent_s is not None:
            entry["agent_s"] = agent_s
        with open(self.root / STEPS, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
        return entry

    def _digest(self, path: Path, rel: str, size: int, mtime_ns: int) -> str:
        known = self._seen.get(rel)
        if known and known[:2] == (size, mtime_ns):
            return known[2]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        self._seen[rel] = (size, mtime_ns, digest)
        return digest

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
        target.unlink(missing_ok=True)
        shutil.copyfile(Path(root) / OBJECTS / digest, target)
    return dest
