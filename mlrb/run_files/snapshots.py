"""Per-step snapshots of the agent's workspace, as MLAgentBench keeps them, so that any
step can be scored after the run (`python -m mlrb.rescore RUN_ID --step N`). This module alone
reads and writes their format.

A run's snapshot store (`snapshots/` in its run folder) holds every content once, by its sha256:

- `steps.jsonl`: one line per step, `{"v": 2, "step": N, "tree": sha256 or null, "deleted": [path],
  "too_large": {path: bytes}, "time": unix seconds, "agent_s": seconds, "notes": [line], "took_s": seconds,
  "took_cpu_s": seconds}` (the last two: what taking the snapshot cost the harness);
- `trees/<sha256>`: the step's manifest, one folder of the files that differ from the workspace's
  starting state a file: `{name: ["f", sha256, bytes, mode] | ["d", tree sha256]}`; `tree` is the
  top folder's (null: nothing differs). A step that changed nothing names the same tree, and a change
  to one file writes only the folders on its path;
- `objects/<sha256>`: the content of a file up to SMALL_OBJECT_BYTES, `large/<sha256>` a larger
  one's (what the tracking store gets is `record.snapshots`: `recorded`).

A step's workspace is its starting files plus its tree's files, less `deleted`. Its times (when the
snapshot was taken, where the agent's wall-time clock stood) place it on the anytime curves
(mlrb/analysis/anytime.py). After each step only files whose size, times or inode changed since the
last step are read again. The submission is kept whatever its size; another file over MAX_FILE_BYTES,
or past the step's read budget, is named in `too_large` and in the line's `notes` (what the walk left
out: mlrb/run_files/workspace.py's caps, special files, unreadable files).

Objects are copies (a reflink where the file system has them), never hard links to the agent's
files: a program that rewrites a file in place (as torch.save does) would change the earlier step's
copy too. They are read-only, and a rebuilt workspace that nothing writes links to them (`link`).

Format 1, lines without `v` (runs before): `"changed": {path: sha256}` in the line itself, the objects
in `objects/`. Both are read (`changed_files`, `materialise`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlrb.core import disk
from mlrb.core.config import SNAPSHOT_RECORDS
from mlrb.run_files import workspace
from mlrb.run_files.workspace import File, Notes, ReadBudget, Snapshot, walk

VERSION = 2
STEPS = "steps.jsonl"
OBJECTS = "objects"
LARGE = "large"
TREES = "trees"
PARTS = "tmp"  # objects being written (renamed into place whole)
# A file that is not the submission and is larger than this is named in a step's line but not kept
# (say, a checkpoint beside the submission): the workspace's snapshot knows it by size and time.
MAX_FILE_BYTES = workspace.MAX_HASH_FILE_BYTES
# Objects up to this size go to objects/, larger ones to large/ (kept out of the tracking store by default).
SMALL_OBJECT_BYTES = 8 << 20
# What goes to the tracking store (`record.snapshots`): the manifests; with the small objects; everything.
RECORDED = SNAPSHOT_RECORDS
CHUNK = 1 << 20
ZEROS = bytes(CHUNK)
FICLONE = 0x40049409  # Linux's ioctl that makes a copy-on-write clone (btrfs, XFS; ext4 answers no)

NOT_KEPT = f"files over {MAX_FILE_BYTES >> 20} MiB that are not the submission, named but not kept"
NO_ROOM = "files not kept: the disk had no room for them"


class MissingObject(Exception):
    """A file a step's workspace needs whose content is not in this copy of the store."""

    def __init__(self, rel: str, digest: str, size: int | None):
        size_text = f"{size / (1 << 20):.0f} MiB" if size else "size unknown"
        super().__init__(
            f"{workspace.shown(rel)} ({size_text}, sha256 {digest[:12]}...) is not in this copy of the snapshots"
        )
        self.rel, self.digest, self.size = rel, digest, size


class StepSnapshots:
    """The snapshot store of one run, in `root`; SUBMISSION: the task's submission path ("." the
    whole workspace), kept whatever its size."""

    def __init__(self, root: Path, submission: str | None = None):
        self.root = Path(root)
        self.submission = submission
        # path -> (size, mtime_ns, ctime_ns, inode) as last read, and its sha256: not read again while unchanged
        self._seen: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._last: tuple[dict, str | None] | None = None  # the last step's changed files and its tree
        shutil.rmtree(self.root / PARTS, ignore_errors=True)  # what a killed attempt was writing

    def is_submission(self, rel: str) -> bool:
        sub = self.submission
        if sub is None:
            return False
        sub = sub.rstrip("/")
        return sub == "." or rel == sub or rel.startswith(sub + "/")

    def take(self, step: int, work: Path, start: Snapshot, agent_s: float | None = None) -> dict:
        """Store what differs in `work` from its starting state `start`, as step `step`, with
        the agent's clock (`agent_s`, its budget's elapsed seconds) when given; returns its line.
        Bounded as mlrb/run_files/workspace.py's walk is, and by its read budget (not the submission's
        files): what is left out is in the line's notes."""
        started, cpu = time.monotonic(), time.thread_time()
        for folder in (OBJECTS, LARGE, TREES, PARTS):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        notes = Notes(f"step {step}")
        budget = ReadBudget(workspace.MAX_READ_BYTES)
        changed: dict[str, list] = {}
        too_large: dict[str, int] = {}
        present = set()
        for file in walk(work, notes):
            present.add(file.rel)
            submitted = self.is_submission(file.rel)
            if file.size > MAX_FILE_BYTES and not submitted:
                too_large[file.rel] = file.size
                notes.add(NOT_KEPT, file.rel)
                continue
            try:  # work the agent left running may remove or rewrite a file meanwhile: skip it this step
                digest = self._keep(file, start.hashes.get(file.rel), None if submitted else budget)
            except OSError as e:
                notes.add(NO_ROOM if disk.is_full(e) else workspace.UNREADABLE, file.rel)
                too_large[file.rel] = file.size
                continue
            if digest is None:
                notes.add(workspace.NOT_READ if not submitted else NO_ROOM, file.rel)
                too_large[file.rel] = file.size
            elif digest != start.hashes.get(file.rel):
                changed[file.rel] = ["f", digest, file.size, file.mode]
        if self._last is not None and self._last[0] == changed:
            tree = self._last[1]  # nothing changed since the last step: its manifest again, nothing written
        else:
            tree = self._write_tree(changed)
        self._last = (changed, tree)
        entry: dict[str, Any] = {
            "v": VERSION,
            "step": step,
            "tree": tree,
            # (a starter file a capped walk did not reach is still there)
            "deleted": sorted(rel for rel in set(start.hashes) - present if not workspace.is_file_there(work, rel)),
            "too_large": too_large,
            "time": time.time(),
        }
        if agent_s is not None:
            entry["agent_s"] = agent_s
        if notes:
            entry["notes"] = notes.lines()
        entry["took_s"] = round(time.monotonic() - started, 4)  # the harness's own cost of the step
        entry["took_cpu_s"] = round(time.thread_time() - cpu, 4)
        disk.append_whole(self.root / STEPS, (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8"))
        return entry

    def _keep(self, file: File, start_digest: str | None, budget: ReadBudget | None) -> str | None:
        """FILE's sha256, its object stored when it differs from the start; a file not touched since
        the last step is not read again. None when reading it would pass the read BUDGET (None: no
        budget), or when the disk has no room for its object."""
        key = (file.size, file.mtime_ns, file.ctime_ns, file.inode)
        known = self._seen.get(file.rel)
        if known and known[0] == key:
            return known[1]
        if budget is not None and not budget.take(file.size):
            return None
        fd, info = workspace.open_file(file.path)
        try:
            digest = workspace.hash_fd(fd, info.st_size)
            if digest != start_digest and object_path(self.root, digest) is None:
                if not self._room_for(info.st_size):
                    return None
                digest = self._store(fd, info.st_size)
        finally:
            os.close(fd)
        self._seen[file.rel] = (key, digest)
        return digest

    def _room_for(self, size: int) -> bool:
        try:
            return disk.free_bytes(self.root) - disk.reserve_of(self.root) > size
        except OSError:
            return True

    def _store(self, fd: int, size: int) -> str:
        """FD's content as an object, written whole or not at all (a full disk leaves no half
        object); named by the digest of what was copied, so a file rewritten meanwhile is stored
        as it was read. Returns that digest."""
        part = self.root / PARTS / f"{os.getpid()}-{time.monotonic_ns()}"
        try:
            out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                digest = clone(fd, out, size)
            finally:
                os.close(out)
            blob = self.root / (OBJECTS if size <= SMALL_OBJECT_BYTES else LARGE) / digest
            os.chmod(part, 0o444)
            os.replace(part, blob)
        except OSError:
            part.unlink(missing_ok=True)
            raise
        return digest

    def _write_tree(self, changed: dict[str, list]) -> str | None:
        """The manifest of CHANGED written folder by folder; the top folder's digest (None: empty)."""
        if not changed:
            return None
        top: dict[str, Any] = {}
        for rel, item in changed.items():
            *folders, name = rel.split("/")
            node = top
            for folder in folders:
                child = node.setdefault(folder, {})
                if isinstance(child, list):  # (cannot happen: a path is a file or a folder, not both)
                    child = node[folder] = {}
                node = child
            node[name] = item
        return self._write_folder(top)

    def _write_folder(self, node: dict[str, Any]) -> str:
        items = {
            name: child if isinstance(child, list) else ["d", self._write_folder(child)] for name, child in node.items()
        }
        data = json.dumps(items, sort_keys=True, separators=(",", ":")).encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / TREES / digest
        if not path.exists():
            disk.replace_whole(path, self.root / PARTS / digest, lambda part: part.write_bytes(data))
        return digest

    def steps(self) -> list[dict]:
        return load_steps(self.root)


def clone(source: int, dest: int, size: int) -> str:
    """SOURCE's first SIZE bytes into DEST (empty): a copy-on-write clone where the file system makes
    one, else a copy; returns the sha256 of what DEST holds then."""
    try:
        fcntl.ioctl(dest, FICLONE, source)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EBADF, errno.ENOSYS):
            raise
    else:
        os.ftruncate(dest, min(size, os.fstat(dest).st_size))
        return workspace.hash_fd(dest, size)
    digest, offset = hashlib.sha256(), 0
    while offset < size:  # read once: hashed as it is written; a run of zeros left a hole, as a sparse file has
        chunk = os.pread(source, min(size - offset, CHUNK), offset)
        if not chunk:
            break
        digest.update(chunk)
        if chunk == ZEROS[: len(chunk)]:
            os.lseek(dest, len(chunk), os.SEEK_CUR)
        else:
            view = memoryview(chunk)
            while view:
                view = view[os.write(dest, view) :]
        offset += len(chunk)
    os.ftruncate(dest, offset)
    return digest.hexdigest()


def object_path(root: Path, digest: str) -> Path | None:
    """Where the object DIGEST is in the store at ROOT, or None."""
    for folder in (OBJECTS, LARGE):
        path = Path(root) / folder / digest
        if path.exists():
            return path
    return None


# ---- reading ------------------------------------------------------------------------------------


def load_steps(root: Path) -> list[dict]:
    """Every step's line, in order (the last line for a step taken twice wins)."""
    file = Path(root) / STEPS
    if not file.exists():
        return []
    by_step: dict[int, dict] = {}
    with open(file, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                entry = json.loads(line)
                by_step[entry["step"]] = entry
    return [by_step[step] for step in sorted(by_step)]


def files(root: Path, entry: dict) -> Iterator[tuple[str, str, int | None, int | None]]:
    """The files of a step's workspace that differ from its starting files: (path, sha256, bytes,
    mode), bytes and mode None for a format-1 line; those `without` took out left out."""
    skip = entry.get("skip", [])
    if entry.get("v", 1) < 2:
        items: Iterator[tuple[str, str, int | None, int | None]] = (
            (rel, digest, None, None) for rel, digest in entry["changed"].items()
        )
    else:
        items = tree_files(Path(root), entry["tree"], "") if entry["tree"] else iter(())
    for item in items:
        if not any(fnmatch.fnmatch(item[0], pattern) for pattern in skip):
            yield item


def tree_files(root: Path, digest: str, prefix: str) -> Iterator[tuple[str, str, int | None, int | None]]:
    pending = [(digest, prefix)]
    while pending:  # folder by folder, one read at a time (no recursion: a tree of any depth)
        tree, at = pending.pop()
        for name, item in sorted(json.loads((root / TREES / tree).read_bytes()).items()):
            if item[0] == "d":
                pending.append((item[1], f"{at}{name}/"))
            else:
                yield f"{at}{name}", item[1], item[2], item[3]


def changed_files(root: Path, entry: dict) -> dict[str, str]:
    """path -> sha256 of the step's files that differ from its starting files."""
    return {rel: digest for rel, digest, _, _ in files(root, entry)}


def state_key(entry: dict) -> str:
    """Steps with the same key left the same workspace (scored once)."""
    if entry.get("v", 1) < 2:
        return json.dumps([entry["changed"], entry["deleted"]], sort_keys=True)
    return json.dumps([entry["tree"], entry["deleted"], entry.get("skip", [])])


def without(entry: dict, globs: list[str]) -> dict:
    """A step's line minus its changes to files matching `globs`: materialised, that step's
    workspace with those (read-only) files restored."""

    def kept(rel: str) -> bool:
        return not any(fnmatch.fnmatch(rel, pattern) for pattern in globs)

    deleted = [rel for rel in entry["deleted"] if kept(rel)]
    if entry.get("v", 1) < 2:
        return {
            **entry,
            "changed": {rel: sha for rel, sha in entry["changed"].items() if kept(rel)},
            "deleted": deleted,
        }
    return {**entry, "deleted": deleted, "skip": sorted({*entry.get("skip", []), *globs})}


def materialise(root: Path, entry: dict, start_files: Path, dest: Path, link: bool = False) -> Path:
    """Rebuild a step's workspace in `dest` (replaced): the starting files, then the step's changes.
    LINK: the store's objects hard-linked where their mode allows (a workspace nothing will write:
    it is scored from a copy), else copied. Raises MissingObject for a content this store lacks."""
    root = Path(root)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(start_files, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in entry["deleted"]:
        (dest / rel).unlink(missing_ok=True)
    for rel, digest, size, mode in files(root, entry):
        source = object_path(root, digest)
        if source is None:
            raise MissingObject(rel, digest, size)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        workspace.remove(target)  # a starter file, or a starter folder the agent made a file
        if link and not (mode or 0) & 0o111:
            with contextlib.suppress(OSError):
                os.link(source, target)
                continue
        with open(source, "rb") as src, open(target, "wb") as out:
            clone(src.fileno(), out.fileno(), os.fstat(src.fileno()).st_size)
        if mode is not None:
            os.chmod(target, mode | 0o600)
    return dest


# ---- what the store needs and what goes to the tracking store ---------------------------------


def needed(root: Path) -> dict[str, int]:
    """sha256 -> bytes of every content some step's workspace holds (not its starting files): what
    the objects must keep for each step to be scored."""
    found: dict[str, int] = {}

    def add(digest: str, size: int | None) -> None:
        if digest not in found:
            path = object_path(root, digest)
            found[digest] = size if size is not None else (path.stat().st_size if path else 0)

    seen: set[str] = set()  # a folder's manifest, read once however many steps share it
    for entry in load_steps(root):
        if entry.get("v", 1) < 2:
            for _, digest, size, _ in files(root, entry):
                add(digest, size)
            continue
        pending = [entry["tree"]] if entry["tree"] else []
        while pending:
            tree = pending.pop()
            if tree in seen:
                continue
            seen.add(tree)
            for item in json.loads((Path(root) / TREES / tree).read_bytes()).values():
                if item[0] == "d":
                    pending.append(item[1])
                else:
                    add(item[1], item[2])
    return found


def recorded(root: Path, what: str) -> list[tuple[Path, str, bool]]:
    """What of the store at ROOT goes to the tracking store under `snapshots/` for `record.snapshots`
    = WHAT: (path, artifact folder, whether a folder). The rest stays in the run folder."""
    root = Path(root)
    parts = [(root / STEPS, "snapshots", False), (root / TREES, f"snapshots/{TREES}", True)]
    if what in ("small", "all"):
        parts.append((root / OBJECTS, f"snapshots/{OBJECTS}", True))
    if what == "all":
        parts.append((root / LARGE, f"snapshots/{LARGE}", True))
    return [
        (path, folder, is_dir)
        for path, folder, is_dir in parts
        if path.exists() and (not is_dir or any(path.iterdir()))
    ]
