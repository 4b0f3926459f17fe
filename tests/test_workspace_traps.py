"""Whatever the agent leaves in its workspace, the harness collects it (mlrb/run_files/workspace.py,
mlrb/run_files/snapshots.py): huge sparse files, many files, deep trees, FIFOs, sockets, symlink loops,
unreadable modes and names that are not UTF-8 are walked, snapshot, diffed, restored and
copied within bounds, and what is cut is a note, never an error. Real files in tmp_path;
the checks that could exhaust memory or the disk on a regression run in a process with limits."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO
from mlrb.run_files import snapshots, workspace
from mlrb.store import record

pytestmark = pytest.mark.fast

GIB = 1 << 30


# ---- helpers ------------------------------------------------------------------------------


def run_bounded(code: str, memory: int = GIB, file_size: int = GIB) -> dict:
    """Run CODE in a Python process that may map at most MEMORY bytes and write no file past
    FILE_SIZE bytes (a regression fails fast, never fills the machine); the JSON it prints last."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    prelude = "import json, os, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], preexec_fn=limits, cwd=REPO,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def deep_chain(top: Path, depth: int) -> None:
    """DEPTH nested folders `d` under TOP, a file at the bottom: made through folder descriptors,
    as the whole path is longer than any path the kernel takes."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        bottom = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(bottom, b"deep\n")
        os.close(bottom)
    finally:
        os.close(fd)


def remove_chain(top: Path) -> None:
    """Remove a chain deep_chain made, a level at a time (shutil.rmtree recurses, and would not)."""
    while (top / "d").is_dir():
        below = (top / "d" / "d").is_dir()
        if below:
            os.rename(top / "d" / "d", top / "next")
        shutil.rmtree(top / "d")
        if below:
            os.rename(top / "next", top / "d")


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def unix_socket(path: Path) -> Path:
    """A socket file, as a server the agent left would leave one."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
    return path


def symlink_loop(a: Path, b: Path) -> None:
    a.symlink_to(b.name)
    b.symlink_to(a.name)


def not_utf8(folder: Path, name: bytes) -> Path:
    """FOLDER / NAME where NAME's bytes are not UTF-8 (Python spells it with surrogate escapes)."""
    return Path(os.fsdecode(os.fsencode(folder) + b"/" + name))


def start(tmp_path: Path, files: dict[str, str] | None = None) -> tuple[Path, Path, workspace.Snapshot]:
    """A starter folder with FILES, and a workspace prepared from it."""
    starter = tmp_path / "starter"
    starter.mkdir()
    for rel, text in (files or {}).items():
        (starter / rel).parent.mkdir(parents=True, exist_ok=True)
        (starter / rel).write_text(text)
    ws = tmp_path / "ws"
    return starter, ws, workspace.prepare(starter, ws)


def noted(notes: workspace.Notes, *words: str) -> bool:
    """Whether one of the notes' lines holds all WORDS."""
    return any(all(word in line for word in words) for line in notes.lines())


# ---- huge files: never read whole, never copied past the caps -----------------------------


def test_snapshots_and_the_patch_never_read_a_huge_sparse_file_whole(tmp_path):
    """A 50 GiB file of holes (made in an instant) is known by its size: a process limited to
    1 GiB of memory snapshots, diffs and step-snapshots the workspace holding it."""
    before = workspace.prepare(tmp_path / "starter", tmp_path / "ws")
    with open(tmp_path / "ws" / "checkpoint.bin", "wb") as f:
        f.truncate(50 * GIB)
    (tmp_path / "ws" / "notes.txt").write_text("trained\n")
    (tmp_path / "before.json").write_text(json.dumps(vars(before)))
    result = run_bounded(f"""
        from pathlib import Path
        from mlrb.run_files import snapshots, workspace
        tmp = Path({str(tmp_path)!r})
        before = workspace.Snapshot(**json.loads((tmp / "before.json").read_text()))
        patch = workspace.diff(before, tmp / "ws")
        entry = snapshots.StepSnapshots(tmp / "snapshots").take(1, tmp / "ws", before)
        entry["changed"] = snapshots.changed_files(tmp / "snapshots", entry)
        print(json.dumps({{"patch": patch, "entry": entry}}))
    """)
    assert "Binary file checkpoint.bin added (53687091200 bytes" in result["patch"]
    assert "+++ b/notes.txt\n@@ -0,0 +1 @@\n+trained\n" in result["patch"]
    assert result["entry"]["too_large"] == {"checkpoint.bin": 50 * GIB}
    assert list(result["entry"]["changed"]) == ["notes.txt"]


def test_a_huge_sparse_file_in_the_submission_is_left_out_and_the_rest_is_copied(tmp_path):
    """A 1 TiB file of holes in the submission folder would fill any disk copied: it is left out
    with a note (in a process that may write no file past 1 GiB), the model's files are copied."""
    (tmp_path / "ws" / "submission").mkdir(parents=True)
    (tmp_path / "ws" / "submission" / "config.json").write_text("{}")
    with open(tmp_path / "ws" / "submission" / "model.safetensors", "wb") as f:
        f.truncate(1024 * GIB)
    result = run_bounded(f"""
        from pathlib import Path
        from mlrb.run_files import workspace
        tmp = Path({str(tmp_path)!r})
        notes = workspace.Notes("the submission")
        collected = workspace.collect(tmp / "ws", "submission", tmp / "out", notes)
        print(json.dumps({{"collected": collected, "notes": notes.lines()}}))
    """)
    assert result["collected"] is True
    assert (tmp_path / "out" / "config.json").read_text() == "{}"
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert any("model.safetensors" in line and "too large" in line for line in result["notes"]), result["notes"]


# ---- deep trees and many files: walked to a cap, the rest counted in a note ---------------


def test_a_tree_deeper_than_a_path_can_name_is_walked_and_copied_to_the_depth_cap(tmp_path):
    starter, ws, before = start(tmp_path)
    (ws / "submission").mkdir()
    (ws / "submission" / "config.json").write_text("{}")
    deep_chain(ws / "submission", 3000)
    try:
        notes = workspace.Notes("the patch")
        patch = workspace.diff(before, ws, notes)
        entry = snapshots.StepSnapshots(tmp_path / "snapshots").take(1, ws, before)
        copied = workspace.Notes("the submission")
        assert workspace.collect(ws, "submission", tmp_path / "out", copied)
    finally:
        remove_chain(ws / "submission")
    assert "+++ b/submission/config.json" in patch and "bottom.txt" not in patch
    assert noted(notes, f"deeper than {workspace.MAX_DEPTH} levels")
    assert list(snapshots.changed_files(tmp_path / "snapshots", entry)) == ["submission/config.json"]
    assert any(f"deeper than {workspace.MAX_DEPTH} levels" in line for line in entry["notes"])
    assert (tmp_path / "out" / "config.json").read_text() == "{}"
    assert noted(copied, f"deeper than {workspace.MAX_DEPTH} levels")
    chain = tmp_path / "out" / Path(*["d"] * workspace.MAX_DEPTH)  # the copy stops at the cap
    assert chain.is_dir() and not (chain / "d").exists()


def test_twice_the_file_cap_is_walked_to_the_cap_and_the_rest_are_counted(tmp_path, monkeypatch):
    """Twice the cap of empty files: the snapshot, the step's snapshot and the patch stop at
    MAX_FILES files each and say how many they left out. The cap is made small (its test needs
    no 200,000 files); how fast the walks are at the real cap is benchmarks/workspace_walk.py's."""
    monkeypatch.setattr(workspace, "MAX_FILES", 2_000)
    starter, ws, before = start(tmp_path, {"train.py": "train()\n"})
    count = 2 * workspace.MAX_FILES
    for i in range(count // 1000):
        folder = ws / "data" / f"{i:03d}"
        folder.mkdir(parents=True)
        for j in range(1000):
            (folder / f"{j:04d}.txt").touch()
    notes = workspace.Notes("the patch")
    snap = workspace.snapshot(ws, notes)
    entry = snapshots.StepSnapshots(tmp_path / "snapshots").take(1, ws, before)
    patch_notes = workspace.Notes("the patch")
    patch = workspace.diff(before, ws, patch_notes)
    assert len(snap.hashes) == workspace.MAX_FILES
    left_out = f"files past the first {workspace.MAX_FILES} left out: {count + 1 - workspace.MAX_FILES}"
    assert noted(notes, left_out) and noted(patch_notes, left_out)
    assert (
        len(snapshots.changed_files(tmp_path / "snapshots", entry)) <= workspace.MAX_FILES and entry["deleted"] == []
    )  # train.py, walked or not, is there
    assert any(left_out in line for line in entry["notes"])
    assert "--- a/train.py\n+++ /dev/null" not in patch


def test_the_patch_stops_showing_contents_at_its_size_cap_names_the_rest_and_says_how_many(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace, "MAX_PATCH_BYTES", 2000)
    starter, ws, before = start(tmp_path)
    for i in range(50):
        (ws / f"file{i:02d}.txt").write_text("line\n" * 20)
    notes = workspace.Notes("the patch")
    patch = workspace.diff(before, ws, notes)
    assert "+++ b/file00.txt" in patch and "+++ b/file49.txt" not in patch  # contents up to the cap
    assert all(f"b/file{i:02d}.txt" in patch for i in range(50))  # every name
    assert patch.count("+line") <= (2000 + 1000) // 5
    assert noted(notes, "the patch reached its size cap")
    assert patch.rstrip().splitlines()[-1].startswith("# mlrb: ")


# ---- special files and symlink loops: left out, noted -------------------------------------


def test_fifos_sockets_and_symlink_loops_in_the_workspace_are_left_out_with_a_note(tmp_path):
    starter, ws, before = start(tmp_path)
    fifo(ws / "pipe")
    unix_socket(ws / "server.sock")
    symlink_loop(ws / "loop-a", ws / "loop-b")
    (ws / "here").symlink_to(".")
    (ws / "result.txt").write_text("0.7\n")
    notes = workspace.Notes("the patch")
    patch = workspace.diff(before, ws, notes)
    entry = snapshots.StepSnapshots(tmp_path / "snapshots").take(1, ws, before)
    assert "+++ b/result.txt" in patch and "pipe" not in patch and "loop" not in patch
    assert noted(notes, "special files", "2 ", "pipe", "server.sock")
    assert list(snapshots.changed_files(tmp_path / "snapshots", entry)) == ["result.txt"] and any(
        "pipe" in line for line in entry["notes"]
    )


def test_a_submission_with_fifos_sockets_loops_and_odd_modes_is_copied_without_its_special_files(tmp_path):
    """A valid model folder with a stray FIFO beside it still scores: the FIFO and the socket are
    left out with a note; links are copied as links, never followed; a set-uid bit is dropped
    (the copy is the harness's, perhaps root's); a file of mode 000 is copied readable by its owner."""
    ws = tmp_path / "ws"
    sub = ws / "submission"
    (sub / "nested").mkdir(parents=True)
    (sub / "config.json").write_text('{"model_type": "llama"}')
    (sub / "nested" / "weights.bin").write_bytes(b"\1\2\3")
    fifo(sub / "pipe")
    unix_socket(sub / "agent.sock")
    symlink_loop(sub / "loop-a", sub / "loop-b")
    (tmp_path / "secret.txt").write_text("hidden answers")
    (sub / "leak").symlink_to(tmp_path / "secret.txt")
    (sub / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(sub / "run.sh", 0o4755)
    (sub / "locked.txt").write_text("mine")
    os.chmod(sub / "locked.txt", 0)
    notes = workspace.Notes("the submission")

    assert workspace.collect(ws, "submission", tmp_path / "out", notes)

    out = tmp_path / "out"
    assert (out / "config.json").read_text() == '{"model_type": "llama"}'
    assert (out / "nested" / "weights.bin").read_bytes() == b"\1\2\3"
    assert not os.path.lexists(out / "pipe") and not os.path.lexists(out / "agent.sock")
    assert os.readlink(out / "loop-a") == "loop-b" and os.readlink(out / "leak") == str(tmp_path / "secret.txt")
    assert stat.S_IMODE(os.lstat(out / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.lstat(out / "locked.txt").st_mode) & 0o600 == 0o600
    assert noted(notes, "special files", "2 ", "pipe", "agent.sock")


@pytest.mark.parametrize("kind", ["fifo", "socket", "symlink loop", "link out of the workspace"])
def test_a_submission_that_is_no_file_or_folder_is_not_collected_and_the_note_says_what_it_is(tmp_path, kind):
    ws = tmp_path / "ws"
    ws.mkdir()
    if kind == "fifo":
        fifo(ws / "submission")
    elif kind == "socket":
        unix_socket(ws / "submission")
    elif kind == "symlink loop":
        symlink_loop(ws / "submission", ws / "other")
    else:
        (ws / "submission").symlink_to(tmp_path)
    notes = workspace.Notes("the submission")
    assert workspace.collect(ws, "submission", tmp_path / "out", notes) is False
    assert not os.path.lexists(tmp_path / "out")
    expected = {"fifo": "a FIFO", "socket": "a socket", "symlink loop": "symbolic link", "link out of the workspace":
                "outside the workspace"}[kind]  # fmt: skip
    assert noted(notes, "submission", expected), notes.lines()


# ---- names that are not UTF-8 -------------------------------------------------------------


def test_names_that_are_not_utf8_reach_the_patch_the_record_and_the_copy(tmp_path):
    starter, ws, before = start(tmp_path)
    (ws / "submission").mkdir()
    not_utf8(ws / "submission", b"r\xe9sum\xe9.txt").write_text("caf\xe9\n")
    not_utf8(ws, b"\xff").mkdir()
    (not_utf8(ws, b"\xff") / "x.txt").write_text("x\n")
    notes = workspace.Notes("the patch")

    patch = workspace.diff(before, ws, notes)
    entry = snapshots.StepSnapshots(tmp_path / "snapshots").take(1, ws, before)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    exported = []
    store_run = type("StoreRun", (), {"store": {"dir": "mlruns"},
                                      "export": lambda self, *args, **kw: exported.append(args)})()  # fmt: skip
    recorder = record.RecordedRun(store_run, run_dir, "e", "e/0", {}, "r")
    recorder.log_text(patch, "workspace.patch")
    recorder.log_text("a name the patch did not escape: \udcff\n", "raw.txt")  # the record escapes it itself

    assert "+++ b/submission/r\\xe9sum\\xe9.txt" in patch and "+++ b/\\xff/x.txt" in patch
    assert (run_dir / "record" / "workspace.patch").read_text(encoding="utf-8") == patch
    assert "\\udcff" in (run_dir / "record" / "raw.txt").read_text(encoding="utf-8")
    assert len(exported) == 3  # the opened line, then the two texts
    assert noted(notes, "not UTF-8", "2 ")
    assert set(snapshots.changed_files(tmp_path / "snapshots", entry)) == {
        "submission/r\udce9sum\udce9.txt",
        "\udcff/x.txt",
    }
    rebuilt = snapshots.materialise(tmp_path / "snapshots", entry, starter, tmp_path / "rebuilt")
    assert not_utf8(rebuilt / "submission", b"r\xe9sum\xe9.txt").read_text() == "caf\xe9\n"
    assert workspace.collect(ws, "submission", tmp_path / "out")
    assert not_utf8(tmp_path / "out", b"r\xe9sum\xe9.txt").read_text() == "caf\xe9\n"


# ---- read-only files: restored whatever took their place ----------------------------------


def replace_with_fifo(ws: Path, outside: Path) -> None:
    (ws / "eval" / "score.py").unlink()
    fifo(ws / "eval" / "score.py")


def replace_with_deep_tree(ws: Path, outside: Path) -> None:
    (ws / "eval" / "score.py").unlink()
    (ws / "eval" / "score.py").mkdir()
    deep_chain(ws / "eval" / "score.py", 3000)


def replace_with_link_to_a_copy_outside(ws: Path, outside: Path) -> None:
    (outside / "score.py").write_text("def score(): return 0.5\n")  # the same text, outside
    (ws / "eval" / "score.py").unlink()
    (ws / "eval" / "score.py").symlink_to(outside / "score.py")


def make_the_parent_a_file(ws: Path, outside: Path) -> None:
    shutil.rmtree(ws / "eval")
    (ws / "eval").write_text("not a folder")


def make_the_parent_a_link_out(ws: Path, outside: Path) -> None:
    shutil.rmtree(ws / "eval")
    (ws / "eval").symlink_to(outside)


@pytest.mark.parametrize(
    "tamper",
    [replace_with_fifo, replace_with_deep_tree, replace_with_link_to_a_copy_outside, make_the_parent_a_file,
     make_the_parent_a_link_out],
)  # fmt: skip
def test_a_read_only_file_is_restored_whatever_the_agent_put_in_its_place(tmp_path, tamper):
    starter, ws, before = start(tmp_path, {"eval/score.py": "def score(): return 0.5\n", "train.py": "train()\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    tamper(ws, outside)
    outside_before = sorted(p.name for p in outside.iterdir())

    restored = workspace.restore_read_only(starter, ws, ["eval/*"], before)

    assert restored == ["eval/score.py"]
    info = os.lstat(ws / "eval" / "score.py")
    assert stat.S_ISREG(info.st_mode) and stat.S_ISDIR(os.lstat(ws / "eval").st_mode)
    assert (ws / "eval" / "score.py").read_text() == "def score(): return 0.5\n"
    assert sorted(p.name for p in outside.iterdir()) == outside_before  # nothing written through a link


# ---- unreadable modes, as a harness that is not root meets them ---------------------------


def test_files_and_folders_the_harness_cannot_read_are_noted_not_fatal(tmp_path):
    """Mode 000 files and folders, met by a process without root's power to read anything
    (root's is dropped with setpriv): every stage goes on, and the read-only file is restored."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to drop root's reading powers")
    starter, ws, before = start(tmp_path, {"eval/score.py": "def score(): return 0.5\n"})
    (ws / "eval" / "score.py").unlink()
    (ws / "eval" / "score.py").write_text("def score(): return 1.0\n")
    os.chmod(ws / "eval" / "score.py", 0)
    (ws / "secret.bin").write_bytes(b"\0" * 10)
    os.chmod(ws / "secret.bin", 0)
    (ws / "locked").mkdir()
    (ws / "locked" / "inside.txt").write_text("x\n")
    os.chmod(ws / "locked", 0)
    (ws / "submission").mkdir()
    (ws / "submission" / "config.json").write_text("{}")
    (ws / "submission" / "hidden.txt").write_text("h")
    os.chmod(ws / "submission" / "hidden.txt", 0)
    state = tmp_path / "before.json"
    state.write_text(json.dumps({"hashes": before.hashes, "texts": before.texts, "sizes": before.sizes}))
    code = f"""
        import json, sys
        from pathlib import Path
        from mlrb.run_files import snapshots, workspace
        tmp = Path({str(tmp_path)!r})
        ws = tmp / "ws"
        before = workspace.Snapshot(**json.loads((tmp / "before.json").read_text()))
        notes = workspace.Notes("the patch")
        patch = workspace.diff(before, ws, notes)
        entry = snapshots.StepSnapshots(tmp / "snapshots").take(1, ws, before)
        restored = workspace.restore_read_only(tmp / "starter", ws, ["eval/*"], before)
        copied = workspace.Notes("the submission")
        collected = workspace.collect(ws, "submission", tmp / "out", copied)
        print(json.dumps({{"patch": patch, "notes": notes.lines(), "restored": restored, "collected": collected,
                          "copied": copied.lines(), "entry": entry}}))
    """
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    result = subprocess.run([*drop, sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    os.chmod(ws / "locked", 0o755)  # (for the test folder's removal)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["restored"] == ["eval/score.py"]
    assert (ws / "eval" / "score.py").read_text() == "def score(): return 0.5\n"
    assert any("could not be read" in line and "secret.bin" in line and "locked" in line for line in found["notes"])
    assert found["collected"] is True and (tmp_path / "out" / "config.json").read_text() == "{}"
    assert any("could not be read" in line and "hidden.txt" in line for line in found["copied"]), found["copied"]


# ---- a step's workspace rebuilt where a folder became a file ------------------------------


def test_a_step_where_a_starter_folder_became_a_file_is_rebuilt(tmp_path):
    starter, ws, before = start(tmp_path, {"data/config.txt": "a\n"})
    shutil.rmtree(ws / "data")
    (ws / "data").write_text("now a file\n")
    store = snapshots.StepSnapshots(tmp_path / "snapshots")
    entry = store.take(1, ws, before)
    rebuilt = snapshots.materialise(store.root, entry, starter, tmp_path / "rebuilt")
    assert (rebuilt / "data").read_text() == "now a file\n"
