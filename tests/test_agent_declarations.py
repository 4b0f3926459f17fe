"""Each agent kind declares what it does (mlrb.agents.base.Agent), and the harness reads the
declarations: it never probes an agent with hasattr or getattr, so a new kind states its
differences in one place and a typo in a name is an error, not a silent default."""

from __future__ import annotations

import ast

import pytest

from conftest import REPO
from mlrb.agents.base import Agent
from mlrb.core import registry
from mlrb.core.config import AgentConfig

pytestmark = pytest.mark.fast

# The modules that act on a run's agent.
READERS = ("mlrb/run.py", "mlrb/models/metering.py", "mlrb/core/config.py", "mlrb/harness/plan.py", "mlrb/cli.py")


def probes(path: str) -> list[str]:
    """hasattr/getattr calls on anything named like an agent, as `line: source`."""
    source = (REPO / path).read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            target = ast.get_source_segment(source, node.args[0]) or ""
            if "agent" in target.lower():
                found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


@pytest.mark.parametrize("path", READERS)
def test_the_harness_reads_an_agent_s_declarations_and_probes_it_for_nothing(path):
    assert probes(path) == []


def test_a_probe_is_found_where_there_is_one(tmp_path, monkeypatch):
    (tmp_path / "probe.py").write_text("def f(plan):\n    return getattr(plan.agent, 'tools_dir', None)\n")
    monkeypatch.setattr("test_agent_declarations.REPO", tmp_path)
    assert probes("probe.py") == ["2: getattr(plan.agent, 'tools_dir', None)"]


@pytest.mark.parametrize("kind", sorted(registry.AGENTS))
def test_every_agent_kind_is_an_agent_and_declares_only_known_names(kind):
    cls = registry.load(registry.AGENTS[kind])
    assert issubclass(cls, Agent)
    declared = {name for name in vars(cls) if not name.startswith("_")}
    known = {name for name in vars(Agent) if not name.startswith("_")}
    # what a kind sets at class level beyond the base's names is its own helpers (methods), not a
    # declaration the harness would miss: a misspelt declaration is a plain attribute
    misspelt = {name for name in declared - known if not callable(getattr(cls, name)) and
                not isinstance(vars(cls)[name], (classmethod, staticmethod, property))}  # fmt: skip
    assert misspelt == set(), f"{kind} declares {misspelt}, which no harness code reads; known: {sorted(known)}"


def test_an_agent_that_declares_nothing_gets_the_defaults():
    from mlrb.models import metering

    class Plain(Agent):
        def run(self, ctx):
            raise AssertionError("not run here")

    with pytest.raises(TypeError, match="abstract method run"):
        Agent(AgentConfig(kind="baseline", name="plain"))  # a kind must say how it acts
    agent = Plain(AgentConfig(kind="baseline", name="plain"))
    assert (agent.runs_known_solution, agent.emits_tool_events, agent.tools_dir) == (False, False, None)
    assert metering.start(agent) is None  # it calls no model: no proxy
    agent.prepare(REPO)  # nothing to install
    agent.warm_up()
    Agent.check_config(agent.cfg)
