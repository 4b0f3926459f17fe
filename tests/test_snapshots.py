"""Step snapshots that scale (mlrb/run_files/snapshots.py): each content stored once by its digest, a
manifest per step, a step that changed nothing costing a walk of stats, the submission kept whatever
its size, what goes to the tracking store as `record.snapshots` says, and run folders of the format
before still read. On real files in a real store; sizes kept small (sparse files where a size must
pass a cap)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mlrb.core.config import ConfigError, RecordConfig, check_record
from mlrb.run_files import snapshots, workspace
from test_workspace_traps import start

MIB = 1 << 20


def stored(root: Path) -> set[str]:
    """Every file the store holds besides its steps' lines."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != snapshots.STEPS}


def counting_reads(monkeypatch) -> list[int]:
    """The sizes of the files the snapshots hash (the real hash, counted)."""
    reads: list[int] = []
    real = workspace.hash_fd

    def hash_fd(fd: int, size: int) -> str:
        reads.append(size)
        return real(fd, size)

    monkeypatch.setattr(workspace, "hash_fd", hash_fd)
    return reads


@pytest.mark.fast
def test_a_step_that_changed_nothing_reads_nothing_and_stores_nothing_new(tmp_path, monkeypatch):
    starter, ws, before = start(tmp_path, {"train.py": "train()\n"})
    for i in range(200):
        (ws / "venv" / f"pkg{i % 10}").mkdir(parents=True, exist_ok=True)
        (ws / "venv" / f"pkg{i % 10}" / f"m{i}.py").write_text(f"X = {i}\n")
    (ws / "submission").mkdir()
    (ws / "submission" / "model.bin").write_bytes(os.urandom(9 * MIB))  # a large object
    store = snapshots.StepSnapshots(tmp_path / "snapshots", "submission")
    reads = counting_reads(monkeypatch)
    first = store.take(1, ws, before)
    assert len(reads) == 202  # each file read once: the agent's 201 and the starter train.py
    kept = {p: (tmp_path / "snapshots" / p).stat().st_mtime_ns for p in stored(tmp_path / "snapshots")}
    reads.clear()

    second = store.take(2, ws, before)
    assert reads == []  # no file read again
    assert {p: (tmp_path / "snapshots" / p).stat().st_mtime_ns for p in stored(tmp_path / "snapshots")} == kept
    assert second["tree"] == first["tree"] and snapshots.state_key(second) == snapshots.state_key(first)
    assert len(snapshots.changed_files(store.root, second)) == 201

    (ws / "venv" / "pkg3" / "m3.py").write_text("X = 'changed'\n")
    third = store.take(3, ws, before)
    assert len(reads) == 1  # only the file that changed
    new = stored(tmp_path / "snapshots") - set(kept)
    # its content, and the manifest's folders on its path (venv/pkg3, venv, the top): not the other 9 folders
    assert len([p for p in new if p.startswith("objects/")]) == 1
    assert len([p for p in new if p.startswith("trees/")]) == 3
    assert third["tree"] != first["tree"]


@pytest.mark.fast
def test_a_content_rewritten_in_place_with_its_old_time_is_read_again(tmp_path):
    """A file whose bytes changed with its size and modification time put back (os.utime) is still
    read again: its change time moved. The step's snapshot has the new content."""
    starter, ws, before = start(tmp_path)
    (ws / "answer.txt").write_text("0.1\n")
    store = snapshots.StepSnapshots(tmp_path / "snapshots", "answer.txt")
    store.take(1, ws, before)
    info = os.stat(ws / "answer.txt")
    with open(ws / "answer.txt", "r+") as f:
        f.write("0.9\n")
    os.utime(ws / "answer.txt", ns=(info.st_atime_ns, info.st_mtime_ns))
    second = store.take(2, ws, before)
    rebuilt = snapshots.materialise(store.root, second, starter, tmp_path / "rebuilt")
    assert (rebuilt / "answer.txt").read_text() == "0.9\n"


@pytest.mark.fast
def test_a_rewritten_checkpoint_is_stored_once_per_content(tmp_path):
    starter, ws, before = start(tmp_path)
    (ws / "ckpt").mkdir()
    contents = [os.urandom(9 * MIB), os.urandom(9 * MIB)]
    store = snapshots.StepSnapshots(tmp_path / "snapshots", "ckpt")
    steps = []
    for step, which in enumerate([0, 1, 0, 1, 1, 0], 1):  # rewritten every step, two contents in turn
        (ws / "ckpt" / "model.bin").write_bytes(contents[which])
        steps.append(store.take(step, ws, before))
    large = list((tmp_path / "snapshots" / snapshots.LARGE).iterdir())
    assert len(large) == 2 and sum(p.stat().st_size for p in large) == 18 * MIB
    assert sum(snapshots.needed(store.root).values()) == 18 * MIB
    for step, which in zip(steps, [0, 1, 0, 1, 1, 0], strict=True):
        rebuilt = snapshots.materialise(store.root, step, starter, tmp_path / "rebuilt", link=True)
        assert (rebuilt / "ckpt" / "model.bin").read_bytes() == contents[which]


@pytest.mark.fast
def test_a_submission_past_the_old_cap_is_kept_and_rebuilt_at_its_step(tmp_path):
    """A 300 MiB submission (sparse: a few real bytes among holes) is kept at each step whose content
    it has, and rebuilt as it was; a file as large that is not the submission is named, not kept."""
    starter, ws, before = start(tmp_path)
    (ws / "submission").mkdir()
    big = 300 * MIB
    assert big > snapshots.MAX_FILE_BYTES

    def write(path: Path, marker: bytes) -> None:
        with open(path, "wb") as f:
            f.truncate(big)
            f.seek(big // 2)
            f.write(marker)

    write(ws / "submission" / "model.bin", b"first")
    write(ws / "scratch.bin", b"not the submission")
    store = snapshots.StepSnapshots(tmp_path / "snapshots", "submission")
    first = store.take(1, ws, before)
    write(ws / "submission" / "model.bin", b"second")
    second = store.take(2, ws, before)

    assert first["too_large"] == second["too_large"] == {"scratch.bin": big}
    assert any(snapshots.NOT_KEPT in line and "scratch.bin" in line for line in first["notes"])
    assert set(snapshots.changed_files(store.root, first)) == {"submission/model.bin"}
    objects = list((store.root / snapshots.LARGE).iterdir())
    assert len(objects) == 2 and all(p.stat().st_size == big for p in objects)
    assert sum(p.stat().st_blocks * 512 for p in objects) < 8 * MIB  # kept sparse: the holes take no disk
    for entry, marker in ((first, b"first"), (second, b"second")):
        rebuilt = snapshots.materialise(store.root, entry, starter, tmp_path / "rebuilt", link=True)
        with open(rebuilt / "submission" / "model.bin", "rb") as f:
            f.seek(big // 2)
            assert f.read(len(marker)) == marker
        assert os.path.getsize(rebuilt / "submission" / "model.bin") == big


@pytest.mark.fast
def test_an_agent_rewriting_a_file_in_place_never_changes_an_earlier_step(tmp_path):
    """The store's objects are its own (copies; never hard links to the agent's files), and a
    rebuilt workspace's links to them are never written through: a program that rewrites its
    checkpoint in place (open for writing, as torch.save does) leaves step 1's content as it was."""
    starter, ws, before = start(tmp_path)
    (ws / "model.bin").write_bytes(b"A" * (9 * MIB))
    store = snapshots.StepSnapshots(tmp_path / "snapshots", ".")
    first = store.take(1, ws, before)
    assert os.stat(ws / "model.bin").st_nlink == 1  # the workspace's file shares its inode with nothing
    with open(ws / "model.bin", "r+b") as f:  # in place: same inode
        f.write(b"B" * MIB)
    store.take(2, ws, before)
    rebuilt = snapshots.materialise(store.root, first, starter, tmp_path / "rebuilt", link=True)
    assert (rebuilt / "model.bin").read_bytes() == b"A" * (9 * MIB)
    assert not os.stat(rebuilt / "model.bin").st_mode & 0o222  # the store's objects are read-only
    resumed = snapshots.materialise(store.root, first, starter, tmp_path / "resumed")  # the agent's, to write
    with open(resumed / "model.bin", "r+b") as f:
        f.write(b"C")
    assert os.stat(resumed / "model.bin").st_nlink == 1
    assert snapshots.materialise(store.root, first, starter, tmp_path / "again", link=True).joinpath(
        "model.bin").read_bytes()[:1] == b"A"  # fmt: skip


@pytest.mark.parametrize(
    ("what", "sent"),
    [
        ("manifest", {"steps.jsonl", "trees"}),
        ("small", {"steps.jsonl", "trees", "objects"}),
        ("all", {"steps.jsonl", "trees", "objects", "large"}),
    ],
)
@pytest.mark.fast
def test_the_tracking_store_gets_what_record_snapshots_says(tmp_path, what, sent):
    """What run.py logs for each `record.snapshots`, through the run's real recorder: its record's
    artifact lines, which the recording process and python -m mlrb.sync turn into the store's."""
    from mlrb.store import record

    starter, ws, before = start(tmp_path)
    (ws / "submission").mkdir()
    (ws / "submission" / "small.csv").write_text("id,y\n1,2\n")
    (ws / "submission" / "model.bin").write_bytes(os.urandom(9 * MIB))
    store = snapshots.StepSnapshots(tmp_path / "run" / "snapshots", "submission")
    store.take(1, ws, before)
    exported = []
    store_run = type("StoreRun", (), {"store": {"dir": "mlruns"},
                                      "export": lambda self, *args, **kw: exported.append(args)})()  # fmt: skip
    recorder = record.RecordedRun(store_run, tmp_path / "run", "e", "e/0", {}, "r")
    for path, folder, is_dir in snapshots.recorded(store.root, what):
        (recorder.log_folder if is_dir else recorder.log_file)(path, folder)
    artifacts = record.fold(record.read(tmp_path / "run"))["artifacts"]
    assert {Path(file).name for file, _, _ in artifacts} == sent
    assert all(folder.startswith("snapshots") for _, folder, _ in artifacts)


@pytest.mark.fast
def test_a_bad_record_snapshots_is_refused_in_one_line():
    check_record(RecordConfig())
    with pytest.raises(ConfigError) as refused:
        check_record(RecordConfig(snapshots="everything"))
    assert str(refused.value) == "record.snapshots must be one of manifest, small, all, got 'everything'"


@pytest.mark.fast
def test_a_run_folder_of_the_format_before_is_still_read_and_rebuilt(tmp_path):
    """Format 1: each line's changed files in the line itself, objects in objects/ (what runs
    recorded before wrote); rebuilt, keyed and filtered as before, and a resumed run appends
    format-2 lines to the same store."""
    starter, ws, before = start(tmp_path, {"data.csv": "a\n", "eval.py": "x\n"})
    root = tmp_path / "snapshots"
    (root / "objects").mkdir(parents=True)
    digest = workspace.hashlib.sha256(b"0.5\n").hexdigest()
    (root / "objects" / digest).write_bytes(b"0.5\n")
    eval_digest = workspace.hashlib.sha256(b"tampered\n").hexdigest()
    (root / "objects" / eval_digest).write_bytes(b"tampered\n")
    old = {"step": 1, "changed": {"answer.txt": digest, "eval.py": eval_digest}, "deleted": ["data.csv"],
           "too_large": {}, "time": 1.0}  # fmt: skip
    (root / snapshots.STEPS).write_text(json.dumps(old) + "\n")

    (entry,) = snapshots.load_steps(root)
    assert snapshots.changed_files(root, entry) == old["changed"]
    kept = snapshots.without(entry, ["eval.py"])
    rebuilt = snapshots.materialise(root, kept, starter, tmp_path / "rebuilt")
    assert (rebuilt / "answer.txt").read_text() == "0.5\n" and (rebuilt / "eval.py").read_text() == "x\n"
    assert not (rebuilt / "data.csv").exists()

    shutil.rmtree(ws)
    snapshots.materialise(root, entry, starter, ws)  # a resumed run's workspace, from the old line
    (ws / "answer.txt").write_text("0.7\n")
    store = snapshots.StepSnapshots(root, ".")
    store.take(2, ws, before)
    first, second = snapshots.load_steps(root)
    assert first == entry and second["v"] == snapshots.VERSION
    assert snapshots.materialise(root, second, starter, tmp_path / "r2").joinpath("answer.txt").read_text() == "0.7\n"
    assert snapshots.state_key(first) != snapshots.state_key(second)


MARK_AT = 1000  # where the submission's big file holds its step's mark


def big_file(mark: str) -> str:
    """A shell command that leaves model.bin past the old 256 MiB cap (sparse) with MARK in it."""
    return (f"truncate -s 260M model.bin && printf {mark} | dd of=model.bin bs=1 seek={MARK_AT} conv=notrunc "
            "status=none")  # fmt: skip


@pytest.mark.integration
def test_a_submission_past_the_old_cap_is_rescored_at_its_step_and_the_store_gets_no_large_object(tmp_path, cache_dir):
    """A real run (the cheapest task, whose submission is the whole workspace) whose scripted Claude
    leaves a 260 MiB file in its workspace at step 1 and rewrites it at step 2: its step 1 is
    rescored afterwards with that file as step 1 left it, and the tracking store, by default,
    holds the manifests and small files but not the large object."""
    from conftest import (
        HARNESS_EXPERIMENT,
        HARNESS_SUBMISSION,
        HARNESS_TASK,
        mlflow_client,
        run_cli,
        run_module,
        store_args,
    )
    from fake_llm_server import FakeLlmServer, reply, tool

    script = [
        reply(tool("bash", command=f"{big_file('first')} && {HARNESS_SUBMISSION}", timeout_s=300)),
        reply(tool("bash", command=big_file("second"), timeout_s=300)),
        reply(tool("submit", summary="done")),
    ]
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=claude", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": "sk-ant-snapshots", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    sent = {a.path for a in client.list_artifacts(run.info.run_id, "snapshots")}
    assert sent == {"snapshots/steps.jsonl", "snapshots/trees", "snapshots/objects"}
    assert len(list((tmp_path / "run" / "snapshots" / snapshots.LARGE).iterdir())) == 2  # in the run folder

    rescored = run_module("mlrb.rescore", run.info.run_id, "--step", "1", cwd=tmp_path)
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    assert "step 1: score" in rescored.stdout and "(valid)" in rescored.stdout
    rebuilt = tmp_path / "outputs" / "rescore" / run.info.run_id / "step-1" / "workspace" / "model.bin"
    assert rebuilt.stat().st_size == 260 * MIB
    with open(rebuilt, "rb") as f:
        f.seek(MARK_AT)
        assert f.read(5) == b"first"
