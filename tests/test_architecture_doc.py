"""docs/ARCHITECTURE.md's worked examples, run as written: the agent answers through a
real (unconfined) sandbox, the task builds its assets and scores that answer, both found
through the registry as the page says; the sandbox's contract and the cluster profile
are the ones the code has."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from conftest import REPO
from mlrb.agents.base import Agent, AgentContext
from mlrb.agents.recording import open_sink
from mlrb.core import registry
from mlrb.core.budget import Budget
from mlrb.core.config import AgentConfig, BudgetConfig, SandboxConfig
from mlrb.sandbox.base import Limits, Sandbox
from mlrb.sandbox.unconfined import UnconfinedSandbox
from mlrb.tasks.base import Task
from mlrb.tasks.handling import build_assets

pytestmark = pytest.mark.fast

DOC = (REPO / "docs" / "ARCHITECTURE.md").read_text()


def example(name: str) -> str:
    found = re.findall(rf"```\w+ example={name}\n(.*?)```", DOC, re.DOTALL)
    assert len(found) == 1, f"docs/ARCHITECTURE.md has {len(found)} examples named {name}"
    return found[0]


def test_the_agent_and_task_examples_run_and_score_through_the_registry(tmp_path, monkeypatch):
    """The task is a folder as the page shows it (task.py, task.yaml, starter/), in a package of
    tasks beside mlrb's: Hydra offers it as task=answer, named after its folder."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb.core.config import CONF_DIR, register_schema, to_typed

    package = tmp_path / "examples"
    folder = package / "answer"
    (folder / "starter").mkdir(parents=True)
    (package / "answer_agent.py").write_text(example("agent"))
    (folder / "task.py").write_text(example("task"))
    (folder / "task.yaml").write_text(example("task-config"))
    (folder / "starter" / "notes.md").write_text("Write your answer in submission/answer.txt.\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.AGENTS, "answer", "examples.answer_agent:AnswerAgent")  # type: ignore[index]
    monkeypatch.setitem(registry.TASK_PACKAGES, "examples", package)

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task_cfg = to_typed(compose(config_name="config", overrides=["task=answer"])).task
    assert task_cfg.name == "answer" and "answer" in registry.task_folders()
    task = registry.load_task(task_cfg)
    assert type(task) is Task and task.name == "answer"  # a frozen value, made by the folder's task()
    assets = tmp_path / "assets"
    facts = build_assets(task, assets)  # its `build`, as `assets.source: build` (the default) says
    assert (assets / "hidden" / "target.txt").read_text() == "42"
    assert facts["calibration"]["baseline_score"] == -42.0  # the baseline's answer, 0, scored

    workspace, trajectory_file = tmp_path / "workspace", tmp_path / "trajectory.jsonl"
    workspace.mkdir()
    agent = registry.load(registry.AGENTS["answer"])(AgentConfig(name="answer", kind="answer", options={"answer": 40}))
    assert isinstance(agent, Agent) and not agent.runs_known_solution  # what the harness reads of it: declared
    sandbox = UnconfinedSandbox(SandboxConfig(kind="unconfined"), workspace, assets / "public", "doc", Limits())
    sink = open_sink(trajectory_file, recorder=None)
    budget = Budget(BudgetConfig(name="doc", wall_time_s=60, max_steps=3))
    steps = []
    try:
        outcome = agent.run(AgentContext(task, "Answer.", sandbox, budget, sink, seed=0, on_step_end=steps.append))
    finally:
        sandbox.close()
        sink.close()
    assert (outcome.status.value, outcome.message, steps) == ("ok", "answered", [1])
    lines = [json.loads(line) for line in trajectory_file.read_text().splitlines()]
    assert [e["event"] for e in lines] == ["tool_call", "tool_result"]  # what it emitted, as the trajectory has it
    assert lines[0]["arguments"]["command"].startswith("mkdir") and lines[1]["exit_code"] == 0

    report = task.judge.score(workspace / "submission", assets, tmp_path / "scoring")
    assert (report.valid, report.score) == (True, -2.0)
    assert task.judge.score(tmp_path / "empty", assets, tmp_path).reason == "no answer.txt in the submission"
    assert "examples.answer_agent" in sys.modules


def test_the_sandbox_contract_is_the_one_the_page_names():
    section = DOC.split("## Add a sandbox", 1)[1].split("##", 1)[0]
    abstract = set(Sandbox.__abstractmethods__)
    assert abstract == {"preflight", "start_isolated", "exec", "close"}
    assert all(f"`{name}`" in section for name in abstract | {"read_file", "write_file"})
    assert "sandbox/unconfined.py" in section and (REPO / "mlrb" / "sandbox" / "unconfined.py").exists()


def test_the_cluster_profile_has_the_keys_the_shipped_profiles_have():
    profile = yaml.safe_load(example("cluster"))
    shipped = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "mlrb" / "launchers").glob("*.yaml"))]
    known = set().union(*shipped)
    assert set(profile) <= known, set(profile) - known
    assert set(shipped[-1]) <= set(profile)  # local_single_node.yaml's keys, every one of them
    assert all(isinstance(line, str) for line in profile["setup"])


def test_every_module_the_ownership_table_names_exists():
    table = DOC.split("## Who owns what", 1)[1].split("##", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert "core/events.py" in named and "run_files/trajectory.py" in named
    missing = [name for name in named if not (REPO / "mlrb" / name).exists()]
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"


def test_the_price_example_charges_a_call_at_the_config_s_rates_through_the_proxy():
    """The page's worked price: a local server's model (tests/fake_llm_server.py, scripted), priced by
    the config's two rates, called with the OpenAI SDK through a real metering proxy."""
    from fake_llm_server import FakeLlmServer, reply

    namespace: dict = {}
    exec(compile(example("price"), "docs/ARCHITECTURE.md", "exec"), namespace)
    with FakeLlmServer([reply(text="Hello.", usage=(1000, 100))]) as server:
        budget = namespace["one_priced_call"](server.openai_url, "sk-local")
    assert (budget.input_tokens, budget.output_tokens) == (1000, 100)
    assert budget.usd == pytest.approx((1000 * 0.5 + 100 * 1.5) / 1e6)
