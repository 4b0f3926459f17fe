"""Nothing of the agent works after its end, or while the harness's clock stands still, through
the real harness: a program that leaves a worker to change its work once it has exited, and a
model agent whose training job runs on while the workspace is scored mid-run
(`scoring.every_steps`). Before, the worker went on while the run scored its steps (the clock
paused) and swapped the submission, and the run counted it; the training job ran through every
mid-run scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_SUBMISSION, HARNESS_TASK, PLUMBING, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, reply, tool
from test_command_agent import command_override
from test_docker_sandbox import needs_docker

KEY = "sk-ant-agent-end-key-5150"

# The agent's program, on the cheapest real task (conftest's HARNESS_TASK, whose submission is the
# workspace's submission.csv, scored by its scripts/eval.py): an honest submission (the given train.py's
# predictions), then a worker detached from it that, a second after the program has exited, removes the
# submission and leaves a mark.
LEAVES_A_WORKER = f"""
import subprocess
subprocess.run({HARNESS_SUBMISSION!r}, shell=True, check=True)
worker = "import os, time; time.sleep(1); os.remove('submission.csv'); open('after_end.txt', 'w').write('late')"
subprocess.Popen(["python", "-c", worker], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("left a worker behind", flush=True)
"""


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def the_run(tmp_path, experiment: str = "llm_merging"):
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


@pytest.mark.parametrize("sandbox", [pytest.param("bwrap", marks=pytest.mark.integration),
                                     pytest.param("docker", marks=[pytest.mark.system, needs_docker])])  # fmt: skip
def test_a_worker_the_program_left_does_nothing_after_the_program_exits(tmp_path, cache_dir, sandbox):
    with FakeLlmServer([]) as server:
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(LEAVES_A_WORKER), "agent.options.model=claude-sonnet-4-5",
                         f"sandbox={sandbox}", "scoring.every_steps=1", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "left a worker behind" in (tmp_path / "run" / "agent" / "stdout.txt").read_text()
    work = tmp_path / "run" / "workspace"
    assert not (work / "after_end.txt").exists() and (work / "submission.csv").is_file()
    client, run = the_run(tmp_path, HARNESS_EXPERIMENT)
    assert run.data.tags["mlrb.status"] == "ok" and run.data.tags["mlrb.valid"] == "True"
    patch = client.download_artifacts(run.info.run_id, "workspace.patch", str(tmp_path / "artifacts"))
    assert "after_end.txt" not in Path(patch).read_text()


# A training job left running by the model's first command: a line with the time every 50 ms.
TICKER = "(setsid sh -c 'while true; do date +%s.%N >> ticks; sleep 0.05; done' >/dev/null 2>&1 &); echo started"


@pytest.mark.integration
def test_work_left_running_stands_still_while_the_workspace_is_scored_mid_run(tmp_path, plumbing_cache):
    script = [
        reply(tool("bash", command=TICKER)),
        reply(tool("bash", command="sleep 1")),
        reply(tool("bash", command='cp -r "$MLRB_DATA/base_model" submission')),
        # a workspace of its own to score again (the job, held still around each snapshot, may not
        # tick between two quick steps)
        reply(tool("bash", command="echo more > notes.txt")),
        reply(tool("submit", summary="the base model")),
    ]
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=claude",
                         "agent.options.retry_base_delay_s=0.01", "scoring.every_steps=1", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client, run = the_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "ok"
    # Each step was scored mid-run; those whose workspace held a submission were scored in a sandbox
    # of the scorer's own, seconds each: from the step's snapshot line to its anytime metrics in the
    # run's record. Meanwhile the job must have written nothing.
    reports = sorted((tmp_path / "run" / "anytime").glob("step-*/score_report.json"))
    scored = [int(r.parent.name.removeprefix("step-")) for r in reports if json.loads(r.read_text())["valid"]]
    assert len(scored) >= 2, reports
    times = [float(line) for line in (tmp_path / "run" / "workspace" / "ticks").read_text().split()]
    for step in scored:
        began = next(line["time"] for line in lines(tmp_path / "run" / "snapshots" / "steps.jsonl")
                     if line["step"] == step)  # fmt: skip
        logged = next(line["t"] for line in lines(tmp_path / "run" / "record.jsonl")
                      if line["kind"] == "metrics" and line["step"] == step and line["t"] >= began)  # fmt: skip
        assert logged - began >= 1.0, (step, began, logged)
        # a tick in the moment between the snapshot line and the hold may be there; none after
        assert not [t for t in times if began + 0.5 < t < logged], (step, began, logged)
    assert len(times) > 20  # it did run, before and between the scorings
    # and it ended with the agent: its last line is from before the run's record of the end
    ended = [json.loads(line) for line in (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()][-1]
    assert ended["event"] == "end" and times[-1] <= ended["time"]


# A checkpoint of 250 MB rewritten at each step: hashing it is the snapshot's work, most of a second.
CHECKPOINT = "head -c 250000000 /dev/zero | tr '\\\\0' '{}' > checkpoint.bin"


@pytest.mark.integration
def test_a_step_s_snapshot_is_not_on_the_agent_s_clock_and_work_left_running_stands_still_meanwhile(
    tmp_path, plumbing_cache
):
    """At paper scale a step's snapshot hashes the checkpoints the step rewrote (seconds per GB).
    That is the harness's time: the agent's clock stands still, and the job it left running too,
    so the snapshot is of one moment. Before, both ran on through every snapshot."""
    script = [reply(tool("bash", command=TICKER))]
    script += [reply(tool("bash", command=CHECKPOINT.format(mark))) for mark in "abc"]
    script += [reply(tool("submit", summary="nothing"))]
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=claude",
                         "agent.options.retry_base_delay_s=0.01", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    steps = lines(tmp_path / "run" / "snapshots" / "steps.jsonl")
    events = lines(tmp_path / "run" / "trajectory.jsonl")
    # The steps that rewrote the checkpoint, told by their command, not by how long their snapshot
    # took: on a quick disk one took 0.19 s. Together they must take long enough to mean something.
    rewrote = {e["step"] for e in events if e["event"] == "tool_call" and "checkpoint.bin" in str(e.get("arguments"))}
    slow = [s for s in steps if s["step"] in rewrote and "agent_s" in s]
    assert len(slow) == 3 and sum(s["took_s"] for s in slow) >= 0.3, [(s["step"], s["took_s"]) for s in steps]
    times = [float(line) for line in (tmp_path / "run" / "workspace" / "ticks").read_text().split()]
    assert len(times) > 20  # it did run, between the snapshots
    for entry in slow:  # (a tick in the moment before the hold may be there; none inside it)
        began, ended = entry["time"] - entry["took_s"], entry["time"]
        assert not [t for t in times if began + 0.1 < t < ended - 0.05], (entry["step"], began, ended)
    # The agent's clock: from one step's snapshot to the next, what the agent did in between,
    # without the snapshot that ended the first. Its commands' own time is in the trajectory.
    command_s = {e["step"]: e["duration_s"] for e in events if e["event"] == "tool_result"}
    for before, after in zip(steps, steps[1:], strict=False):
        if "agent_s" not in before or "agent_s" not in after:
            continue
        on_clock = after["agent_s"] - before["agent_s"]
        assert on_clock < command_s.get(after["step"], 0.0) + 0.5, (after["step"], on_clock, before["took_s"])
    client, run = the_run(tmp_path)
    wall = run.data.metrics["wall_time_s"]
    assert run.data.metrics["agent_time_s"] < wall - sum(s["took_s"] for s in slow) + 0.5
