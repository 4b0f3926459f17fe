"""Whatever an agent leaves in its workspace, its run is scored and counted: a whole run of the
default task through `python -m mlrb`, with a program of its own (`agent=command`) in the
default bwrap sandbox that writes a valid submission and plants traps beside it and in it (a
FIFO, a socket, a symbolic link loop, a 50 GiB sparse file, a name that is not UTF-8, a tree
deeper than the walk's cap, a file of mode 000). The run ends as the submission deserves,
never infra_error, and what the harness left out is in the run's notes."""

from __future__ import annotations

import json
import time

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, PLUMBING, mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer
from mlrb.run_files import snapshots, workspace
from test_command_agent import KEY, command_override

pytestmark = pytest.mark.integration

# The agent: a valid submission (a copy of the given base model: the cheapest one, where a merge's
# imports would take about 5 CPU s); then the traps. It calls no model.
TRAPS = """
import os, socket, subprocess
subprocess.run('cp -r "$MLRB_DATA/base_model" submission', shell=True, check=True)
os.mkfifo("submission/pipe")
socket.socket(socket.AF_UNIX).bind("submission/agent.sock")
os.mkfifo("pipe")
socket.socket(socket.AF_UNIX).bind("server.sock")
os.symlink("loop-b", "loop-a")
os.symlink("loop-a", "loop-b")
with open("checkpoint.bin", "wb") as f:
    f.truncate(50 << 30)
with open(b"notes-\\xff.txt", "w") as f:
    f.write("not UTF-8\\n")
os.makedirs("/".join(["deep"] * 80))
with open("secret.txt", "w") as f:
    f.write("mine")
os.chmod("secret.txt", 0)
"""
LOOP_IN_SUBMISSION = """
os.symlink("b", "submission/a")
os.symlink("a", "submission/b")
"""


@pytest.mark.parametrize(
    "extra, status",
    [("", "ok"), (LOOP_IN_SUBMISSION, "invalid")],
    ids=["traps-beside-a-valid-submission", "a-symlink-loop-in-the-submission"],
)
def test_a_workspace_full_of_traps_is_scored_and_counted_never_an_infra_error(tmp_path, plumbing_cache, extra,
                                                                              status):  # fmt: skip
    started = time.monotonic()
    with FakeLlmServer([]) as server:
        result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=command",
                         command_override(TRAPS + extra), cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    tags = run.data.tags
    assert run.info.status == "FINISHED" and tags["mlrb.status"] == status, (tags.get("mlrb.error"), took)
    # Recorded as any plumbing run is, valid or not: it measures nothing, so it counts as nothing
    # (at a calibrated scale the valid run counts its score, the invalid one the do-nothing anchor).
    assert tags["mlrb.counted_as"] == "none" and tags["mlrb.plumbing"] == "true"
    if status == "ok":  # the FIFO and the socket left out of the copy, the model scored
        assert tags["mlrb.valid"] == "True" and "score" in run.data.metrics
    else:  # the loop is copied as links, and the task's rules name it
        assert tags["mlrb.invalid_reason"].startswith("the submission contains symbolic links (")

    run_dir = tmp_path / "run"
    notes = (run_dir / "record" / "workspace_notes.txt").read_text(encoding="utf-8")
    assert "the patch: special files (FIFOs, sockets, devices) left out: 4 (" in notes
    assert "the submission: special files (FIFOs, sockets, devices) left out: 2 (" in notes
    assert f"the patch: {workspace.TOO_DEEP}: 1 (" in notes
    patch = (run_dir / "record" / "workspace.patch").read_text(encoding="utf-8")
    assert "Binary file checkpoint.bin added (53687091200 bytes, sha256 not computed)" in patch
    assert "+++ b/notes-\\xff.txt" in patch
    assert not (run_dir / "submission" / "pipe").exists() and (run_dir / "submission" / "config.json").is_file()
    steps = [json.loads(line) for line in (run_dir / "snapshots" / "steps.jsonl").read_text().splitlines()]
    assert steps[-1]["too_large"] == {"checkpoint.bin": 50 << 30}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"workspace.patch", "workspace_notes.txt", "snapshots"} <= artifacts
    print(f"the run took {took:.1f} s")


# Code the agent hides where a walk used to look away: under a name that starts as the harness's
# budget file does, and in __pycache__ folders (a source file there, and compiled code with no
# source). Its submission is made by that code. The honest control: a module imported the usual
# way, whose compiled cache is left out as Python's, not the agent's. Its task is incidental: the
# cheapest one (HARNESS_TASK), whose given train.py leaves a valid submission.
HIDES_ITS_CODE = """
import os, subprocess, py_compile
os.makedirs(".mlrb_budget_tools", exist_ok=True)
with open(".mlrb_budget_tools/solve.py", "w") as f:
    f.write("import subprocess\\nsubprocess.run(['python', 'train.py'], check=True)\\n")
os.makedirs("__pycache__", exist_ok=True)
with open("__pycache__/hidden.py", "w") as f:
    f.write("SECRET_METHOD = 1\\n")
os.makedirs("tools", exist_ok=True)
with open("tools/orphan.py", "w") as f:
    f.write("ORPHAN = 2\\n")
py_compile.compile("tools/orphan.py", cfile="tools/__pycache__/orphan.cpython-311.pyc")
os.remove("tools/orphan.py")  # compiled code with no source left: still runnable, still the agent's
with open("helper.py", "w") as f:
    f.write("HELPER = 3\\n")
subprocess.run(["python", "-c", "import helper"], check=True)  # Python's own cache of helper.py
subprocess.run(["python", ".mlrb_budget_tools/solve.py"], check=True)
"""


def test_the_patch_and_the_snapshots_see_every_file_the_agent_wrote_whatever_its_name(tmp_path, cache_dir):
    with FakeLlmServer([]) as server:
        result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
                         command_override(HIDES_ITS_CODE), cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.data.tags["mlrb.status"] == "ok"
    patch = open(client.download_artifacts(run.info.run_id, "workspace.patch", str(tmp_path / "a"))).read()
    steps = [json.loads(line) for line in (tmp_path / "run" / "snapshots" / "steps.jsonl").read_text().splitlines()]
    kept = set(snapshots.changed_files(tmp_path / "run" / "snapshots", steps[-1]))
    for hidden in (".mlrb_budget_tools/solve.py", "__pycache__/hidden.py", "tools/__pycache__/orphan.cpython-311.pyc"):
        assert f"b/{hidden}" in patch, hidden
        assert hidden in kept, hidden
    assert "b/helper.py" in patch and "helper.cpython" not in patch  # Python's cache of a source beside it
    assert ".mlrb_budget.json" not in patch  # the harness's own file
