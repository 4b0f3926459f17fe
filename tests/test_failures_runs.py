"""Every failure attributed and survived, in whole runs through `python -m mlrb` (of the default
task; the signals' of the cheapest one, HARNESS_TASK, as their task is incidental): broken
submissions are the agent's (invalid, FINISHED), a model server answering garbage is the
agent's (agent_error, the workspace still scored), signals stop a run as killed with one line,
identical runs started together keep their own folders, and a password in the tracking URI is
written nowhere."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, PLUMBING, mlflow_client, only_run, printed, run_cli, store_args
from test_failures import garbage_server

pytestmark = pytest.mark.integration

# A valid submission to break, made the cheapest way: a copy of the given base model (a merge's
# torch and transformers would take about 5 CPU s of a run whose subject is the breakage).
VALID = 'cp -r "$MLRB_DATA/base_model" submission'
# The runs here are at the plumbing scale (PLUMBING), which extends tiny: an override of tiny's
# values (task.scales.tiny.baseline_command) is theirs too.


def mlrb_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("mlrb:")]


# ---- 1. a submission that cannot be loaded or scored is invalid: the agent's failure ---------


BREAK_CONFIG = "import json; open('submission/config.json', 'w').write('[1]')"
# weights that do not fit the config: the folder's files pass the rules, loading the model fails
BREAK_WEIGHTS = """import json
config = json.load(open('submission/config.json'))
config['intermediate_size'] += 8
json.dump(config, open('submission/config.json', 'w'))"""


@pytest.mark.parametrize(
    "breakage, reason",
    [
        (BREAK_CONFIG, "config.json must hold a JSON object, not a list"),
        (BREAK_WEIGHTS, "the model cannot be loaded with transformers: "),
    ],
    ids=["config-not-an-object", "weights-do-not-fit-config"],
)
def test_a_broken_submission_is_invalid_and_finished_not_an_infrastructure_error(tmp_path, plumbing_cache, breakage,
                                                                                   reason):  # fmt: skip
    # The agent's sandbox sees its workspace only: the script comes inside the command.
    script = base64.b64encode(breakage.encode()).decode()
    result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING,
                     f"task.scales.tiny.baseline_command='{VALID} && echo {script} | base64 -d | python'",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = only_run(tmp_path, "llm_merging")
    assert run.info.status == "FINISHED"  # counted, and never run again by a re-launched sweep
    tags = run.data.tags
    assert (tags["mlrb.status"], tags["mlrb.valid"]) == ("invalid", "False")
    assert tags["mlrb.invalid_reason"].startswith(reason), tags["mlrb.invalid_reason"]
    assert run.data.metrics["valid"] == 0.0 and "score" not in run.data.metrics
    assert "invalid" in result.stdout


# ---- 2. a model server that answers 200 with something that is not JSON --------------------


def test_a_model_server_answering_garbage_is_an_agent_error_and_the_workspace_is_scored(tmp_path, plumbing_cache):
    with garbage_server() as url:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=openai_compatible",
                         f"agent.options.base_url={url}/v1", "agent.options.model=local", "agent.options.max_retries=1",
                         "agent.options.retry_base_delay_s=0.01", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client, run = only_run(tmp_path, "llm_merging")
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["mlrb.status"] == "agent_error"
    message = tags["mlrb.agent_message"]
    assert f"openai API at {url}/v1 answered with something that is not an API reply: <html>" in message
    assert "gave up after 2 attempts" in message
    # scored all the same: the scorer judged what the workspace held (nothing at 'submission')
    assert tags["mlrb.valid"] == "False" and tags["mlrb.invalid_reason"].startswith("no submission")
    assert "score_report.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


# ---- 3, 8. signals: the agent stops, the workspace is scored, the run is killed, one line ----


def as_in_a_terminal() -> None:
    """Ctrl-C's SIGINT and a closed terminal's SIGHUP at their default dispositions, as in a
    terminal: tests started under `nohup` or in a shell's background would hand the run
    ignored ones, which mlrb rightly leaves ignored."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(tmp_path: Path, cache: Path, *task: str) -> subprocess.Popen:
    """`python -m mlrb` with TASK's overrides, started as a user starts it (not warm: signals reach it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mlrb", *store_args(tmp_path, cache), *task],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_in_a_terminal,
    )  # fmt: skip


def wait_for_file(path: Path, process: subprocess.Popen, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.communicate()[1][-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def running_with(marker: str) -> list:
    """Host processes (not zombies) whose command line holds MARKER. Found by their command
    line, not a PID: the sandbox may give its processes PIDs of their own namespace."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                state = (proc / "stat").read_text().split(")")[-1].split()[0]
                if state not in ("Z", "X"):
                    found.append(proc.name)
        except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
            continue
    return found


def once_running(marker: str, process: subprocess.Popen, count: int = 1, timeout: float = 60) -> list:
    """`running_with(MARKER)` once it finds COUNT processes. An agent's `(sleep N & echo N > file)` writes
    its file just after the fork, and the forked shell may become the sleep a moment later: seconds
    later on a loaded machine."""
    deadline = time.monotonic() + timeout
    while len(found := running_with(marker)) < count:
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"no process ran {marker!r} within {timeout} s"
        time.sleep(0.1)
    return found


# The signals' runs: the baseline agent (whose scorer starts with it) on the cheapest task (HARNESS_TASK),
# its task incidental. Its command: the given train.py (a valid submission), then a sleep no other
# process runs (found by its length, drawn in the sandbox and written to agent.started), until the
# signal. A folder task's baseline command is also its baseline anchor, run when its assets are built
# whatever score the config states: there the workspace has no budget file yet, and it ends after
# train.py. One command string for every test here: its assets are built once.
SLEEPS_AFTER_ITS_SUBMISSION = (
    'python train.py && if [ -e "$MLRB_BUDGET_FILE" ]; then seconds=$((1000000 + $(od -An -N3 -tu4 /dev/urandom))); '
    "(sleep $seconds & echo $seconds > agent.started; wait); fi"
)


def stopped_by(signum: int, tmp_path: Path, cache: Path):
    """A run whose agent makes its submission, then starts a long command; SIGNUM to the harness once
    the command runs. Returns (exit code, stdout, stderr, the agent's processes left, seconds to stop)."""
    started_file = tmp_path / "run" / "workspace" / "agent.started"  # the agent sees its workspace only
    process = start_run(tmp_path, cache, *HARNESS_TASK,
                        f"task.scales.folder.baseline_command='{SLEEPS_AFTER_ITS_SUBMISSION}'")  # fmt: skip
    seconds = wait_for_file(started_file, process)
    once_running(f"sleep\0{seconds}", process)  # the agent's command runs
    sent = time.monotonic()
    process.send_signal(signum)
    out, err = process.communicate(timeout=300)
    took = time.monotonic() - sent
    # The sandbox's processes are killed, not waited for: the kernel ends them just after the
    # harness (a second, or a few on a loaded machine).
    deadline = time.monotonic() + 10
    while running_with(f"sleep\0{seconds}") and time.monotonic() < deadline:
        time.sleep(0.2)
    return process.returncode, out, err, running_with(f"sleep\0{seconds}"), took


def test_ctrl_c_kills_the_agent_scores_its_workspace_and_records_the_run_killed(tmp_path, cache_dir):
    code, out, err, left, took = stopped_by(signal.SIGINT, tmp_path, cache_dir)
    assert code == 128 + signal.SIGINT, err[-3000:]
    assert left == [] and took < 120  # the agent's command did not outlive the run
    assert "Traceback" not in out + err
    client, run = only_run(tmp_path, HARNESS_EXPERIMENT)
    (line,) = mlrb_lines(err)
    assert line.startswith(
        f"mlrb: run interrupted by SIGINT; recorded as killed (workspace scored: {run.data.metrics['score']:.4f}"
    )
    assert line.endswith(f"mlflow run {run.info.run_id}")
    assert run.info.status == "KILLED"  # not FINISHED: a re-launched sweep runs it again
    tags = run.data.tags
    assert (tags["mlrb.status"], tags["mlrb.stop_reason"], tags["mlrb.valid"]) == ("killed", "SIGINT", "True")
    assert "score" in run.data.metrics  # the submission written before the signal was scored


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_kill_or_a_closed_terminal_stop_the_run_to_go_on_later_in_one_line(tmp_path, cache_dir, signum):
    # `kill`, `timeout`, a closed terminal: the environment stopped the run, not its user; it is
    # left unended, to go on where it was when the same command runs again (tests/test_resume.py)
    code, out, err, left, took = stopped_by(signum, tmp_path, cache_dir)
    assert code == 128 + signum, err[-3000:]
    assert left == [] and took < 120
    assert "Traceback" not in out + err
    client, run = only_run(tmp_path, HARNESS_EXPERIMENT)
    (line,) = mlrb_lines(err)
    name = signal.Signals(signum).name
    assert line == (f"mlrb: run stopped by {name} before its end; run the same command again to go on where it "
                    f"stopped (resume=false starts over); mlflow run {run.info.run_id}")  # fmt: skip
    assert run.info.status == "RUNNING" and run.data.tags["mlrb.attempt_ended"] == f"{name} stopped it"
    assert "score" not in run.data.metrics and "mlrb.status" not in run.data.tags  # nothing decided yet
    record = [json.loads(line) for line in (tmp_path / "run" / "record.jsonl").read_text().splitlines()]
    assert "status" not in {line["kind"] for line in record}  # its end is not recorded: it goes on later


# ---- 6, 7. identical runs started together: one new store, a folder each ------------------


def test_identical_runs_started_in_the_same_second_get_their_own_folders_and_trajectories(tmp_path, plumbing_cache):
    # Same config, same seed, same Hydra run folder, and a store neither has created yet.
    # Both commands are sent at once, from two threads, and forked from the same warm process (tests/warm_start.py).
    command = "echo I am $(od -An -N8 -tx8 /dev/urandom)"  # not $$: each sandbox may number its own PIDs
    args = (*store_args(tmp_path, plumbing_cache), PLUMBING, f"task.scales.tiny.baseline_command='{command}'")
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: run_cli(*args, cwd=tmp_path), range(2)))
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    client = mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert len(runs) == 2 and {r.data.tags["mlrb.status"] for r in runs} == {"no_submission"}
    folders = {r.data.tags["mlrb.run_dir"] for r in runs}
    assert folders == {str(tmp_path / "run"), str(tmp_path / "run-2")}
    for run in runs:  # each run's recorded trajectory is the one its own folder holds
        local = client.download_artifacts(run.info.run_id, "trajectory.jsonl", str(tmp_path / run.info.run_id))
        recorded = Path(local).read_text()
        assert recorded == (Path(run.data.tags["mlrb.run_dir"]) / "trajectory.jsonl").read_text()
    lines = [json.loads(line) for r in runs
             for line in (Path(r.data.tags["mlrb.run_dir"]) / "trajectory.jsonl").read_text().splitlines()]  # fmt: skip
    said = {printed(line) for line in lines if line["event"] == "tool_result"}
    assert len({s for s in said if s.startswith("I am")}) == 2  # two agents, two different processes


# ---- 8. a password in the tracking URI is written nowhere -----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_password_in_the_tracking_uri_reaches_no_param_artifact_or_config_dump(tmp_path, plumbing_cache):
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination", str(tmp_path / "server-artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(1)
        uri = f"http://alice:s3cret-pw@127.0.0.1:{port}"
        args = [a for a in store_args(tmp_path, plumbing_cache) if not a.startswith("tracking.dir")]
        result = run_cli(
            *args, PLUMBING, f"tracking.uri={uri}", "task.scales.tiny.baseline_command='echo hi'", cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr[-3000:]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"http://127.0.0.1:{port}")
        (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
        assert run.data.params["tracking.uri"] == f"http://alice:***@127.0.0.1:{port}"
        local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
        written = [p for p in [*local.rglob("*"), *(tmp_path / "run").rglob("*")] if p.is_file()]
        assert any(p.name == "config.yaml" for p in written) and any(".hydra" in p.parts for p in written)
        assert [str(p) for p in written if b"s3cret-pw" in p.read_bytes()] == []
        assert "s3cret-pw" not in json.dumps(run.data.params) + json.dumps(run.data.tags)
        assert "s3cret-pw" not in result.stdout + result.stderr
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
