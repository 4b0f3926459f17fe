"""A run's plan (mlrb/harness/plan.py): its config resolved once, before anything runs, into what its
stages need; the stages read the plan and nothing else of the config (issue 36)."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import compose_config
from mlrb.core.tags import Tag
from mlrb.harness import plan as plans

pytestmark = pytest.mark.fast


def test_the_plan_names_keys_and_configures_the_run_once_and_cannot_be_changed(monkeypatch):
    from mlrb.agents.baseline import BaselineAgent
    from mlrb.sandbox.bwrap import BwrapSandbox
    from mlrb.tasks.base import Task

    cfg = compose_config("task=llm_merging", "agent=baseline", "seed=3",
                         "tracking.uri=http://alice:s3cret@mlflow.example:5000")  # fmt: skip
    plan = plans.make(cfg)
    assert (plan.experiment, plan.name, plan.seed) == ("llm_merging", "llm_merging/baseline/smoke/3", 3)
    assert plan.key == plans.run_key(cfg) and plan.tags[Tag.RUN_KEY] == plan.key
    assert type(plan.task) is Task and plan.task.name == "llm_merging" and isinstance(plan.agent, BaselineAgent)
    assert plan.sandbox_class is BwrapSandbox and plan.submission == "submission"
    assert plan.sweep_id is None and Tag.SWEEP_ID not in plan.tags  # a single run: of no sweep
    assert plan.params["task.name"] == "llm_merging" and plan.params["seed"] == "3"
    # What it records is the config with the tracking store's password masked.
    assert "s3cret" not in str(dict(plan.params)) + plan.config_yaml
    assert "alice:***@mlflow.example" in plan.params["tracking.uri"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 4  # type: ignore[misc]
    # A job of a sweep, which the sweep tells as config: a retry of it finds the job's run folders by
    # its key and the sweep's id; its name and its key stay the run's own
    job = plans.make(compose_config("task=llm_merging", "agent=baseline", "seed=3", "sweep.id=sweep-1",
                                    "sweep.parent_run_id=p1", "tracking.uri=http://alice:s3cret@mlflow.example:5000"))  # fmt: skip
    assert job.tags[Tag.SWEEP_ID] == "sweep-1" and job.sweep_id == "sweep-1"
    assert job.tags[Tag.PARENT_RUN_ID] == "p1" and (job.key, job.name) == (plan.key, plan.name)


def test_only_the_command_line_and_the_plan_read_the_config_a_run_is_given():
    """execute takes the config and makes the plan; its stages take the plan (no `cfg`)."""
    import inspect

    from mlrb import run

    assert "plans.make(cfg)" in inspect.getsource(run.execute)
    for stage in (run.preflight, run.Stages.__init__):
        assert "cfg" not in inspect.signature(stage).parameters
    assert "cfg" not in inspect.getsource(run.Stages) + inspect.getsource(run.preflight)
