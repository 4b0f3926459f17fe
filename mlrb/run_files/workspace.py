"""The agent's workspace: set it up from the task's starter files, and afterwards
say what the agent changed (a patch) and take its submission out of its reach.

Nothing the agent leaves there can break these: whatever it is, it can only make its own run
worse, never uncounted. Every walk goes folder by folder (`scan`: no recursion, no symbolic link
followed), stops at caps on files, depth and bytes read, and opens a file only as a regular
file (`open_file`: a FIFO swapped in cannot block it). What a cap, a special file or an
unreadable mode leaves out is a note (`Notes`), never an error.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import fnmatch
import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from mlrb.core import disk

# Files larger than this, or not UTF-8, appear in the patch by size and hash only.
MAX_TEXT_DIFF_BYTES = 512_000
# A walk's caps. 100,000 files is several workspaces holding a virtual environment and a data
# set, and a few seconds a walk (one is taken after every step: benchmarks/workspace_walk.py); past it, files are counted (up to
# MAX_ENTRIES entries looked at) and left out. 64 levels of folders is more than any project
# nests, and keeps a copy's paths within what the kernel and a recursive copy take.
MAX_FILES = 100_000
MAX_ENTRIES = 500_000
MAX_DEPTH = 64
# Files larger than this are known by their size and modification time, never read (a
# checkpoint; a sparse file of any size made in an instant).
MAX_HASH_FILE_BYTES = 256 << 20
# Bytes one walk reads in all to hash files; past it, files are known by size and time.
MAX_READ_BYTES = 2 << 30
# The patch's length; past it, changed files are counted, not shown.
MAX_PATCH_BYTES = 32 << 20
# A submission's copy in all: larger than any task's model, and never more than half the
# disk's free space less the harness's reserve (the scorer copies it once more).
MAX_SUBMISSION_BYTES = 64 << 30
NOTE_NAMES = 5  # paths a note names of each kind
NOTE_NAME_CHARS = 200  # a longer path is named by its start and end
UNREAD = "unread:"  # a file known by size and time: "unread:SIZE:MTIME_NS"

# What notes say, a kind a line.
SPECIAL = "special files (FIFOs, sockets, devices) left out"
TOO_DEEP = f"folders deeper than {MAX_DEPTH} levels left out"
UNREADABLE = "files or folders that could not be read, left out"
UNCOPIED = "files or folders that could not be copied, left out"
NOT_READ = f"files not read (known by size and time): the {MAX_READ_BYTES >> 30} GiB read budget was spent"
TOO_LARGE = (
    f"files too large to copy (past the submission's {MAX_SUBMISSION_BYTES >> 30} GiB cap or half "
    "the disk's free space), left out"
)
NOT_UTF8 = "names that are not UTF-8, shown with \\x escapes"
PATCH_CUT = "changed files not shown: the patch reached its size cap"


class Notes:
    """What one walk or copy of the workspace (WHERE: "the patch", "the submission") left out,
    cut or could not read: the agent's doing, so a note of its run, never an error. Each kind
    is counted, with its first few paths."""

    def __init__(self, where: str):
        self.where = where
        self.counts: dict[str, int] = {}
        self.names: dict[str, list[str]] = {}
        self.sentences: list[str] = []

    def add(self, kind: str, rel: str | None = None, count: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + count
        names = self.names.setdefault(kind, [])
        if rel is not None and len(names) < NOTE_NAMES:
            name = shown(rel)
            names.append(name if len(name) <= NOTE_NAME_CHARS else f"{name[:80]}...{name[-80:]}")

    def say(self, sentence: str) -> None:
        self.sentences.append(sentence)

    def lines(self) -> list[str]:
        lines = [f"{self.where}: {sentence}" for sentence in self.sentences]
        for kind, count in self.counts.items():
            names = self.names[kind]
            listed = f" ({', '.join(names)}{', ...' if count > len(names) else ''})" if names else ""
            lines.append(f"{self.where}: {kind}: {count}{listed}")
        return lines

    def __bool__(self) -> bool:
        return bool(self.counts or self.sentences)


def shown(rel: str) -> str:
    """REL as text that is always UTF-8: the bytes of a name that are not UTF-8 (Python holds them
    as surrogate escapes, which no UTF-8 writer takes) as \\xNN."""
    if rel.isascii():
        return rel
    try:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")
    except UnicodeError:
        return rel.encode("utf-8", "backslashreplace").decode("utf-8")


# ---- walking -----------------------------------------------------------------------------


# The harness's file of what is left of the agent's budget, at the workspace's top (mlrb/harness/agent_clock.py),
# and the new copy it writes first and renames over it: the only files of the harness's in the workspace.
BUDGET_FILE = ".mlrb_budget.json"
BUDGET_PART = BUDGET_FILE + ".part"
HARNESS_FILES = frozenset({BUDGET_FILE, BUDGET_PART})


def scan(root: Path, notes: Notes, skip: frozenset[str] = frozenset()) -> Iterator[tuple[os.DirEntry[str], str]]:
    """Every entry under ROOT with its path relative to it, each folder before what it holds,
    read folder by folder (one open at a time), never following a symbolic link; entries named
    in SKIP left out. At most MAX_FILES entries that are not folders, and folders down to
    MAX_DEPTH levels; what is left out is counted in NOTES, up to MAX_ENTRIES entries looked at."""
    pending = [("", 1)]  # a folder's path relative to ROOT ("" or ending in "/"), and its entries' depth
    files = looked_at = left_out = 0
    while pending:
        prefix, depth = pending.pop()
        try:
            with os.scandir(os.path.join(root, prefix)) as entries:
                for entry in entries:
                    looked_at += 1
                    if looked_at > MAX_ENTRIES:
                        notes.say(f"stopped looking after {MAX_ENTRIES} entries: more files may be left out, uncounted")
                        pending.clear()
                        break
                    if entry.name in skip:
                        continue
                    rel = prefix + entry.name
                    folder = is_folder(entry)
                    if folder is None:
                        notes.add(UNREADABLE, rel)
                    elif folder and depth > MAX_DEPTH:
                        notes.add(TOO_DEEP, rel)
                    elif folder:
                        pending.append((rel + "/", depth + 1))
                        if files < MAX_FILES:
                            yield entry, rel
                    elif files < MAX_FILES:
                        files += 1
                        yield entry, rel
                    else:
                        left_out += 1
        except OSError:
            notes.add(UNREADABLE, prefix.rstrip("/") or ".")
    if left_out:
        notes.add(f"files past the first {MAX_FILES} left out", count=left_out)


def is_folder(entry: os.DirEntry[str]) -> bool | None:
    """Whether ENTRY is a folder (a link to one is not); None when it cannot be told."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return None


class File(NamedTuple):
    """A regular file a walk found: its path, its path relative to the walk's root, as it was then
    (its change time and inode too: a content rewritten with its old modification time put back
    still changes them)."""

    path: str
    rel: str
    size: int
    mtime_ns: int
    ctime_ns: int = 0
    inode: int = 0
    mode: int = 0o644


def walk(root: Path, notes: Notes | None = None) -> Iterator[File]:
    """Every regular file under ROOT, bounded as `scan` is, but the harness's own (HARNESS_FILES,
    at the top, by their exact names) and Python's compiled caches of source files that are there
    (`is_compiled_cache`): everything else the agent wrote is seen, whatever its name. Symbolic
    links are no files of the workspace (skipped); FIFOs, sockets and devices are noted."""
    notes = notes if notes is not None else Notes(str(root))
    for entry, rel in scan(root, notes):
        if rel in HARNESS_FILES or is_compiled_cache(root, rel):
            continue
        try:
            if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
        except OSError:
            notes.add(UNREADABLE, rel)
            continue
        if stat.S_ISREG(info.st_mode):
            yield File(
                entry.path,
                rel,
                info.st_size,
                info.st_mtime_ns,
                info.st_ctime_ns,
                info.st_ino,
                stat.S_IMODE(info.st_mode),
            )
        else:
            notes.add(SPECIAL, rel)


def is_compiled_cache(root: Path, rel: str) -> bool:
    """Whether REL is bytecode Python compiled from a source file beside it: FOLDER/__pycache__/NAME.TAG.pyc
    with FOLDER/NAME.py there. A compiled file with no source is code of the agent's like any other."""
    parts = rel.rsplit("/", 2)
    if len(parts) < 2 or parts[-2] != "__pycache__" or not parts[-1].endswith(".pyc"):
        return False
    source = "/".join([*parts[:-2], parts[-1].split(".", 1)[0] + ".py"])
    return is_file_there(root, source)


def is_file_there(root: Path, rel: str) -> bool:
    """Whether ROOT/REL is a regular file (a starter file a capped walk did not reach is not deleted)."""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(root, rel)).st_mode)
    except OSError:
        return False


# ---- reading files -----------------------------------------------------------------------


def open_file(path: str | Path) -> tuple[int, os.stat_result]:
    """A descriptor of PATH open for reading, and its status, if PATH is a regular file: a
    symbolic link is not followed, a FIFO does not block the open; anything else raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_upto(fd: int, size: int) -> bytes:
    """At most SIZE bytes of FD (a file that grows meanwhile is not followed)."""
    chunks = []
    while size > 0:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def hash_fd(fd: int, size: int) -> str:
    """The sha256 of FD's first SIZE bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
        if not chunk:
            break
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def copy_bytes(source: int, dest: int, size: int) -> None:
    """SOURCE's first SIZE bytes written to DEST, in the kernel where it can."""
    offset = 0
    try:
        while offset < size:
            sent = os.sendfile(dest, source, offset, min(size - offset, 1 << 30))
            if sent == 0:
                return
            offset += sent
        return
    except OSError as e:
        if offset or e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
            raise
    while offset < size:  # sendfile cannot write to DEST here (not Linux): through memory
        chunk = memoryview(os.pread(source, min(size - offset, 1 << 20), offset))
        if not chunk:
            return
        offset += len(chunk)
        while chunk:
            chunk = chunk[os.write(dest, chunk) :]


class ReadBudget:
    """Bytes a walk or a copy may still take."""

    def __init__(self, total: int):
        self.left = total

    def take(self, size: int) -> bool:
        if size > self.left:
            return False
        self.left -= size
        return True


def as_text(data: bytes) -> str | None:
    if len(data) > MAX_TEXT_DIFF_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_text(path: str, size: int) -> str | None:
    """The text of the regular file PATH; None when it is binary, too large or unreadable."""
    if size > MAX_TEXT_DIFF_BYTES:
        return None
    try:
        fd, info = open_file(path)
    except OSError:
        return None
    try:
        return as_text(read_upto(fd, min(info.st_size, MAX_TEXT_DIFF_BYTES + 1)))
    except OSError:
        return None
    finally:
        os.close(fd)


# ---- snapshot and patch ------------------------------------------------------------------


@dataclass
class Snapshot:
    """The workspace's state: every file's hash ("unread:SIZE:MTIME_NS" for one known by size and
    time), size, and the text of text files."""

    hashes: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


def prepare(starter_dir: Path, workspace: Path) -> Snapshot:
    if workspace.exists() and any(workspace.iterdir()):
        raise FileExistsError(f"workspace {workspace} is not empty")
    workspace.mkdir(parents=True, exist_ok=True)
    if starter_dir.is_dir():
        shutil.copytree(starter_dir, workspace, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    return snapshot(workspace)


def starting_state(starter_dir: Path) -> Snapshot:
    """The state `prepare` leaves a workspace in (what a resumed run's patch is taken against)."""
    if not starter_dir.is_dir():
        return Snapshot()
    snap = snapshot(starter_dir)
    for rel in [rel for rel in snap.hashes if "__pycache__" in Path(rel).parts]:
        snap.hashes.pop(rel)
        snap.sizes.pop(rel, None)
        snap.texts.pop(rel, None)
    return snap


def snapshot(root: Path, notes: Notes | None = None, texts: bool = True) -> Snapshot:
    """ROOT's state, bounded as `walk` is and by MAX_READ_BYTES read; the texts kept when TEXTS."""
    notes = notes if notes is not None else Notes(str(root))
    snap, budget = Snapshot(), ReadBudget(MAX_READ_BYTES)
    for file in walk(root, notes):
        snap.sizes[file.rel] = file.size
        snap.hashes[file.rel] = identify(file, budget, snap.texts if texts else None, notes)
    return snap


def identify(file: File, budget: ReadBudget, texts: dict[str, str] | None, notes: Notes) -> str:
    """FILE's sha256, its text kept in TEXTS (when given) if it is one; or, for a file too large,
    past the read BUDGET or unreadable, its size and time."""
    unread = f"{UNREAD}{file.size}:{file.mtime_ns}"
    if file.size > MAX_HASH_FILE_BYTES:
        return unread
    if not budget.take(file.size):
        notes.add(NOT_READ, file.rel)
        return unread
    try:
        fd, info = open_file(file.path)
    except OSError:
        notes.add(UNREADABLE, file.rel)
        return unread
    try:
        if texts is None or info.st_size > MAX_TEXT_DIFF_BYTES:
            return hash_fd(fd, min(info.st_size, file.size))
        data = read_upto(fd, info.st_size)
    except OSError:
        notes.add(UNREADABLE, file.rel)
        return unread
    finally:
        os.close(fd)
    text = as_text(data)
    if text is not None:
        texts[file.rel] = text
    return hashlib.sha256(data).hexdigest()


def diff(before: Snapshot, root: Path, notes: Notes | None = None) -> str:
    """A unified diff of the workspace against its starting state (git-style headers), its contents
    at most MAX_PATCH_BYTES long (past it, a changed file is named, its content not shown); names
    that are not UTF-8 shown with \\x escapes."""
    notes = notes if notes is not None else Notes("the patch")
    after = snapshot(root, notes, texts=False)
    chunks, length, not_shown = [], 0, 0
    for rel in sorted(set(before.hashes) | set(after.hashes)):
        old_hash, new_hash = before.hashes.get(rel), after.hashes.get(rel)
        if old_hash == new_hash or (new_hash is None and is_file_there(root, rel)):  # (not reached by a capped walk)
            continue
        if length >= MAX_PATCH_BYTES:  # its content cut, never its name
            not_shown += 1
            chunks.append(f"diff --mlrb a/{shown(rel)} b/{shown(rel)}\n# mlrb: not shown (the patch's size cap)\n")
            continue
        chunk = file_diff(rel, before, after, root, notes)
        chunks.append(chunk)
        length += len(chunk)
    if not_shown:
        notes.add(PATCH_CUT, count=not_shown)
        chunks.append(
            f"# mlrb: {not_shown} more changed files not shown: the patch reached its size cap "
            f"({MAX_PATCH_BYTES} bytes)\n"
        )
    return "".join(chunks)


def file_diff(rel: str, before: Snapshot, after: Snapshot, root: Path, notes: Notes) -> str:
    """The patch's part for one changed file."""
    name = shown(rel)
    if name != rel:
        notes.add(NOT_UTF8, rel)
    old_hash, new_hash = before.hashes.get(rel), after.hashes.get(rel)
    old_text = before.texts.get(rel, "" if old_hash is None else None)
    new_text = "" if new_hash is None else read_text(os.path.join(root, rel), after.sizes[rel])
    header = f"diff --mlrb a/{name} b/{name}\n"
    if old_text is None or new_text is None:
        size = after.sizes[rel] if new_hash else 0
        state = "added" if old_hash is None else "deleted" if new_hash is None else "changed"
        digest = "-" if new_hash is None else "not computed" if new_hash.startswith(UNREAD) else new_hash
        return f"{header}Binary file {name} {state} ({size} bytes, sha256 {digest})\n"
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile="/dev/null" if old_hash is None else f"a/{name}",
        tofile="/dev/null" if new_hash is None else f"b/{name}",
    )
    body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return header + body


# ---- read-only files ---------------------------------------------------------------------


class NotRestored(Exception):
    """Read-only files that could not be put back (their workspace must not be scored)."""

    def __init__(self, restored: list[str], files: list[str]):
        super().__init__(f"read-only files that could not be restored: {', '.join(map(shown, files))}")
        self.restored, self.files = restored, files


def restore_read_only(starter_dir: Path, workspace: Path, globs: list[str], before: Snapshot) -> list[str]:
    """Put back every starter file matching `globs` that the agent changed, removed or replaced
    (with a folder, a link, a FIFO, or a parent folder made a file or a link); raises NotRestored
    naming those that cannot be."""
    restored, failed = [], []
    for rel in sorted(before.hashes):
        if not any(fnmatch.fnmatch(rel, pattern) for pattern in globs):
            continue
        if in_real_folders(workspace, rel) and same_content(starter_dir / rel, workspace / rel):
            continue
        try:
            put_back(starter_dir / rel, workspace, rel)
        except OSError:
            failed.append(rel)
            continue
        restored.append(rel)
    if failed:
        raise NotRestored(restored, failed)
    return restored


def read_only_changed(starter_dir: Path, workspace: Path, globs: list[str], before: Snapshot) -> list[str]:
    """The starter files matching `globs` that the agent changed, removed or replaced, as
    `restore_read_only` would put them back, without putting them back."""
    return [
        rel
        for rel in sorted(before.hashes)
        if any(fnmatch.fnmatch(rel, pattern) for pattern in globs)
        and not (in_real_folders(workspace, rel) and same_content(starter_dir / rel, workspace / rel))
    ]


def in_real_folders(root: Path, rel: str) -> bool:
    """Whether every folder on REL's way down from ROOT is a folder, not a link to one."""
    return all(is_real_folder(root.joinpath(*Path(rel).parts[:n])) for n in range(1, len(Path(rel).parts)))


def is_real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def same_content(expected: Path, path: Path) -> bool:
    """Whether PATH is a regular file (not a link to one) holding what EXPECTED holds."""
    try:
        fd, info = open_file(path)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as found, open(expected, "rb") as wanted:
        if info.st_size != os.fstat(wanted.fileno()).st_size:
            return False
        try:
            while True:
                chunk = wanted.read(1 << 20)
                if chunk != found.read(len(chunk)):
                    return False
                if not chunk:
                    return True
        except OSError:
            return False


def put_back(starter_file: Path, workspace: Path, rel: str) -> None:
    """STARTER_FILE copied to WORKSPACE/REL, whatever stands in the way removed: each folder on
    the way made a real folder (never written through a link), the place itself cleared."""
    folder = workspace
    for part in Path(rel).parts[:-1]:
        folder = folder / part
        if not is_real_folder(folder):
            remove(folder)
            folder.mkdir()
    remove(workspace / rel)
    shutil.copy2(starter_file, workspace / rel)


def remove(path: Path) -> None:
    """Remove PATH whatever it is, never following a link: a folder tree of any depth too."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    try:
        shutil.rmtree(path)
    except (OSError, RecursionError):  # deeper than Python recurses, or than a path can name: rm walks it
        subprocess.run(["rm", "-rf", "--", os.fspath(path)], capture_output=True)
        if os.path.lexists(path):
            raise OSError(errno.ENOTEMPTY, "cannot remove", str(path)) from None


# ---- the submission ----------------------------------------------------------------------


def collect(workspace: Path, submission: str, dest: Path, notes: Notes | None = None) -> bool:
    """Copy the submission ("." for the whole workspace) out of the workspace, as far as it can
    be copied. False when there is none, or when it is no file or folder (a FIFO, a socket, a
    link that loops or leads out of the workspace), said in NOTES. A folder is copied without
    its special files, bounded as `scan` is and by `copy_budget`, what is left out noted;
    symbolic links in it are copied as links, never followed."""
    notes = notes if notes is not None else Notes("the submission")
    named = f"'{shown(submission)}'"
    try:
        root = workspace.resolve(strict=True)
        source = (workspace / submission).resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a link that loops (Python 3.11)
        notes.say(f"{named} is a symbolic link that cannot be followed ({e}): nothing collected")
        return False
    if not (root in source.parents or (submission == "." and source == root)):
        if os.path.lexists(workspace / submission):
            notes.say(f"{named} leads outside the workspace: nothing collected")
        return False
    try:
        info = os.lstat(source)
    except FileNotFoundError:
        return False
    except OSError as e:
        notes.say(f"{named} cannot be read ({e.strerror}): nothing collected")
        return False
    if stat.S_ISDIR(info.st_mode):
        copy_folder(source, dest, notes)
        return True
    if stat.S_ISREG(info.st_mode):
        dest.parent.mkdir(parents=True, exist_ok=True)
        return copy_file(str(source), str(dest), ReadBudget(copy_budget(dest.parent)), notes, source.name)
    notes.say(f"{named} is {kind_of(info.st_mode)}, not a file or folder: nothing collected")
    return False


def kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


def copy_budget(dest: Path) -> int:
    """Bytes a submission's copy into DEST may take: MAX_SUBMISSION_BYTES, or half the free space
    of DEST's disk less the harness's reserve (mlrb/core/disk.py), whichever is less."""
    try:
        room = disk.free_bytes(dest) - disk.reserve_of(dest)
    except OSError:
        return MAX_SUBMISSION_BYTES
    return max(0, min(MAX_SUBMISSION_BYTES, room // 2))


def copy_folder(source: Path, dest: Path, notes: Notes) -> None:
    """SOURCE's tree into DEST (made), as `collect` says."""
    dest.mkdir(parents=True)
    budget = ReadBudget(copy_budget(dest))
    for entry, rel in scan(source, notes):
        target = os.path.join(dest, rel)
        try:
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir(follow_symlinks=False):
                os.mkdir(target)
            elif stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
                copy_file(entry.path, target, budget, notes, rel)
            else:
                notes.add(SPECIAL, rel)
        except OSError:
            notes.add(UNCOPIED, rel)


def copy_file(source: str, target: str, budget: ReadBudget, notes: Notes, rel: str) -> bool:
    """The regular file SOURCE copied to TARGET (new) within BUDGET, with its times and its
    permissions, readable by its owner and without set-id bits (the copy is the harness's)."""
    try:
        fd, info = open_file(source)
    except OSError:
        notes.add(UNREADABLE, rel)
        return False
    try:
        if not budget.take(info.st_size):
            notes.add(TOO_LARGE, rel)
            return False
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            copy_bytes(fd, out, info.st_size)
        finally:
            os.close(out)
        os.chmod(target, stat.S_IMODE(info.st_mode) & 0o777 | 0o600)
        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
        return True
    except OSError:
        notes.add(UNCOPIED, rel)
        with contextlib.suppress(OSError):
            os.unlink(target)
        return False
    finally:
        os.close(fd)
