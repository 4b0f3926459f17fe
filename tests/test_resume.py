"""A run whose process ends before the run is recorded (SIGKILL, a lost node, a job's time limit)
goes on where it was: the same command, run again, finds its folder and resumes it as one run
(mlrb/run_files/resume.py). The whole-run tests kill `python -m mlrb` with SIGKILL mid-agent, as a node
failure or the OOM killer would, then run the same command again. Their task is incidental: they run
the cheapest real task (conftest's HARNESS_TASK)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_SUBMISSION, HARNESS_TASK, mlflow_client, printed, store_args
from mlrb.core.budget import Budget
from mlrb.core.config import BudgetConfig
from mlrb.run_files import resume
from test_failures_runs import running_with

# The baseline agent's command. Its first attempt writes a mark and works on: a sleep no other process
# runs (found by its length, drawn in the sandbox and written to agent.sleeps once the sleep runs); an
# attempt that finds the mark makes the submission (the given train.py) and ends. The mark is in the
# workspace: what survives is what the agent left. A folder task's baseline command is also its baseline
# anchor, run when its assets are built whatever score the config states: there the workspace has no
# budget file, and the command only makes the submission. One command string for every test here: its
# assets are built once.
AGENT = (
    f'if [ ! -e "$MLRB_BUDGET_FILE" ]; then {HARNESS_SUBMISSION}; '
    f"elif [ -f mark ]; then echo found the mark; {HARNESS_SUBMISSION}; "
    "else echo first > mark; seconds=$((1000000 + $(od -An -N3 -tu4 /dev/urandom))); "
    "(sleep $seconds & echo $seconds > agent.sleeps; wait $!); fi"
)


def command_args(tmp_path: Path, cache: Path, *extra: str) -> list[str]:
    """The same command each time, with the run folders where a user's go (outputs/runs/<time>_...)."""
    stored = [a for a in store_args(tmp_path, cache) if not a.startswith("hydra.run.dir=")]
    return [sys.executable, "-m", "mlrb", *stored, *HARNESS_TASK, f"task.scales.folder.baseline_command='{AGENT}'",
            *extra]  # fmt: skip


def run_folders(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "outputs" / "runs").glob("*") if p.is_dir())


def killed_mid_agent(tmp_path: Path, cache: Path, *extra: str) -> Path:
    """Start the run, wait until its agent has left the mark in a run folder not there before
    and its progress was saved once more, then SIGKILL the harness: no word to anyone. Returns
    its run folder."""
    before = set(run_folders(tmp_path))
    process = subprocess.Popen(command_args(tmp_path, cache, *extra), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (marked := [f for f in run_folders(tmp_path) if f not in before and (f / "workspace" / "mark").exists()]):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the agent did not start: {process.communicate()[1][-3000:]}")
        time.sleep(0.2)
    time.sleep(resume.HEARTBEAT_S + 2)  # the agent's clock saved at least once past its start
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    return marked[0]


@pytest.mark.integration
def test_a_run_killed_with_sigkill_goes_on_where_it_was_when_the_same_command_runs_again(tmp_path, cache_dir):
    folder = killed_mid_agent(tmp_path, cache_dir)
    first = json.loads((folder / resume.PROGRESS).read_text())
    assert first["steps"] == 1 and first["agent_time_s"] >= resume.HEARTBEAT_S

    again = subprocess.run(command_args(tmp_path, cache_dir), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_folders(tmp_path) == [folder]  # the second command went on in the first one's folder

    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.tags["mlrb.status"] == "ok" and "score" in run.data.metrics
    assert f"mlflow run {run.info.run_id}" in again.stdout
    # its spend carried: the first attempt's step and clock, then its own
    assert run.data.metrics["steps"] == 2
    assert run.data.metrics["agent_time_s"] >= first["agent_time_s"]
    events = [json.loads(line) for line in (folder / "trajectory.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds.count("start") == 1 and kinds.count("resume") == 1 and kinds.count("end") == 1
    resumed = events[kinds.index("resume")]
    assert resumed["attempt"] == 2 and resumed["workspace"] == "as it was"
    assert resumed["spent"]["steps"] == 1 and "ended before the run was recorded" in resumed["why"]
    assert [printed(e).splitlines()[0] for e in events if e["event"] == "tool_result"] == ["found the mark"]
    # the record holds both attempts, in the one run
    opened = [json.loads(line) for line in (folder / "record.jsonl").read_text().splitlines()]
    assert [(o["run_id"], o["attempt"]) for o in opened if o["kind"] == "opened"] == [
        (run.data.tags["mlrb.run_id"], 1),
        (run.data.tags["mlrb.run_id"], 2),
    ]
    assert (folder / "workspace" / "mark").read_text() == "first\n"


@pytest.mark.integration
def test_resume_false_starts_over_in_a_run_of_its_own(tmp_path, cache_dir):
    folder = killed_mid_agent(tmp_path, cache_dir)
    record_before = (folder / "record.jsonl").read_text()
    # started over: a folder of its own, whose agent finds no mark and leaves one (stopped here)
    over = killed_mid_agent(tmp_path, cache_dir, "resume=false")
    assert over != folder and (over / "workspace" / "mark").is_file()
    assert (folder / "record.jsonl").read_text() == record_before  # the run begun before is left as it was
    opened = [json.loads(line) for line in (over / "record.jsonl").read_text().splitlines()]
    assert opened[0]["attempt"] == 1 and opened[0]["run_id"] != json.loads(record_before.splitlines()[0])["run_id"]


# ---- a SLURM job killed with its processes one by one --------------------------------------------

# As a submitit job runs the harness: SLURM's job id in its environment, and a launcher's own SIGTERM
# handler, which lets the job go on (submitit's ignores SIGTERM and acts on its warning signal).
AS_SLURM_JOB = ("import runpy, signal, sys; signal.signal(signal.SIGTERM, lambda signum, frame: None); "
                "sys.argv = ['mlrb', *sys.argv[1:]]; runpy.run_module('mlrb', run_name='__main__')")  # fmt: skip


# The same, with submitit's way of requeuing the job on SLURM's SIGUSR2 (`scontrol requeue`, then exit),
# as it goes when SLURM's SIGTERM to the job's processes kills that `scontrol` before it exits.
AS_REQUEUED_SLURM_JOB = """
import runpy, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda signum, frame: None)
def requeue(signum, frame):
    subprocess.check_call(["sh", "-c", "kill -TERM $$"])
    sys.exit(-1)
signal.signal(signal.SIGUSR2, requeue)
sys.argv = ["mlrb", *sys.argv[1:]]
runpy.run_module("mlrb", run_name="__main__")
"""


def as_slurm_job(tmp_path: Path, cache: Path, agent: str = AGENT, driver: str = AS_SLURM_JOB) -> subprocess.Popen:
    args = command_args(tmp_path, cache, f"task.scales.folder.baseline_command='{agent}'")[3:]
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    return subprocess.Popen([sys.executable, "-c", driver, *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip


def wait_for(what, process: subprocess.Popen, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"not seen in time: {process.communicate()[1][-3000:]}")
        time.sleep(0.2)
    return found


def sleeping_for(tmp_path: Path) -> str:
    """The length of the sleep AGENT's first attempt runs (its own: found by it), once it runs."""
    for folder in run_folders(tmp_path):
        if (sleeps := folder / "workspace" / "agent.sleeps").exists() and (seconds := sleeps.read_text().strip()):
            return seconds
    return ""


@pytest.mark.integration
def test_an_agent_killed_by_its_job_s_sigterm_before_the_harness_hears_goes_on_in_the_requeued_job(tmp_path, cache_dir):
    # SLURM kills a job's processes one by one (a requeue, a lost node). The agent's command dies of its
    # SIGTERM first: that is not the agent's error, and the run goes on when the job runs again.
    process = as_slurm_job(tmp_path, cache_dir)
    sleep = wait_for(lambda: sleeping_for(tmp_path), process)  # a sleep of its own: other tests' agents sleep too
    (sleeping,) = wait_for(lambda: running_with(f"sleep\0{sleep}"), process)
    time.sleep(resume.HEARTBEAT_S + 1)  # its progress saved past the start
    os.kill(int(sleeping), signal.SIGTERM)  # the agent's command first: it exits 143
    time.sleep(1)
    os.kill(process.pid, signal.SIGTERM)  # then the harness, whose launcher lets it go on
    folder = wait_for(lambda: [f for f in run_folders(tmp_path)
                               if any("waiting up to" in log.read_text() for log in f.glob("*.log"))], process)[0]  # fmt: skip
    os.killpg(process.pid, signal.SIGKILL)  # SLURM's SIGKILL, once its kill wait is over
    process.communicate(timeout=60)

    again = subprocess.run(command_args(tmp_path, cache_dir), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.tags["mlrb.status"] == "ok" and "score" in run.data.metrics
    assert run_folders(tmp_path) == [folder] and (folder / "workspace" / "mark").read_text() == "first\n"


@pytest.mark.integration
def test_a_job_whose_requeue_is_cut_short_by_its_own_sigterm_goes_on_in_the_requeued_job(tmp_path, cache_dir):
    # SLURM's SIGUSR2 ahead of a time limit reaches every process of the job: the harness (whose
    # launcher requeues the job), its recording process and the agent's command alike.
    process = as_slurm_job(tmp_path, cache_dir, driver=AS_REQUEUED_SLURM_JOB)
    sleep = wait_for(lambda: sleeping_for(tmp_path), process)
    wait_for(lambda: running_with(f"sleep\0{sleep}"), process)
    time.sleep(resume.HEARTBEAT_S + 1)
    os.killpg(process.pid, signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    (folder,) = run_folders(tmp_path)
    assert "failed" not in err and "died of the job's own SIGTERM" in (folder / "mlrb.log").read_text(), err[-3000:]
    assert not resume.ended(folder)  # suspended, not failed: the requeued job goes on in it
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    # the recording process outlived the job's SIGUSR2: the store was told why the attempt ended
    assert run.info.status == "RUNNING" and "requeued" in run.data.tags["mlrb.attempt_ended"]

    again = subprocess.run(command_args(tmp_path, cache_dir), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.tags["mlrb.status"] == "ok" and run_folders(tmp_path) == [folder]


@pytest.mark.integration
def test_an_agent_that_kills_itself_with_sigterm_under_slurm_is_still_its_own_error(tmp_path, cache_dir):
    # Dying of SIGTERM is not a way to a second attempt: the job's own signal never came. (Where its assets
    # are built, the baseline anchor's run has no budget file: there the command makes the submission.)
    kills_itself = f'if [ -e "$MLRB_BUDGET_FILE" ]; then kill -TERM $$; else {HARNESS_SUBMISSION}; fi'
    process = as_slurm_job(tmp_path, cache_dir, kills_itself)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.status"] == "agent_error"
    assert "exited 143" in run.data.tags["mlrb.agent_message"] and run.data.tags["mlrb.attempt"] == "1"


# ---- who owns a run folder ---------------------------------------------------------------------


def claimed(tmp_path: Path, owner: resume.Owner, ended: bool = False) -> Path:
    """A run folder claimed by OWNER, begun (a record), ended or not."""
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    resume.write_owner(folder, owner)
    lines = [{"v": 1, "t": 0, "kind": "opened", "run_id": "r1", "attempt": 1, "tags": {}}]
    if ended:
        lines.append({"v": 1, "t": 1, "kind": "status", "status": "FINISHED"})
    (folder / "record.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.fast
def test_a_run_whose_process_lives_is_never_taken_over(tmp_path):
    mine = resume.me("key", None)
    assert not resume.resumable(claimed(tmp_path, mine), "key", None)


@pytest.mark.fast
def test_a_run_whose_process_ended_is_resumed_only_by_its_own_config_and_sweep(tmp_path):
    gone = resume.Owner("key", "", socket.gethostname(), dead_pid(), "123", "")
    folder = claimed(tmp_path, gone)
    assert resume.resumable(folder, "key", None)
    assert not resume.resumable(folder, "another-key", None)  # another config's run
    assert not resume.resumable(folder, "key", "sweep1")  # a sweep's job is not a single run's


@pytest.mark.fast
def test_a_reused_process_id_is_not_taken_for_the_run_s_process(tmp_path):
    # this process's PID, but a start time that is not its own: the run's process ended long ago
    reused = resume.Owner("key", "", socket.gethostname(), os.getpid(), "1", "")
    assert resume.resumable(claimed(tmp_path, reused), "key", None)


@pytest.mark.fast
def test_a_run_recorded_to_its_end_is_never_resumed(tmp_path):
    gone = resume.Owner("key", "", socket.gethostname(), dead_pid(), "123", "")
    assert not resume.resumable(claimed(tmp_path, gone, ended=True), "key", None)


@pytest.mark.fast
def test_another_host_s_run_is_resumed_by_its_requeued_slurm_job_or_once_its_heartbeat_stopped(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    requeued = resume.Owner("key", "s", "node-17", 99, "1", "4242")
    assert resume.resumable(claimed(tmp_path, requeued), "key", "s")  # the same job, requeued onto this node
    other = resume.Owner("key", "s", "node-17", 99, "1", "777")
    folder = claimed(tmp_path, other)
    assert not resume.resumable(folder, "key", "s")  # another job may be running it there now
    stale = time.time() - resume.STALE_AFTER_S - 60
    os.utime(folder / resume.CLAIM, (stale, stale))
    assert resume.resumable(folder, "key", "s")  # its node went away: no heartbeat for long


@pytest.mark.fast
def test_two_processes_resuming_one_run_at_once_one_gets_it(tmp_path):
    folder = claimed(tmp_path, resume.Owner("key", "", socket.gethostname(), dead_pid(), "123", ""))
    assert resume.take_over(folder, "key", None, attempt=2)
    assert not resume.take_over(folder, "key", None, attempt=2)
    assert resume.read_owner(folder) == resume.me("key", None)


# ---- the budget goes on, not over -------------------------------------------------------------


@pytest.mark.fast
def test_a_carried_budget_goes_on_from_what_was_spent():
    budget = Budget(BudgetConfig(name="t", wall_time_s=100, max_steps=10, max_usd=1.0))
    budget.carry({"steps": 4, "input_tokens": 10, "output_tokens": 5, "cost_usd": 0.25, "agent_time_s": 60})
    assert budget.steps == 4 and budget.usd == 0.25
    assert 39 < budget.remaining_s() <= 40
    spent = Budget(BudgetConfig(name="t", wall_time_s=100, max_steps=10, max_usd=1.0))
    spent.carry({"steps": 4, "input_tokens": 10, "output_tokens": 5, "cost_usd": 1.0, "agent_time_s": 60})
    assert spent.exhausted() == "usd"


@pytest.mark.fast
def test_a_budget_spent_in_earlier_attempts_leaves_none_for_the_next():
    budget = Budget(BudgetConfig(name="t", wall_time_s=100, max_steps=10))
    budget.carry({"steps": 1, "agent_time_s": 100})
    assert budget.exhausted() == "wall_time"


@pytest.mark.fast
def test_progress_is_saved_on_every_step_and_charge_with_what_calls_in_flight_hold(tmp_path):
    from mlrb.core.budget import Spend

    budget = Budget(BudgetConfig(name="t", wall_time_s=100, max_steps=10, max_usd=1.0))
    keeper = resume.Keeper(tmp_path, 1, budget)
    with keeper.running():
        budget.record_step()
        assert resume.load(tmp_path).steps == 1
        hold = Spend(100, 50, 0.02)
        assert budget.reserve(hold) is None
        budget.record_step()  # a step's save while a call is in flight: what it holds is saved too
        saved = resume.load(tmp_path)
        assert (saved.steps, saved.held_usd, saved.held_input_tokens) == (2, 0.02, 100)
        budget.settle(hold, Spend(80, 40, 0.015))
        saved = resume.load(tmp_path)
        assert (saved.cost_usd, saved.held_usd, saved.input_tokens) == (0.015, 0.0, 80)


# ---- each agent goes on with its own state -------------------------------------------------

KEY = "sk-ant-resume-test-key"


@pytest.mark.integration
def test_the_built_in_agent_goes_on_with_its_conversation_and_pays_for_no_call_twice(tmp_path, cache_dir):
    from fake_llm_server import FakeLlmServer, reply, tool

    args = [sys.executable, "-m", "mlrb", *store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=claude"]
    first_script = [
        reply(tool("write_file", path="notes.txt", content="tried the mean merge\n"), usage=(1000, 50)),
        reply(tool("bash", command="sleep 3000"), usage=(1200, 30)),  # killed while this runs
    ]
    with FakeLlmServer(first_script) as server:
        env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while len(server.requests) < 2 or not (tmp_path / "run" / "workspace" / "notes.txt").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(2)  # the sleep under way
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
    first_calls = [r["body"] for r in server.requests]

    with FakeLlmServer([reply(tool("submit", summary="done"), usage=(1500, 20))]) as server:
        env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url}
        again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    (resumed_call,) = [r["body"] for r in server.requests]  # one call: none of the first attempt's again
    messages = resumed_call["messages"]
    # the conversation goes on: the first attempt's two replies, then the stopped call and the note
    assert messages[: len(first_calls[1]["messages"])] == first_calls[1]["messages"]
    uses = [part for m in messages if m["role"] == "assistant" for part in m["content"] if part["type"] == "tool_use"]
    assert [u["name"] for u in uses] == ["write_file", "bash"]
    last = messages[-1]["content"]
    assert last[0]["type"] == "tool_result" and last[0]["tool_use_id"] == uses[1]["id"] and last[0]["is_error"]
    assert "goes on now, attempt 2" in json.dumps(last)

    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    # the two calls of the first attempt are charged once, with the third
    assert run.data.metrics["input_tokens"] == 1000 + 1200 + 1500 and run.data.metrics["steps"] == 3
    # kept where the harness alone writes it: the run folder, not the state folder the sandbox mounts
    assert (tmp_path / "run" / "conversation.json").is_file()
    assert not any((tmp_path / "run" / resume.AGENT_STATE).iterdir())


def killed_mid_tool_then_resumed(tmp_path: Path, cache: Path, agent: str, key_env: dict, first: list, second: list,
                                 url: str, marker: Path):  # fmt: skip
    """Run AGENT against a scripted API (FIRST), SIGKILL the harness once MARKER exists and the
    script is spent (its last call runs a long command), then run the same command against SECOND.
    Returns (the first server's requests, the second's, the second run's result)."""
    from fake_llm_server import FakeLlmServer

    args = [sys.executable, "-m", "mlrb", *store_args(tmp_path, cache), *HARNESS_TASK, f"agent={agent}"]
    with FakeLlmServer(first) as server:
        env = {**os.environ, **key_env, url: getattr(server, "anthropic_url" if "ANTHROPIC" in url else "openai_url")}
        process = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while len(server.requests) < len(first) or not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(resume.HEARTBEAT_S)  # the long command under way
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
    with FakeLlmServer(second) as again_server:
        env[url] = getattr(again_server, "anthropic_url" if "ANTHROPIC" in url else "openai_url")
        again = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    return server.requests, again_server.requests, again


# A command that runs until the kill (Claude Code refuses a bare `sleep`).
LONG = "python -c 'import time; time.sleep(3000)'"


# Each program's scripted turns: a note written, then a long command the kill cuts; what it is
# given (its key and endpoint variables), and where its request holds the conversation.
SESSIONS = {
    "claude_code": (lambda tool: [tool("Bash", command="echo tried the mean > notes.txt", description="note"),
                                  tool("Bash", command=LONG, description="wait")],
                    "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "messages"),
    "codex": (lambda tool: [tool("exec_command", cmd="echo tried the mean > notes.txt"),
                            tool("exec_command", cmd=LONG, yield_time_ms=300_000)],
              "OPENAI_API_KEY", "OPENAI_BASE_URL", "input"),
}  # fmt: skip


@pytest.mark.system
@pytest.mark.parametrize("agent", sorted(SESSIONS))
def test_claude_code_and_codex_go_on_in_their_own_sessions(tmp_path, cache_dir, agent):
    from fake_llm_server import reply, tool

    calls, key_env, url_env, field = SESSIONS[agent]
    note, long = calls(tool)
    first, second = (
        [reply(note, usage=(3000, 50)), reply(long, usage=(3100, 30))],
        [reply(text="Done.", usage=(3300, 10))],
    )
    before, after, again = killed_mid_tool_then_resumed(
        tmp_path, cache_dir, agent, {key_env: KEY}, first, second, url_env,
        tmp_path / "run" / "workspace" / "notes.txt",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    (call,) = after  # its one call goes on from the session: the first attempt's turns are in it
    sent = json.dumps(call["body"][field])
    assert "echo tried the mean > notes.txt" in sent and "time.sleep(3000)" in sent and "attempt 2" in sent
    if agent == "claude_code":  # its first message is the task's prompt, as first sent
        assert json.dumps(before[0]["body"]["messages"][0]["content"])[:200] in sent
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2"
    assert run.data.metrics["llm.input_tokens"] == 3000 + 3100 + 3300
    assert (tmp_path / "run" / "agent" / "stdout.attempt-2.txt").exists()


@pytest.mark.integration
def test_a_program_of_your_own_is_told_it_resumes_and_keeps_its_state_folder(tmp_path, cache_dir):
    program = tmp_path / "agent"
    program.mkdir()
    (program / "a.sh").write_text(
        'echo "attempt ${MLRB_ATTEMPT:-1} resumed=${MLRB_RESUMED:-0}" >> "$MLRB_STATE_DIR/log"\n'
        'if [ -n "$MLRB_RESUMED" ]; then cp "$MLRB_STATE_DIR/log" seen.txt; echo "$MLRB_RESUME_NOTE" > note.txt; '
        f"{HARNESS_SUBMISSION}; else touch mark; sleep 3000; fi\n"
    )
    extra = (
        "agent=command",
        f"agent.options.program_dir={program}",
        "agent.options.command='bash $MLRB_AGENT_DIR/a.sh'",
    )
    env = {"ANTHROPIC_API_KEY": KEY}
    args = [a for a in command_args(tmp_path, cache_dir, *extra) if not a.startswith("task.scales.folder.baseline")]
    process = subprocess.Popen(args, cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not list((tmp_path / "outputs" / "runs").glob("*/workspace/mark")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    again = subprocess.run(args, cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    (folder,) = run_folders(tmp_path)
    assert (folder / "workspace" / "seen.txt").read_text() == "attempt 1 resumed=0\nattempt 2 resumed=1\n"
    assert "goes on now, attempt 2" in (folder / "workspace" / "note.txt").read_text()
    assert (folder / resume.AGENT_STATE / "log").is_file()  # in the run folder, out of the workspace


@pytest.mark.fast
def test_a_workspace_that_is_gone_comes_back_as_its_last_step_s_snapshot(tmp_path):
    from mlrb.run import resumed_workspace
    from mlrb.run_files import snapshots, workspace

    start, work = tmp_path / "start", tmp_path / "run" / "workspace"
    start.mkdir()
    (start / "train.py").write_text("print('starter')\n")
    before = workspace.prepare(start, work)
    steps = snapshots.StepSnapshots(tmp_path / "run" / "snapshots")
    (work / "train.py").write_text("print('step 1')\n")
    steps.take(1, work, before, 10.0)
    (work / "notes.txt").write_text("step 2's\n")
    steps.take(2, work, before, 20.0)
    (work / "unsaved.txt").write_text("after the last step: lost with the node\n")

    assert resumed_workspace(start, work, steps.root)[1] == "as it was"  # the folder survived: as it is
    assert (work / "unsaved.txt").exists()
    shutil.rmtree(work)  # a node's local disk, gone
    again, found = resumed_workspace(start, work, steps.root)
    assert found == "from step 2's snapshot"
    assert (work / "train.py").read_text() == "print('step 1')\n" and (work / "notes.txt").read_text() == "step 2's\n"
    assert not (work / "unsaved.txt").exists()
    assert again.hashes == before.hashes  # the patch is still taken against the starting files
    shutil.rmtree(work)
    shutil.rmtree(steps.root)
    assert resumed_workspace(start, work, steps.root)[1] == "from its starting files"
    assert (work / "train.py").read_text() == "print('starter')\n"
