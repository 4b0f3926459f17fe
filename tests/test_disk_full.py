"""The disk is the agent's to fill, not the harness's: a whole run on a real file system of
900 MB (a loop-mounted ext4 image: the run folder and the tracking store on it), whose agent
makes a valid submission and then fills the disk until it is refused. Before, the harness
crashed ("No space left on device"), the store's run stayed RUNNING with no status (left out of
every mean), the record was cut mid-line, and the same command could neither start nor resume.

Needs root (mount) and a loop device: a laptop without them skips, CI has both."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer
from mlrb.core import disk
from mlrb.store import record
from test_command_agent import KEY, command_override
from test_docker_sandbox import needs_docker
from test_resume import command_args, killed_mid_agent, run_folders


def mount_problem() -> str:
    if os.geteuid() != 0:
        return "mounting a small file system needs root"
    if not (shutil.which("mkfs.ext4") and shutil.which("mount")):
        return "mkfs.ext4 or mount is missing"
    return ""


needs_mount = pytest.mark.skipif(bool(mount_problem()), reason=mount_problem() or "ok")


@pytest.fixture
def small_disk(tmp_path):
    """A real 900 MB ext4 file system, mounted for the test (no blocks reserved for root)."""
    image, mounted = tmp_path / "disk.img", tmp_path / "disk"
    mounted.mkdir()
    subprocess.run(["truncate", "-s", "900M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mounted)], check=True)
    try:
        yield mounted
    finally:
        for _ in range(20):  # a process of the run may still hold it for a moment
            if subprocess.run(["umount", str(mounted)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:  # detached now, gone once nothing holds it
            subprocess.run(["umount", "--lazy", str(mounted)], check=True)


# A valid submission (the given train.py's predictions), then 50 MB files until the disk refuses one, then
# a wait: the harness must stop it, not the wall time.
FILLS_THE_DISK = """
import os, subprocess, time
subprocess.run(["python", "train.py"], check=True)  # a valid submission
n = 0
try:
    while True:
        fd = os.open(f"fill_{n}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        os.posix_fallocate(fd, 0, 50 << 20)
        os.close(fd)
        n += 1
except OSError as e:
    print("the disk refused file", n, ":", e, flush=True)
time.sleep(300)
print("never reached: the harness stops the agent")
"""


@needs_mount
@pytest.mark.parametrize("sandbox", [pytest.param("bwrap", marks=pytest.mark.integration),
                                     pytest.param("docker", marks=[pytest.mark.system, needs_docker])])  # fmt: skip
def test_an_agent_that_fills_the_disk_is_stopped_and_counted_and_its_run_recorded_whole(small_disk, cache_dir,
                                                                                         sandbox):  # fmt: skip
    with FakeLlmServer([]) as server:
        started = time.monotonic()
        result = run_cli(*store_args(small_disk, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(FILLS_THE_DISK), "budget.wall_time_s=600", f"sandbox={sandbox}",
                         cwd=small_disk, env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < 200  # stopped by the harness, not by its 600 s of wall time
    run_dir = small_disk / "run"
    assert "the disk refused file" in (run_dir / "agent" / "stdout.txt").read_text()
    client = mlflow_client(small_disk)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    tags, metrics = run.data.tags, run.data.metrics
    assert run.info.status == "FINISHED"
    assert (tags["mlrb.status"], tags["mlrb.stop_reason"]) == ("budget_exhausted", "disk")
    assert "disk" in tags["mlrb.agent_message"]
    assert tags["mlrb.valid"] == "True" and "score" in metrics  # what it left is scored, and counted
    # an attempt, with its raw score (a task folder states no do-nothing score: no counted one, and why)
    assert tags["mlrb.counted_as"] == "none" and tags["mlrb.counted_reason"]
    # what the harness removed to make room, each file named
    notes = Path(client.download_artifacts(run.info.run_id, "workspace_notes.txt", str(small_disk / "a"))).read_text()
    assert "the disk: removed fill_" in notes
    assert disk.free_bytes(small_disk) >= disk.reserve_of(small_disk)
    # every line of the record and the trajectory whole
    assert record.read(run_dir)[-1]["kind"] == "status"
    for line in (run_dir / "trajectory.jsonl").read_text().splitlines():
        json.loads(line)
    # the submission it made before is whole
    assert (run_dir / "workspace" / "submission.csv").is_file()


# Past its own limit on a disk with room: 50 MB files, 400 MB in all, against sandbox.disk_gb=0.1.
WRITES_PAST_ITS_LIMIT = """
import os, subprocess, time
subprocess.run(["python", "train.py"], check=True)  # a valid submission
for n in range(8):
    with open(f"shard_{n}.bin", "wb") as f:
        f.write(os.urandom(50 << 20))
print("wrote 400 MB", flush=True)
time.sleep(300)
"""


@pytest.mark.integration
def test_an_agent_past_its_workspace_s_limit_is_stopped_and_what_it_wrote_past_it_removed(tmp_path, cache_dir):
    with FakeLlmServer([]) as server:
        started = time.monotonic()
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(WRITES_PAST_ITS_LIMIT), "sandbox.disk_gb=0.1", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < 200
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    tags = run.data.tags
    assert (tags["mlrb.status"], tags["mlrb.stop_reason"]) == ("budget_exhausted", "disk")
    assert "past its limit of 0.10 GiB (sandbox.disk_gb)" in tags["mlrb.agent_message"]
    assert tags["mlrb.valid"] == "True"
    work = tmp_path / "run" / "workspace"
    held = sum(p.stat().st_blocks * 512 for p in work.rglob("*") if p.is_file())
    assert held <= 0.1 * (1 << 30) and (work / "submission.csv").is_file()
    notes = Path(client.download_artifacts(run.info.run_id, "workspace_notes.txt", str(tmp_path / "a"))).read_text()
    # How many shards it wrote before the guard stopped it depends on the machine's speed; each one
    # the limit could not hold is gone from the workspace, with a note naming it.
    removed = re.findall(r"the disk: removed (shard_\d\.bin)", notes)
    kept = [p.name for p in work.glob("shard_*.bin")]
    assert removed and not set(removed) & set(kept), (removed, kept)
    assert len(removed) + len(kept) >= 3  # more than the 0.1 GiB limit holds (two 50 MiB shards)


@pytest.mark.integration
def test_a_run_whose_record_was_cut_mid_line_goes_on_when_the_same_command_runs_again(tmp_path, plumbing_cache):
    # A harness killed as it wrote a line (an older mlrb on a full disk did this): the record and the
    # trajectory end in half a line. The same command goes on with the run and finishes it.
    folder = killed_mid_agent(tmp_path, plumbing_cache)
    for name in ("record.jsonl", "trajectory.jsonl"):
        with open(folder / name, "a") as f:
            f.write('{"v": 1, "t": 1, "kind": "tags", "tags": {"mlrb.cut": "ha')
    again = subprocess.run(command_args(tmp_path, plumbing_cache), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_folders(tmp_path) == [folder]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.tags["mlrb.status"] == "ok" and "mlrb.cut" not in run.data.tags
    for name in ("record.jsonl", "trajectory.jsonl"):
        for line in (folder / name).read_text().splitlines():
            json.loads(line)
