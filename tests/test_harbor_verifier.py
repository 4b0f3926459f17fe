"""A Harbor verifier trusts nothing the agent left (mlrb/tasks/harbor/verifier.py), shown on task
folders written as Terminal-Bench writes them (tests/harbor_tasks): test.sh runs `python -m pytest
/tests/test_outputs.py` from the working directory and writes 1 when pytest exits 0; the tests read
the agent's answer (count-words-pytest) or import the agent's module (word-counter-module).

Each attack is first run as a plain Harbor verifier runs test.sh (in the agent's folder, as its
HOME, beside /tests) and must get a reward of 1 there: the positive control. Through the harness,
in bwrap and in Docker, it gets no credit, while the task's own solution still scores 1 and doing
nothing 0. What stays forgeable (a module of the agent's that the tests import runs inside
pytest) is tagged so."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import mlflow_client, run_cli, store_args
from fake_llm_server import FakeLlmServer
from test_bwrap_sandbox import needs_namespaces
from test_docker_sandbox import needs_docker

TASKS = Path(__file__).parent / "harbor_tasks"
SHELL, READS, IMPORTS = TASKS / "count-words", TASKS / "count-words-pytest", TASKS / "word-counter-module"
SANDBOXES = [  # bwrap's runs in the default tiers; Docker's in the system tier (each attack's control runs in bwrap)
    pytest.param("bwrap", marks=[needs_namespaces, pytest.mark.integration]),
    pytest.param("docker", marks=[needs_namespaces, needs_docker, pytest.mark.system]),
]

# Files an agent leaves instead of an answer, each ending `python -m pytest` with status 0 before any test
# runs: as the working folder comes first on sys.path, they stand in for pytest, its internals, its plugin
# library, or a plugin of its own found through the package metadata there.
SHADOWS = {
    "pytest.py": "echo 'raise SystemExit(0)' > pytest.py",
    "_pytest": "mkdir _pytest && echo 'import os; os._exit(0)' > _pytest/__init__.py",
    "pluggy": "mkdir pluggy && echo 'import os; os._exit(0)' > pluggy/__init__.py",
    "plugin-entry-point": (
        "mkdir forged-1.dist-info && printf 'Metadata-Version: 2.1\\nName: forged\\nVersion: 1\\n' > "
        "forged-1.dist-info/METADATA && printf '[pytest11]\\nforged = forged_plugin\\n' > "
        "forged-1.dist-info/entry_points.txt && echo 'import os; os._exit(0)' > forged_plugin.py"
    ),
}
# The module the tests import, ending pytest with status 0 as it is imported.
EXITS_ON_IMPORT = "echo 'import os; os._exit(0)' > wordcount.py"
# The same, writing a finished report of passing tests first where mlrb's plugin writes its own: code of
# the agent's that runs inside the verifier can forge what the verifier writes.
FORGES_THE_REPORT = """cat > wordcount.py <<'PY'
import json, os
folder = os.environ["MLRB_PYTEST_REPORTS"]
for name in os.listdir(folder):
    with open(os.path.join(folder, name), "w") as out:
        json.dump({"passed": 3, "failed": 0, "errors": 0, "skipped": 0, "exitstatus": 0}, out)
os._exit(0)
PY"""


def plain_reward(task: Path, program: str, tmp_path: Path) -> str:
    """The reward test.sh writes on what PROGRAM leaves, run as a plain Harbor verifier runs it: in
    the agent's folder at /app (its HOME too), /tests holding the task's tests, /logs/verifier
    empty, in a bwrap sandbox that holds nothing else of mlrb's."""
    from mlrb.core.config import SandboxConfig
    from mlrb.sandbox.base import IsolatedCommand, Mount, sandbox_environment
    from mlrb.sandbox.bwrap import BwrapSandbox

    files, logs = tmp_path / "plain", tmp_path / "plain-logs"
    for folder in (files, logs):
        folder.mkdir()
    subprocess.run(["bash", "-c", program], cwd=files, check=True)
    mounts = [Mount(task / "tests", inside="/tests"), Mount(files, inside="/app", writable=True),
              Mount(logs, inside="/logs/verifier", writable=True)]  # fmt: skip
    job = IsolatedCommand(["bash", "/tests/test.sh"], mounts, "/app", sandbox_environment("/app"), 120,
                          tmp_path / "plain.log")  # fmt: skip
    assert BwrapSandbox.run_isolated(SandboxConfig(), job) is not None
    return (logs / "reward.txt").read_text().strip()


def agent_run(tmp_path: Path, cache: Path, task: Path, sandbox: str, program: str):
    """`python -m mlrb task=harbor task.path=TASK agent=command` whose agent runs PROGRAM (a shell
    script, in its workspace) and calls no model; the run's record."""
    agent = tmp_path / "agent"
    agent.mkdir(parents=True)
    (agent / "run.sh").write_text(program + "\n")
    with FakeLlmServer([]) as server:
        result = run_cli(*store_args(tmp_path, cache), "task=harbor", f"task.path={task}", f"sandbox={sandbox}",
                         "agent=command", f"agent.options.program_dir={agent}",
                         "agent.options.command='bash $MLRB_AGENT_DIR/run.sh'", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": "sk-ant-harbor-verifier", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(task.name).experiment_id])
    return run


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("attack", SHADOWS)
def test_files_that_stand_in_for_pytest_in_the_working_folder_get_no_credit(tmp_path, cache_dir, attack, sandbox):
    assert plain_reward(READS, SHADOWS[attack], tmp_path) == "1"  # the positive control: a plain verifier passes it
    run = agent_run(tmp_path, cache_dir, READS, sandbox, SHADOWS[attack])
    assert (run.data.tags["mlrb.status"], run.data.metrics["score"]) == ("ok", 0.0)  # pytest ran, and failed
    assert (run.data.tags["mlrb.forgeable_reward"], run.data.tags["mlrb.forgeable_reason"]) == ("false", "")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_link_to_the_verifier_s_expected_answer_is_removed_before_it_runs(tmp_path, cache_dir, sandbox):
    """count-words' test.sh compares count.txt with /tests/expected.txt: a count.txt linked to that
    file is right in any verifier that follows it. Removed, count.txt is missing: test.sh writes no
    reward, and the task's solution, scored as the control, gets its own: the run is invalid."""
    link = "ln -s /tests/expected.txt count.txt"
    assert plain_reward(SHELL, link, tmp_path) == "1"
    run = agent_run(tmp_path, cache_dir, SHELL, sandbox, link)
    assert run.data.tags["mlrb.status"] == "invalid" and "score" not in run.data.metrics
    assert (
        "(links leading outside the submission were removed before scoring: count.txt)"
        in (run.data.tags["mlrb.invalid_reason"])
    )


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_module_that_ends_pytest_as_it_is_imported_is_invalid_not_a_pass(tmp_path, cache_dir, sandbox):
    """pytest exits 0, so test.sh writes a reward of 1; pytest's report says its run never ended,
    which backs no reward. The task's own solution, scored as the control, gets its reward: the
    failure is the submission's."""
    assert plain_reward(IMPORTS, EXITS_ON_IMPORT, tmp_path) == "1"
    run = agent_run(tmp_path, cache_dir, IMPORTS, sandbox, EXITS_ON_IMPORT)
    assert run.data.tags["mlrb.status"] == "invalid" and "score" not in run.data.metrics
    reason = run.data.tags["mlrb.invalid_reason"]
    assert "wrote a reward of 1 that pytest does not back: a pytest run ended before it finished" in reason


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_module_that_forges_pytest_s_report_still_scores_and_the_run_is_tagged_forgeable(
    tmp_path, cache_dir, sandbox
):
    """What stays open: the agent's module runs inside the verifier's pytest, with its rights."""
    run = agent_run(tmp_path, cache_dir, IMPORTS, sandbox, FORGES_THE_REPORT)
    assert (run.data.tags["mlrb.status"], run.data.metrics["score"]) == ("ok", 1.0)
    assert run.data.tags["mlrb.forgeable_reward"] == "true"
    assert run.data.tags["mlrb.forgeable_reason"] == "the tests run the workspace's wordcount"


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("task", [READS, IMPORTS], ids=lambda task: task.name)
def test_the_task_s_solution_scores_1_and_doing_nothing_0(tmp_path, cache_dir, task, sandbox):
    solved = agent_run(tmp_path / "solved", cache_dir, task, sandbox, (task / "solution" / "solve.sh").read_text())
    assert (solved.data.tags["mlrb.status"], solved.data.metrics["score"]) == ("ok", 1.0)
    nothing = agent_run(tmp_path / "nothing", cache_dir, task, sandbox, "true")
    assert (nothing.data.tags["mlrb.status"], nothing.data.metrics["score"]) == ("ok", 0.0)
    assert solved.data.tags["mlrb.forgeable_reward"] == str(task == IMPORTS).lower()


@pytest.mark.fast
@pytest.mark.parametrize(
    "score, runs, uses_pytest, problem",
    [
        (0.0, [], True, ""),  # a reward of 0 needs nothing
        (1.0, [], False, ""),  # a verifier that runs no pytest (count-words: shell tools)
        (1.0, [], True, "no pytest run reported (a test.sh that replaces PYTHONPATH drops mlrb's report)"),
        (1.0, [{"passed": 0, "failed": 0, "errors": 0, "skipped": 0}], True, "a pytest run ended before it finished"),
        (1.0, [{"passed": 0, "failed": 0, "errors": 0, "skipped": 2, "exitstatus": 0}], True, "no test passed"),
        (1.0, [{"passed": 3, "failed": 1, "errors": 0, "skipped": 0, "exitstatus": 1}], True,
         "1 test(s) failed or errored"),
        (0.75, [{"passed": 3, "failed": 1, "errors": 0, "skipped": 0, "exitstatus": 1}], True, ""),  # partial credit
        (1.0, [{"passed": 3, "failed": 0, "errors": 0, "skipped": 1, "exitstatus": 0}], True, ""),
        (1.0, [{}], False, "a pytest run ended before it finished"),  # a report that cannot be read
    ],
)  # fmt: skip
def test_a_reward_above_0_needs_pytest_s_report_of_passing_tests(score, runs, uses_pytest, problem):
    from mlrb.tasks.harbor.verifier import unbacked

    assert unbacked(score, runs, uses_pytest) == problem


@pytest.mark.fast
def test_the_tests_that_import_the_agent_s_module_are_the_forgeable_ones(tmp_path):
    from mlrb.tasks.harbor.verifier import forgeable

    assert forgeable(TASKS / "count-words") == forgeable(READS) == ""
    assert forgeable(IMPORTS) == "the tests run the workspace's wordcount"
    runs_a_script = tmp_path / "runs-a-script"
    (runs_a_script / "tests").mkdir(parents=True)
    (runs_a_script / "tests" / "test.sh").write_text("python /app/solve_it.py > /logs/verifier/reward.txt\n")
    assert forgeable(runs_a_script) == "the tests run the workspace's solve_it.py"


@pytest.mark.fast
def test_the_verifier_s_home_is_the_harness_s_and_its_python_settings_are_the_harness_s_alone(tmp_path, monkeypatch):
    """Not the copy's HOME (its ~/.local, its dotfiles), and no PYTHON* or PYTEST_* variable of the harness's."""
    from mlrb.tasks.harbor.verifier import HarborVerifier

    monkeypatch.setenv("PYTEST_ADDOPTS", "-p forged")
    monkeypatch.setenv("PYTHONSTARTUP", "/elsewhere/startup.py")
    copy = tmp_path / "scoring" / "submission"
    copy.mkdir(parents=True)
    env = HarborVerifier(60.0, "/app").command(copy, tmp_path / "assets").env
    assert env["HOME"] == "/logs/mlrb/home" and (tmp_path / "scoring" / "verifier-harness" / "home").is_dir()
    assert (env["PYTHONPATH"], env["PYTHONNOUSERSITE"]) == ("/logs/mlrb-site", "1")
    assert env["MLRB_VERIFIER_COPY"] == f"/app:{copy}"
    assert sorted(name for name in env if name.startswith(("PYTHON", "PYTEST"))) == [
        "PYTHONNOUSERSITE", "PYTHONPATH", "PYTHONUNBUFFERED"]  # fmt: skip
