"""A multi-step Harbor task (tests/harbor_tasks/two-step-app, written as Harbor writes one): its two
steps run in turn in one workspace and sandbox, each with its own instruction and verifier. Its
solutions and a scripted agent score 1 in bwrap and in Docker, each step's reward recorded at its
number; a wrong first step, under its min_reward, ends the run there (the second never given) and
the run says so; the agent never sees a verifier, before or after its step."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import mlflow_client, run_cli, run_module, store_args
from fake_llm_server import FakeLlmServer
from test_bwrap_sandbox import needs_namespaces
from test_docker_sandbox import needs_docker
from test_harbor_verifier import agent_run

TASK = Path(__file__).parent / "harbor_tasks" / "two-step-app"
# A scripted agent: it answers the step its prompt names, notes which steps it was given, and what of
# a verifier it could find (/tests, /logs/verifier, the steps' files among its starting files).
AGENT = """
case "$MLRB_PROMPT" in
  *"step 1 of 2 (count)"*) echo count >> /app/given.txt; {count} ;;
  *"step 2 of 2 (sum)"*) echo sum >> /app/given.txt; total=0; while read -r n; do total=$((total + n)); done < /app/input.txt; echo $total > /app/sum.txt ;;
esac
ls /tests /logs/verifier "$MLRB_DATA/steps" >> /app/seen.txt 2>/dev/null || true
"""  # fmt: skip
RIGHT, WRONG = "grep -c . /app/input.txt > /app/count.txt", "echo 5 > /app/count.txt"


def step_rewards(folder: Path, run) -> list[tuple[int, float]]:
    client = mlflow_client(folder)
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "task_step_reward"))


@pytest.mark.fast
def test_steps_are_read_as_harbor_names_them(tmp_path):
    from mlrb.tasks.harbor.layout import read_settings

    settings = read_settings(TASK)
    assert [step.name for step in settings.steps] == ["count", "sum"] and settings.reward_strategy == "mean"
    assert settings.steps[0].min_reward == {"reward": 1.0} and settings.steps[1].min_reward == {}
    assert (settings.steps[0].agent_timeout_s, settings.steps[1].verifier_timeout_s) == (120.0, 30.0)


@pytest.mark.fast
def test_the_trial_reward_is_harbor_s():
    from mlrb.harness.task_steps import short_of, trial_reward

    assert trial_reward([1.0, 0.0, 0.5], "mean") == 0.5 and trial_reward([1.0, 0.0, 0.5], "final") == 0.5
    assert trial_reward([1.0, None, 0.0], "mean") == 0.5  # a step without a reward is left out of the mean
    assert short_of({"reward": 0.5}, {"reward": 1.0}) == "its reward 0.5 is under its min_reward 1"
    assert short_of({"reward": 1.0}, {"safety": 1.0}) == "its safety 0 is under its min_reward 1"  # not written: 0
    assert short_of({"reward": 1.0, "safety": 1.0}, {"safety": 1.0}) == ""


@pytest.mark.integration
@needs_namespaces
def test_in_bwrap_both_steps_run_in_one_workspace_and_a_wrong_first_step_ends_the_run(tmp_path, cache_dir):
    result = run_cli(*store_args(tmp_path / "baseline", cache_dir), "task=harbor", f"task.path={TASK}",
                     "agent=baseline", "sandbox=bwrap", cwd=tmp_path)  # fmt: skip
    assert "two-step-app/baseline/smoke/0: score 1.0000 (valid); status ok" in result.stdout, result.stderr[-3000:]
    run = agent_run(tmp_path / "scripted", cache_dir, TASK, "bwrap", AGENT.format(count=RIGHT))
    assert (run.data.tags["mlrb.status"], run.data.metrics["score"]) == ("ok", 1.0)
    assert (
        step_rewards(tmp_path / "scripted", run) == [(1, 1.0), (2, 1.0)] and run.data.metrics["task_steps_scored"] == 2
    )
    workspace = tmp_path / "scripted" / "run" / "workspace"
    assert (workspace / "given.txt").read_text() == "count\nsum\n"  # each step's prompt in turn
    assert (workspace / "seen.txt").read_text() == ""  # no verifier of any step, before or after it

    wrong = agent_run(tmp_path / "wrong", cache_dir, TASK, "bwrap", AGENT.format(count=WRONG))
    assert (wrong.data.tags["mlrb.status"], wrong.data.metrics["score"]) == ("ok", 0.0)
    assert step_rewards(tmp_path / "wrong", wrong) == [(1, 0.0)] and wrong.data.tags["mlrb.stop_reason"] == "min_reward"
    assert wrong.data.tags["mlrb.steps_ended_early"] == (
        "step 1 of 2 (count): its reward 0 is under its min_reward 1, so the run ended there, as Harbor ends the trial"
    )
    assert (tmp_path / "wrong" / "run" / "workspace" / "given.txt").read_text() == "count\n"  # never given step 2


@pytest.mark.system
@needs_namespaces
@needs_docker
def test_in_docker_the_solutions_and_a_scripted_agent_score_1_step_by_step(tmp_path, cache_dir):
    result = run_cli(*store_args(tmp_path / "baseline", cache_dir), "task=harbor", f"task.path={TASK}",
                     "agent=baseline", "sandbox=docker", cwd=tmp_path)  # fmt: skip
    assert "two-step-app/baseline/smoke/0: score 1.0000 (valid); status ok" in result.stdout, result.stderr[-3000:]
    run = agent_run(tmp_path / "scripted", cache_dir, TASK, "docker", AGENT.format(count=RIGHT))
    assert (run.data.tags["mlrb.status"], run.data.metrics["score"]) == ("ok", 1.0)
    assert step_rewards(tmp_path / "scripted", run) == [(1, 1.0), (2, 1.0)]
    assert (tmp_path / "scripted" / "run" / "workspace" / "seen.txt").read_text() == ""


@pytest.mark.integration
@needs_namespaces
def test_a_folder_of_harbor_tasks_runs_as_one_sweep_with_each_task_s_reward_and_their_mean(tmp_path, cache_dir):
    import shutil

    dataset = tmp_path / "dataset"
    for name in ("answer-app", "two-step-app"):
        shutil.copytree(TASK.parent / name, dataset / name)
    shutil.copytree(TASK.parent / "answer-app", dataset / "answer-wrong")  # its solution gets 0
    (dataset / "answer-wrong" / "solution" / "solve.sh").write_text("echo 41 > /app/answer.txt\n")
    (dataset / "notes").mkdir()  # not a task: left out
    result = run_cli(*store_args(tmp_path, cache_dir), "-m", "task=harbor", f"task.path={dataset}/*",
                     "agent=baseline", "sandbox=bwrap", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "done" in result.stdout and "3 runs (3 ok)" in result.stdout
    assert "0.6667 over 3 tasks (answer-app 1, answer-wrong 0, two-step-app 1)" in result.stdout, result.stdout[-3000:]
    # Another agent on the same dataset, one that does nothing, then mlrb.compare across the two: each
    # Harbor task is a task of the comparison, its reward the counted score (a failure counts as 0).
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "run.sh").write_text("true\n")
    with FakeLlmServer([]) as server:
        idle = run_cli(*store_args(tmp_path, cache_dir), "-m", "task=harbor", f"task.path={dataset}/*",
                       "agent=command", f"agent.options.program_dir={agent}",
                       "agent.options.command='bash $MLRB_AGENT_DIR/run.sh'", "sandbox=bwrap",
                       f"hydra.sweep.dir={tmp_path / 'idle'}", cwd=tmp_path,
                       env={"ANTHROPIC_API_KEY": "sk-ant-harbor-dataset", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert idle.returncode == 0, idle.stdout[-3000:] + idle.stderr[-3000:]
    assert "0 over 3 tasks (answer-app 0, answer-wrong 0, two-step-app 0)" in idle.stdout, idle.stdout[-3000:]
    compared = run_module("mlrb.compare", "baseline", "command", cwd=tmp_path, timeout=300)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    rows = [line for line in compared.stdout.splitlines() if line.startswith(("| answer-", "| two-step-"))]
    assert [row.split(" | ")[3:6] for row in rows] == [
        ["100.0", "0.0", "+100.0"], ["0.0", "0.0", "+0.0"], ["100.0", "0.0", "+100.0"]
    ], compared.stdout[-3000:]  # fmt: skip
    # (one seed a task: three pairs cannot make a difference significant)
    told = compared.stdout.strip().splitlines()[-1]
    assert told.startswith(
        "cannot tell baseline from command (the interval contains 0): baseline ahead on 2 of 3 tasks"
    )
    single = run_cli(*store_args(tmp_path, cache_dir), "task=harbor", f"task.path={dataset}/*", cwd=tmp_path)
    assert single.returncode != 0 and single.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: task.path '{dataset}/*' names several folders: run them as a sweep, with -m"
    )
    none = run_cli(*store_args(tmp_path, cache_dir), "-m", "task=harbor", f"task.path={dataset}/x*", cwd=tmp_path)
    assert none.returncode != 0 and none.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: task.path={dataset}/x* matches no Harbor task folder (a folder holding task.toml)"
    )
