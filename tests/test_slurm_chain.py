"""The paper's run on a cluster whose jobs are shorter than its budget: on the one-node SLURM
cluster, a run whose budget is longer than the partition's time limit finishes in a chain of
jobs as one run (mlrb/sweep.py `chain_of`, mlrb/run_files/resume.py), and a job killed without warning
and requeued goes on where it was."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import PLUMBING
from mlrb.sweep import PROFILES_DIR
from test_sweeps import own_slurm_jobs, runs_by_role, slurm_problem, sweep_args

pytestmark = [pytest.mark.system, pytest.mark.skipif(bool(slurm_problem()), reason=slurm_problem() or "slurm ok")]

MERGE = 'python merge.py --data "$MLRB_DATA" --output submission'
# A valid submission first, then work that goes on until the budget stops it: a line a second
# into the workspace, each saying which attempt of the run wrote it (the mark counts them).
WORKER = f"{MERGE} && n=$(( $(cat attempts 2>/dev/null || echo 0) + 1 )) && echo $n > attempts && " \
         "while true; do echo $n >> ticks; sleep 1; done"  # fmt: skip
BUDGET_S = 150


def short_partition(tmp_path: Path, **changes) -> Path:
    """The one-node cluster's profile, with jobs capped at 2 minutes (unless CHANGES say otherwise)."""
    profile = yaml.safe_load((PROFILES_DIR / "local_single_node.yaml").read_text())
    profile.update({"time_limit_min": 2, "signal_delay_s": 30, "overhead_min": 1, "max_requeues": 1, **changes})
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def sweep(tmp_path: Path, cache: Path, profile: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mlrb", "-m", "seed=5", "launcher=slurm", f"hydra.launcher.cluster={profile}",
         PLUMBING, "task.scales.tiny.hardware.cpus=1", "tracking.allow_sqlite_on_slurm=true",
         f"budget.wall_time_s={BUDGET_S}", f"task.scales.tiny.baseline_command='{WORKER}'",
         *sweep_args(tmp_path, cache)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


RELEASE_AFTER_S = 3.0  # a requeued job held this long is released


def release_requeued_until_done(tmp_path: Path, process: subprocess.Popen, timeout: float) -> str:
    """SLURM holds a requeued job back for about two minutes (its begin time): let each start
    at once, as an administrator would, until the sweep ends. Returns its output."""
    deadline = time.monotonic() + timeout
    held: dict[str, float] = {}  # each held job, when first seen held
    try:
        while process.poll() is None and time.monotonic() < deadline:
            for job in own_slurm_jobs(tmp_path):
                state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True)
                if not (state.stdout.startswith("PENDING") and "BeginTime" in state.stdout):
                    held.pop(job, None)
                # Not at once: released within milliseconds of its requeue, SLURM started the job while
                # its last run's credential was being revoked, and killed it ("Job credential revoked").
                elif time.monotonic() - held.setdefault(job, time.monotonic()) >= RELEASE_AFTER_S:
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True)
            time.sleep(1)
        out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return out
    finally:  # a failed test leaves no sweep or job behind to hold the cluster's CPUs
        if process.poll() is None:
            process.kill()
        for job in own_slurm_jobs(tmp_path):
            subprocess.run(["scancel", job])


def test_a_run_twice_as_long_as_its_partition_allows_finishes_in_a_chain_of_jobs_as_one_run(tmp_path, plumbing_cache):
    profile = short_partition(tmp_path)
    out = release_requeued_until_done(tmp_path, sweep(tmp_path, plumbing_cache, profile), timeout=900)

    _, _, children = runs_by_role(tmp_path)
    (run,) = children  # one run, however many jobs
    assert run.info.status == "FINISHED", out[-3000:]
    assert int(run.data.tags["mlrb.attempt"]) >= 2  # it took more than one job
    assert run.data.tags["mlrb.valid"] == "True" and "score" in run.data.metrics
    # the budget went on, not over: the agent's time is its budget's, not twice it
    assert run.data.tags["mlrb.stop_reason"] == "wall_time"
    assert abs(run.data.metrics["agent_time_s"] - BUDGET_S) <= 0.05 * BUDGET_S, run.data.metrics["agent_time_s"]
    folder = Path(run.data.tags["mlrb.run_dir"])
    ticks = (folder / "workspace" / "ticks").read_text().split()
    assert ticks[0] == "1" and ticks[-1] != "1"  # the first job's work is in the final workspace, and went on
    events = [json.loads(line) for line in (folder / "trajectory.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes and "requeued" in resumes[0]["why"]
    assert "1 jobs:" in out and "1 done, 0 failed" in out  # the sweep counts the chained run once


def test_a_job_killed_without_warning_and_requeued_goes_on_where_it_was(tmp_path, plumbing_cache):
    # No time limit to speak of: SLURM requeues the running job itself (as after a node failure),
    # which kills it with no signal that submitit or mlrb could act on first.
    profile = short_partition(tmp_path, time_limit_min=None, overhead_min=5)
    process = sweep(tmp_path, plumbing_cache, profile)
    try:
        ticks = tmp_path / "sweep" / "0_llm_merging_baseline_5" / "workspace" / "ticks"
        deadline = time.monotonic() + 300
        while not (ticks.exists() and len(ticks.read_text().split()) >= 15):  # the agent has worked a while
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
            time.sleep(1)
        (job,) = own_slurm_jobs(tmp_path)
        subprocess.run(["scontrol", "requeue", job], check=True)
    except BaseException:
        process.kill()
        raise
    out = release_requeued_until_done(tmp_path, process, timeout=600)

    _, _, children = runs_by_role(tmp_path)
    (run,) = children
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2", out[-3000:]
    assert run.data.tags["mlrb.valid"] == "True" and run.data.tags["mlrb.stop_reason"] == "wall_time"
    folder = Path(run.data.tags["mlrb.run_dir"])
    assert (folder / "workspace" / "ticks").read_text().split()[:15] == ["1"] * 15  # the first job's work kept
    events = [json.loads(line) for line in (folder / "trajectory.jsonl").read_text().splitlines()]
    (resumed,) = [e for e in events if e["event"] == "resume"]
    assert "ended before the run was recorded" in resumed["why"] and resumed["spent"]["agent_time_s"] >= 10
    # the budget went on: the time the first job's agent worked is carried (less at most one heartbeat)
    assert BUDGET_S - 10 <= run.data.metrics["agent_time_s"] <= BUDGET_S * 1.05
