"""A task folder in Harbor's format (tests/harbor_tasks/count-words: shell tools, a verifier that
writes a reward) run through `python -m mlrb task=harbor task.path=...`: with the baseline agent
(its solution/solve.sh) and with Claude Code against a scripted model server, in bwrap and in
Docker (the task's own Dockerfile built here, FROM the project's local sandbox image); and the
verifier held closed: a reward the agent writes itself counts for nothing, an agent that breaks
the verifier is invalid, a task whose verifier fails on its own solution is an infra error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer, reply, tool
from test_docker_sandbox import docker_problem

COUNT_WORDS = Path(__file__).parent / "harbor_tasks" / "count-words"
KEY = "sk-ant-harbor-task-secret"
needs_docker = pytest.mark.skipif(bool(docker_problem()), reason=docker_problem() or "docker ok")


def harbor_run(tmp_path: Path, cache: Path, *overrides: str, folder: Path = COUNT_WORDS, script=None):
    """`python -m mlrb task=harbor task.path=FOLDER ...`, with Claude Code against `script` if given."""
    args = [*store_args(tmp_path, cache), "task=harbor", f"task.path={folder}", *overrides]
    if script is None:
        return run_cli(*args, cwd=tmp_path), []
    with FakeLlmServer(script) as server:
        result = run_cli(*args, "agent=claude_code", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    return result, server.requests


def the_run(tmp_path: Path, experiment: str = "count-words"):
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def bash(command: str) -> dict:
    return reply(tool("Bash", command=command, description="run it"))


@pytest.mark.fast
def test_task_toml_s_limits_become_the_run_s_and_instruction_md_is_the_prompt():
    from mlrb.core import registry
    from mlrb.core.config import TaskConfig

    raw = OmegaConf.to_container(OmegaConf.load(Path("mlrb/tasks/harbor/task.yaml")))
    raw.update(name="count-words", title="count-words", path=str(COUNT_WORDS))
    task = registry.load_task(TaskConfig(**raw))
    assert (task.hardware.cpus, task.hardware.memory_gb) == (1, 2.0)  # [environment] cpus, memory_mb = 2048
    assert task.start.time_limit_s == 300.0 and task.judge.timeout_s == 60.0  # [agent] and [verifier] timeout_sec
    assert task.start.instructions() == (COUNT_WORDS / "instruction.md").read_text()
    assert task.baseline_command() == (COUNT_WORDS / "solution" / "solve.sh").read_text()
    assert task.scorer_config()["scales"]["harbor"]["workdir"] == "/app"  # the Dockerfile's WORKDIR
    assert task.hardware.gpus == 0  # [environment] gpus = 0, as Harbor writes it
    # the scorer's process builds the task from the config it is handed: solve.sh's ${...} as written
    again = registry.load_task(TaskConfig(**{**task.scorer_config(), "path": None}))
    assert "${PWD}" in again.baseline_command() and again.baseline_command() == task.baseline_command()


@pytest.mark.fast
def test_a_folder_without_its_verifier_is_one_line(tmp_path):
    folder = tmp_path / "no-tests"
    shutil.copytree(COUNT_WORDS, folder)
    (folder / "tests" / "test.sh").unlink()
    result, _ = harbor_run(tmp_path, tmp_path / "cache", folder=folder)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: Harbor task folder {folder} has no tests/test.sh "
        "(a Harbor task needs instruction.md, task.toml, environment/Dockerfile, tests/test.sh)"
    )


@pytest.mark.integration
def test_the_baseline_runs_solve_sh_and_the_verifier_s_reward_is_the_score_under_task_toml_s_wall_time(
    tmp_path, cache_dir
):
    result, _ = harbor_run(tmp_path, cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count-words/baseline/smoke/0: score 1.0000 (valid); status ok" in result.stdout
    assert "sandbox=bwrap does not build environment/Dockerfile" in result.stdout + result.stderr
    budget = (tmp_path / "run" / "workspace" / ".mlrb_budget.json").read_text()
    assert '"wall_time_s": 300.0' in budget  # task.toml's [agent] timeout_sec, no budget named
    assert the_run(tmp_path).data.params["budget.wall_time_s"] == "300.0"  # recorded as the run used it
    assert the_run(tmp_path).data.tags["mlrb.forgeable_reward"] == "false"  # its test.sh runs shell tools only


@pytest.mark.integration
def test_a_budget_named_on_the_command_line_keeps_its_own_wall_time(tmp_path, cache_dir):
    result, _ = harbor_run(tmp_path, cache_dir, "budget.wall_time_s=200")
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"wall_time_s": 200.0' in (tmp_path / "run" / "workspace" / ".mlrb_budget.json").read_text()


@pytest.mark.integration
def test_a_task_whose_verifier_fails_its_own_solution_is_an_infra_error_not_the_agent_s(tmp_path, cache_dir):
    folder = tmp_path / "broken-verifier"
    shutil.copytree(COUNT_WORDS, folder)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 'cannot find pytest' >&2\nexit 3\n")
    result, _ = harbor_run(tmp_path, cache_dir, folder=folder)
    assert "the control failed too" in result.stderr, result.stdout[-2000:] + result.stderr[-2000:]
    run = the_run(tmp_path, "broken-verifier")
    assert run.data.tags["mlrb.status"] == "infra_error"
    assert "tests/test.sh wrote no reward (test.sh exited 3: cannot find pytest)" in run.data.tags["mlrb.error"]


@pytest.mark.system
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=needs_docker)])
def test_claude_code_solves_the_harbor_task_through_the_proxy(tmp_path, cache_dir, sandbox):
    script = [bash("wc -w < words.txt | tr -d ' ' > count.txt && cat count.txt"), reply(text="Wrote count.txt.")]
    result, requests = harbor_run(tmp_path, cache_dir, f"sandbox={sandbox}", script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count-words/claude_code/smoke/0: score 1.0000 (valid); status ok" in result.stdout
    assert len(requests) == 2 and requests[0]["headers"]["x-api-key"] == KEY
    assert "Count the words in the file `words.txt`" in str(requests[0]["body"]["messages"][0])
    if sandbox == "docker":  # the task's image, built here from its Dockerfile, held the agent and the verifier
        assert the_run(tmp_path).data.params["sandbox.kind"] == "docker"


@pytest.mark.system
def test_an_agent_that_writes_the_reward_itself_gets_no_credit(tmp_path, cache_dir):
    """It writes a wrong count, then a reward of 1 wherever a verifier might look: at
    /logs/verifier (its own sandbox's, if it can make one), in its workspace's logs/verifier,
    and a reward.txt beside its count. Only the verifier's own folder, made empty by the harness
    after the agent stopped, is read: the score is the wrong count's 0."""
    cheat = ("echo 99 > count.txt; mkdir -p /logs/verifier logs/verifier; echo 1 > /logs/verifier/reward.txt; "
             "echo 1 > logs/verifier/reward.txt; echo 1 > reward.txt; echo '{\"reward\": 1}' > reward.json; ls -R")  # fmt: skip
    result, _ = harbor_run(tmp_path, cache_dir, script=[bash(cheat), reply(text="Done.")])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "count-words/claude_code/smoke/0: score 0.0000 (valid); status ok" in result.stdout
    assert (tmp_path / "run" / "workspace" / "logs" / "verifier" / "reward.txt").read_text().strip() == "1"


@pytest.mark.system
def test_an_agent_that_breaks_the_verifier_is_invalid_with_the_reason_not_an_infra_error(tmp_path, cache_dir):
    """count.txt made a folder: test.sh (set -e) stops before writing a reward. The task's own
    solve.sh, scored as the control, gets its reward: the failure is the submission's."""
    result, _ = harbor_run(tmp_path, cache_dir, script=[bash("mkdir count.txt"), reply(text="Done.")])
    assert result.returncode == 0, result.stderr[-3000:]
    run = the_run(tmp_path)
    assert run.data.tags["mlrb.status"] == "invalid", result.stdout[-2000:]
    assert run.data.tags["mlrb.valid"] == "False"
    reason = run.data.tags["mlrb.invalid_reason"]
    assert "tests/test.sh wrote no reward (test.sh exited 1: cat: count.txt: Is a directory)" in reason
