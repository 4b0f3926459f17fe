"""The agent knows its clock (mlrb/harness/agent_clock.py): its prompt says where, a file in its workspace
($MLRB_BUDGET_FILE) always holds what is left, and a last-minutes notice comes once, recorded in
the run's trajectory. The harness writes the file without following what the agent put there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, mlflow_client, run_cli, store_args

BUDGET_S = 40
# The baseline agent on the cheapest task (HARNESS_TASK), its task incidental. Its command makes a
# valid submission (the given train.py), reads its clock, then swaps the file for a link to a file of
# its own, and works on past its time. A folder task's baseline command is also its baseline anchor,
# run when its assets are built whatever score the config states: there the workspace has no budget
# file, and the command ends after train.py.
AGENT = ('python train.py && if [ -e "$MLRB_BUDGET_FILE" ]; then cp "$MLRB_BUDGET_FILE" first.json && '
         "echo mine > victim.txt && ln -sf victim.txt .mlrb_budget.json && sleep 600; fi")  # fmt: skip


@pytest.mark.integration
def test_the_agent_reads_what_is_left_and_gets_one_notice_before_its_time_is_up(tmp_path, cache_dir):
    result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, f"budget.wall_time_s={BUDGET_S}",
                     f"task.scales.folder.baseline_command='{AGENT}'", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    work = tmp_path / "run" / "workspace"
    first = json.loads((work / "first.json").read_text())
    assert 0 < first["wall_time_s_left"] <= BUDGET_S and first["notice"] is None
    assert first["usd_left"] == 1.0 and first["steps_left"] == 19  # the smoke budget, its first step under way
    # the link was replaced, not followed: the agent's file is as it left it, the clock a file again
    assert (work / "victim.txt").read_text() == "mine\n"
    assert not (work / ".mlrb_budget.json").is_symlink()
    last = json.loads((work / ".mlrb_budget.json").read_text())
    assert last["notice"] and "minute" in last["notice"]

    events = [json.loads(line) for line in (tmp_path / "run" / "trajectory.jsonl").read_text().splitlines()]
    (notice,) = [e for e in events if e["event"] == "budget_notice"]
    assert 0 < notice["seconds_left"] <= 0.1 * BUDGET_S + 1
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.data.tags["mlrb.stop_reason"] == "wall_time"
    prompt = Path(client.download_artifacts(run.info.run_id, "instructions.md", str(tmp_path / "a"))).read_text()
    assert ".mlrb_budget.json" in prompt and "$MLRB_BUDGET_FILE" in prompt
    patch = Path(client.download_artifacts(run.info.run_id, "workspace.patch", str(tmp_path / "b"))).read_text()
    assert "victim.txt" in patch and ".mlrb_budget" not in patch  # the harness's file is not the agent's work
