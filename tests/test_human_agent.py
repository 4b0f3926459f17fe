"""The human baseline (`agent=human`, mlrb/agents/human.py): `python -m mlrb` opens a terminal in
the run's sandbox that a person attaches to with tmux; here the person is this test, typing with
`tmux send-keys` and reading the screen with `capture-pane`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_SUBMISSION, HARNESS_TASK, mlflow_client, run_cli, store_args
from mlrb.agents.human import Commands
from mlrb.core import events
from test_docker_sandbox import needs_docker

# A person's valid submission on the cheapest real task (the given train.py's predictions), then a
# second's wait, as a command of the person's takes its own time (its duration is checked), and a
# line to wait for that the typed command does not hold.
MAKE = f"{HARNESS_SUBMISSION} && sleep 1 && echo made-$((6 * 7))"
SECRET = "sk-ant-human-test-key-4242"


class Person:
    """`python -m mlrb agent=human ...` (the cheapest real task) started in the background, and its
    terminal as a person sees it."""

    def __init__(self, tmp_path: Path, cache: Path, *overrides: str):
        self.tmp_path = tmp_path
        self.socket = tmp_path / "run" / "human" / "tmux.sock"
        self.stdout, self.stderr = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlrb", *HARNESS_TASK, "agent=human", *store_args(tmp_path, cache),
                 *overrides],
                cwd=tmp_path, stdout=out, stderr=err, env={**os.environ, "ANTHROPIC_API_KEY": SECRET},
            )  # fmt: skip

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True).stdout

    def screen(self) -> str:
        """The pane with its scrollback, as attaching and scrolling up shows it."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "mlrb")

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen() if self.socket.exists() else ""
            if text in screen:
                return screen
            assert self.proc.poll() is None, f"the run ended early: {self.stderr.read_text()[-2000:]}"
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on the screen after {timeout} s:\n{self.screen()}")

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "mlrb", "-l", line)
        self.tmux("send-keys", "-t", "mlrb", "Enter")

    def wait(self, timeout: float = 180) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=timeout)
        return code, self.stdout.read_text(), self.stderr.read_text()

    def trajectory(self) -> list[dict]:
        return [json.loads(line) for line in (self.tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True)


@pytest.fixture
def person_at(tmp_path, cache_dir):
    """Starts a person's run with the given overrides, on the session's cache (the cheapest real
    task's assets are built there by the first run that needs them)."""
    people: list[Person] = []

    def start(*overrides: str) -> Person:
        people.append(Person(tmp_path, cache_dir, *overrides))
        return people[-1]

    yield start
    for person in people:
        person.close()


def one_run(tmp_path):
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    return client, run


def submit_and_exit(person: Person) -> None:
    """What a person does for a valid submission: the given train.py, then exit."""
    person.wait_for("min left]")
    person.type(MAKE)
    person.wait_for("made-42")
    person.type("exit")


@pytest.mark.integration
def test_a_person_in_bwrap_merges_exits_and_is_scored_with_every_command_recorded(tmp_path, person_at):
    person = person_at()
    screen = person.wait_for("min left]")
    assert "Predict the sale price of a house" in screen and "`instructions` shows the task again" in screen
    person.type("id -u; pwd; env | grep -c sk-ant-human; echo said-$((6 * 7))")
    screen = person.wait_for("said-42")  # in the sandbox: its user, its workspace, no key of the harness
    assert "1000\n/workspace\n0\nsaid-42" in screen
    person.type("cat no-such-file")
    person.wait_for("No such file or directory")
    submit_and_exit(person)
    code, stdout, stderr = person.wait()
    assert code == 0, stderr[-3000:]
    assert f"attach with: tmux -S {person.socket} attach" in stdout
    assert f"{HARNESS_EXPERIMENT}/human/smoke/0: score" in stdout and "(valid); status ok" in stdout
    client, run = one_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "ok" and run.data.tags["mlrb.valid"] == "True"
    assert run.data.params["agent.name"] == "human"
    # Each command line a tool call and its result, in the order typed, with its status and output.
    trajectory = person.trajectory()
    calls = [e["arguments"]["command"] for e in trajectory if e["event"] == "tool_call"]
    assert calls == ["id -u; pwd; env | grep -c sk-ant-human; echo said-$((6 * 7))", "cat no-such-file", MAKE, "exit"]
    results = [e for e in trajectory if e["event"] == "tool_result"]
    assert [(r["exit_code"], r["is_error"]) for r in results] == [(0, False), (1, True), (0, False), (None, False)]
    assert "No such file or directory" in results[1]["output"] and "train MAE" in results[2]["output"]
    assert "\x1b" not in results[2]["output"] and results[2]["duration_s"] > 0.5  # the screen's text; its own time
    assert [e["event"] for e in trajectory][-2:] == ["submit", "end"]
    # The same in the run's trace, and the whole terminal as its artifact.
    (trace,) = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    assert [s.inputs["command"] for s in trace.data.spans if s.span_type == "TOOL"] == calls
    assert [a.path for a in client.list_artifacts(run.info.run_id, "agent")] == ["agent/terminal.txt"]
    transcript = Path(client.download_artifacts(run.info.run_id, "agent/terminal.txt", str(tmp_path / "dl")))
    assert b"train MAE" in transcript.read_bytes() and b"cat no-such-file" in transcript.read_bytes()
    assert not person.socket.exists()
    assert SECRET.encode() not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and
                                           "stderr" not in p.name and "stdout" not in p.name)  # fmt: skip


@pytest.mark.integration
def test_when_the_wall_time_runs_out_the_session_ends_budget_exhausted_and_is_scored(tmp_path, person_at):
    """In the unconfined kind: a command still running at the limit is ended with the session."""
    person = person_at("sandbox=unconfined", "budget.wall_time_s=10")
    person.wait_for("min left]")
    person.type("sleep 613")
    code, stdout, stderr = person.wait()
    assert code == 0, stderr[-3000:]
    assert "status budget_exhausted" in stdout
    _, run = one_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "budget_exhausted" and run.data.tags["mlrb.stop_reason"] == "wall_time"
    assert run.data.tags["mlrb.valid"] == "False"  # scored: nothing was submitted
    (result,) = [e for e in person.trajectory() if e["event"] == "tool_result"]
    assert result["exit_code"] is None and result["is_error"]
    assert "the session ended at the wall-time limit" in result["output"]
    left = subprocess.run(["pgrep", "-f", "sleep 613"], capture_output=True, text=True).stdout
    assert not left, f"the person's command outlived the run: {left}"


@pytest.mark.system
@needs_docker
def test_a_person_in_docker_merges_exits_and_is_scored(tmp_path, person_at):
    person = person_at("sandbox=docker")
    person.wait_for("min left]")
    person.type("id -u; pwd")
    assert "/workspace" in person.wait_for("/workspace\n")
    submit_and_exit(person)
    code, stdout, stderr = person.wait()
    assert code == 0, stderr[-3000:]
    assert "(valid); status ok" in stdout
    calls = [e["arguments"]["command"] for e in person.trajectory() if e["event"] == "tool_call"]
    assert calls == ["id -u; pwd", MAKE, "exit"]


@pytest.mark.fast
def test_without_tmux_the_run_is_refused_in_one_line_naming_it(tmp_path):
    bare = tmp_path / "bin"  # a PATH without tmux
    bare.mkdir()
    result = run_cli(*store_args(tmp_path, tmp_path / "cache"), "agent=human", cwd=tmp_path, env={"PATH": str(bare)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent=human needs tmux" in lines[0] and "apt-get install tmux" in lines[0], lines
    assert not (tmp_path / "run").exists()


class Events:
    def __init__(self):
        self.seen: list = []

    def emit(self, event):
        self.seen.append(event)


def mark(kind: str, value: str) -> bytes:
    return f"\x1b]777;mlrb;{kind};{value}\x07".encode()


@pytest.mark.fast
def test_commands_are_read_from_the_terminal_even_when_a_read_cuts_a_mark_in_two():
    import base64

    line = base64.b64encode(b"   12  python train.py --lr 3e-4\n").decode()
    stream = (mark("end", "100.0;0") + b"\x1b[?2004h$ " + mark("ready", "") + b"python train.py\r\n"
              + mark("start", f"100.5;{line}") + b"epoch 1\r\n\x1b[32m10%\r50%\r100%\x1b[0m\r\n"
              + mark("end", "103.0;2") + b"$ exit\r\n" + mark("start", "104.0;" + base64.b64encode(b"   13  exit").decode()))  # fmt: skip
    for size in (1, 7, len(stream)):  # byte by byte, in uneven pieces, whole
        sink = Events()
        commands = Commands(sink, step=1)  # type: ignore[arg-type]
        for i in range(0, len(stream), size):
            commands.feed(stream[i : i + size])
        commands.finish("", is_error=False)
        assert commands.ready and commands.count == 2
        started, ended, exit_started, exit_ended = sink.seen
        assert started == events.ToolStarted(
            1, "shell", "human-1", {"command": "python train.py --lr 3e-4"}, 100_500_000_000
        )
        assert ended == events.ToolEnded(1, "shell", "human-1", True, 2, 2.5, "epoch 1\n100%")
        assert exit_started.arguments == {"command": "exit"} and exit_ended.exit_code is None


@pytest.mark.integration
def test_a_person_s_run_killed_goes_on_in_a_new_terminal_on_the_same_workspace(tmp_path, person_at):
    person = person_at()
    person.wait_for("min left]")
    person.type("echo from-the-first-terminal > notes.txt; echo noted-$((6 * 7))")
    person.wait_for("noted-42")
    time.sleep(6)  # the run's progress saved past its start
    person.proc.kill()  # SIGKILL: the harness dies; its tmux server and the person's shell live on
    person.proc.wait()
    again = person_at()  # the same command: the run goes on
    deadline = time.monotonic() + 120
    while "attach with" not in again.stdout.read_text():  # its terminal is open (the first one's server ended)
        assert again.proc.poll() is None and time.monotonic() < deadline, again.stderr.read_text()[-2000:]
        time.sleep(0.2)
    again.wait_for("min left]")
    again.type("cat notes.txt; echo read-$((6 * 7))")
    screen = again.wait_for("read-42")
    assert "from-the-first-terminal" in screen and "noted-42" not in screen  # a new terminal, the same workspace
    submit_and_exit(again)
    code, stdout, stderr = again.wait()
    assert code == 0, stderr[-3000:]
    client, run = one_run(tmp_path)
    assert (
        run.info.status == "FINISHED" and run.data.tags["mlrb.attempt"] == "2" and run.data.tags["mlrb.valid"] == "True"
    )
    trajectory = again.trajectory()  # one, for both attempts: the first terminal's command, then the second's
    kinds = [e["event"] for e in trajectory]
    calls = [e["arguments"]["command"] for e in trajectory if e["event"] == "tool_call"]
    assert calls[:2] == [
        "echo from-the-first-terminal > notes.txt; echo noted-$((6 * 7))",
        "cat notes.txt; echo read-$((6 * 7))",
    ]
    first_call_after = next(e for e in trajectory[kinds.index("resume") :] if e["event"] == "tool_call")
    assert first_call_after["arguments"]["command"] == calls[1]
