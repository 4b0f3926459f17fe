"""Harbor tasks written as Terminal-Bench writes them, run where their instructions say
(tests/harbor_tasks): answer-app's instruction names /app/input.txt and /app/answer.txt under its
Dockerfile's WORKDIR /app, its agent is the image's user `agent` ([agent] user); greeting-system's
verifier checks a Python package the agent installed and a file it wrote in /etc, in the container
the agent left, its starting file /app/name.txt is made by a RUN step of its Dockerfile, and its
solve.sh and test.sh read variables of its [solution] env and [verifier] env.

In Docker the agent works at the image's WORKDIR, holding what the image put there, and the
verifier runs on a snapshot of the agent's container: each task's solution/solve.sh and a scripted
agent of another hand score 1, doing nothing 0, and what the agent leaves where the verifier looks
(a reward, a test.sh of its own, a program that stands in for the verifier's) gets no credit. In
bwrap, environment/'s files appear at /app: answer-app scores as in Docker, greeting-system cannot
be solved there, and the run's warning names what of its Dockerfile is not reproduced."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import run_cli, store_args
from test_bwrap_sandbox import needs_namespaces
from test_docker_sandbox import needs_docker
from test_harbor_verifier import agent_run

TASKS = Path(__file__).parent / "harbor_tasks"
ANSWER, GREETING = TASKS / "answer-app", TASKS / "greeting-system"
PAGE = Path(__file__).parents[1] / "docs" / "formats" / "harbor.md"
# Scripted agents of another hand than solve.sh's, in the task's absolute paths (greeting-system's
# solve.sh takes its greeting from its [solution] env, its test.sh the name from its [verifier] env).
SOLVES = {
    ANSWER: "cd / && total=0; while read -r n; do total=$((total + n)); done < /app/input.txt; "
    "echo $total > /app/answer.txt",
    GREETING: "cd /tmp && printf 'Hello, %s!\\n' \"$(cat /app/name.txt)\" > /app/answer.txt && "
    "target=/usr/local/lib/python3.11/dist-packages && mkdir -p $target && cp -r /opt/vendor/greeting $target && "
    "echo name=Ada > /etc/greeting.conf",
}
# A wrong answer, and a reward of 1 wherever a verifier might look or run: /logs/verifier and /tests
# in its own container (a reward file, a test.sh that writes 1), and reward files in /app.
LEAVES_A_REWARD = (
    "echo 'Hello, Bob!' > /app/answer.txt; mkdir -p /logs/verifier /tests; echo 1 > /logs/verifier/reward.txt; "
    "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh; chmod +x /tests/test.sh; "
    "echo 1 > /app/reward.txt; echo '{\"reward\": 1}' > /app/reward.json"
)
# The package and the configuration done, a wrong answer, and a `cat` put before the system's on PATH
# that prints the right one: a verifier run on that container would read the forged answer.
SHADOWS_CAT = (
    SOLVES[GREETING].replace("Hello, %s!", "Hi, %s.")
    + " && printf '#!/bin/sh\\necho \"Hello, Ada!\"\\n' > /usr/local/bin/cat && chmod +x /usr/local/bin/cat"
)


def state_image_left(run) -> bool:
    """Whether the snapshot of RUN's agent's container is still there."""
    image = f"mlrb-agent-state:{run.info.run_id.lower()}"
    return bool(subprocess.run(["docker", "images", "-q", image], capture_output=True, text=True).stdout.strip())


def outcome(run) -> tuple[str, float]:
    return run.data.tags["mlrb.status"], run.data.metrics.get("score", -1.0)


@pytest.mark.system
@needs_namespaces
@needs_docker
@pytest.mark.parametrize("task", [ANSWER, GREETING], ids=lambda task: task.name)
def test_in_docker_solve_sh_and_a_scripted_agent_score_1_and_doing_nothing_0(tmp_path, cache_dir, task):
    result = run_cli(*store_args(tmp_path / "baseline", cache_dir), "task=harbor", f"task.path={task}",
                     "agent=baseline", "sandbox=docker", cwd=tmp_path)  # fmt: skip
    assert f"{task.name}/baseline/smoke/0: score 1.0000 (valid); status ok" in result.stdout, result.stderr[-3000:]
    workspace = tmp_path / "baseline" / "run" / "workspace"  # the agent's /app, as mlrb keeps it
    # answer-app's [agent] user is the image's `agent` (uid 1000); greeting-system names none: root, as in Harbor
    assert (workspace / "answer.txt").stat().st_uid == (1000 if task == ANSWER else 0)
    if task == GREETING:  # made by the image's RUN step: the workspace held what the image put there
        assert (workspace / "name.txt").read_text() == "Ada\n"
    scripted = agent_run(tmp_path / "scripted", cache_dir, task, "docker", SOLVES[task])
    assert outcome(scripted) == ("ok", 1.0)
    assert outcome(agent_run(tmp_path / "nothing", cache_dir, task, "docker", "true")) == ("ok", 0.0)
    assert not state_image_left(scripted)  # the snapshot of its agent's container, removed once scored


@pytest.mark.system
@needs_namespaces
@needs_docker
def test_a_reward_or_test_sh_the_agent_leaves_in_its_container_counts_for_nothing(tmp_path, cache_dir):
    """/tests and /logs/verifier in the verifier's container are the harness's (the task's tests,
    read-only; a new empty folder), over whatever the agent's snapshot holds there."""
    run = agent_run(tmp_path, cache_dir, GREETING, "docker", LEAVES_A_REWARD)
    assert outcome(run) == ("ok", 0.0)


@pytest.mark.system
@needs_namespaces
@needs_docker
def test_a_program_the_agent_puts_before_the_verifier_s_is_not_run_by_it(tmp_path, cache_dir):
    """Its container is not kept: the verifier runs on the task's image, where the package and the
    configuration are missing too (the agent loses them), and the run says why."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "run.sh").write_text(SHADOWS_CAT + "\n")
    result = run_cli(*store_args(tmp_path, cache_dir), "task=harbor", f"task.path={GREETING}", "sandbox=docker",
                     "agent=command", f"agent.options.program_dir={agent}",
                     "agent.options.command='bash $MLRB_AGENT_DIR/run.sh'", cwd=tmp_path,
                     env={"ANTHROPIC_API_KEY": "sk-ant-harbor-container"})  # fmt: skip
    assert "greeting-system/command/smoke/0: score 0.0000 (valid); status ok" in result.stdout, result.stderr[-3000:]
    assert "the agent changed the system's own programs (/usr/local/bin/cat)" in result.stdout + result.stderr


@pytest.mark.integration
@needs_namespaces
def test_in_bwrap_environment_s_files_are_at_the_workdir_and_the_warning_names_what_is_not_reproduced(
    tmp_path, cache_dir
):
    assert outcome(agent_run(tmp_path / "solved", cache_dir, ANSWER, "bwrap", SOLVES[ANSWER])) == ("ok", 1.0)
    assert outcome(agent_run(tmp_path / "nothing", cache_dir, ANSWER, "bwrap", "true")) == ("ok", 0.0)
    result = run_cli(*store_args(tmp_path / "greeting", cache_dir), "task=harbor", f"task.path={GREETING}",
                     "agent=baseline", cwd=tmp_path)  # fmt: skip
    assert "greeting-system/baseline/smoke/0: score 0.0000 (valid)" in result.stdout, result.stderr[-3000:]
    warning = (
        "harbor task greeting-system: sandbox=bwrap does not build environment/Dockerfile: the agent and the "
        "verifier run on this machine's own tools, environment/'s files at /app; not reproduced: COPY to "
        "/opt/vendor/greeting; RUN printf 'Ada\\n' > /app/name.txt (use sandbox=docker for the task's image)"
    )
    assert warning in result.stdout + result.stderr
    assert warning in PAGE.read_text()  # as the page quotes it


@pytest.mark.fast
@pytest.mark.parametrize(
    "workdir, at",
    [("/app", "/app"), ("/app/", "/app"), ("/srv/./app", "/srv/app"), ("", ""), ("/", ""), ("/data", ""),
     ("/logs/verifier", ""), ("/tests", ""), ("/proc/x", ""), ("/a/../etc", "")],
)  # fmt: skip
def test_a_workdir_that_cannot_be_the_workspace_leaves_it_at_workspace(workdir, at):
    from mlrb.tasks.harbor.layout import workspace_at

    assert workspace_at(workdir) == at


@pytest.mark.fast
def test_what_a_container_changed_of_the_system_s_programs():
    from mlrb.sandbox.docker import system_tools_changed

    changed, added, deleted = 0, 1, 2
    on_path = {"/usr/bin/cat", "/bin/cat"}.__contains__
    changes = [
        ("/usr", changed), ("/usr/bin", changed), ("/usr/bin/cat", changed),  # a program replaced
        ("/usr/local", changed), ("/usr/local/bin", changed), ("/usr/local/bin/cat", added),  # one put before it
        ("/usr/local/bin/greet", added),  # a new program: no system one of that name
        ("/usr/lib/python3/dist-packages/greeting", added), ("/usr/lib/python3/dist-packages/greeting/a.py", added),
        ("/usr/lib/x86_64-linux-gnu/libc.so.6", deleted), ("/etc/ld.so.preload", added), ("/etc/greeting.conf", added),
        ("/app", changed), ("/app/answer.txt", added), ("/root/.bash_history", added),
        ("/usr/local/lib/python3.11/dist-packages/sitecustomize.py", added),  # run by every start of that Python
    ]  # fmt: skip
    assert system_tools_changed(changes, on_path) == [
        "/usr/bin/cat", "/usr/local/bin/cat", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/etc/ld.so.preload",
        "/usr/local/lib/python3.11/dist-packages/sitecustomize.py"]  # fmt: skip


def write_task(tmp_path: Path, toml: str) -> Path:
    """answer-app with another task.toml."""
    import shutil

    folder = tmp_path / "own-settings"
    shutil.copytree(ANSWER, folder)
    (folder / "task.toml").write_text(toml)
    return folder


@pytest.mark.fast
def test_the_task_s_own_settings_are_read_as_harbor_names_them(tmp_path):
    from mlrb.tasks.harbor.layout import read_settings

    folder = write_task(tmp_path, '[verifier]\nenv = { LEVEL = "3" }\n[solution]\nenv = { SEED = "7" }\n'
                        '[agent]\nuser = "agent"\n[environment]\nnetwork_mode = "no-network"\n')  # fmt: skip
    settings = read_settings(folder)
    assert (settings.verifier_env, settings.solution_env) == ({"LEVEL": "3"}, {"SEED": "7"})
    assert (settings.agent_user, settings.network_mode) == ("agent", "no-network")
    older = write_task(tmp_path / "older", "[environment]\nallow_internet = true\n")  # Harbor's older spelling
    assert read_settings(older).network_mode == "public"
    from mlrb.tasks.harbor.own_settings import network_note

    assert network_note("public", False, folder) == (
        "the task asks for the network (network_mode = 'public'): the agent runs offline unless task.network=true")  # fmt: skip
    assert network_note("public", True, folder) == network_note("no-network", False, folder) == ""


@pytest.mark.fast
@pytest.mark.parametrize(
    "toml, override, error",
    [
        ('[[steps]]\nname = "one"\n[steps.agent]\nuser = "root"\n', "", "step one: [steps.agent] user (a step's "
         "own agent user) is not supported by mlrb's Harbor route"),
        ('[environment]\ndocker_image = "ubuntu:24.04"\n', "", "[environment] docker_image (a prebuilt image (mlrb "
         "builds environment/Dockerfile)) is not supported"),
        ('[verifier]\nenv = { KEY = "${OPENAI_API_KEY}" }\n', "", "[verifier] env KEY = '${OPENAI_API_KEY}' names a "
         "variable of this machine, which mlrb does not pass into a sandbox; give its value"),
        ('[verifier]\nenv = { PYTHONPATH = "/x" }\n', "", "[verifier] env PYTHONPATH: mlrb sets it for the verifier"),
        ('[environment]\nnetwork_mode = "no-network"\n', "task.network=true", "the task keeps its agent offline "
         "(network_mode = 'no-network'); task.network=true contradicts it"),
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "task.network=true",
         "network_mode = 'allowlist' (allowed_hosts) cannot be enforced by mlrb; run it with task.network=false"),
    ],
)  # fmt: skip
def test_a_setting_mlrb_cannot_follow_is_one_line_naming_the_key(tmp_path, toml, override, error):
    folder = write_task(tmp_path, toml)
    result = run_cli(*store_args(tmp_path, tmp_path / "cache"), "task=harbor", f"task.path={folder}",
                     *([override] if override else []), cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mlrb: error: {folder / 'task.toml'}: ") and error in last, last
