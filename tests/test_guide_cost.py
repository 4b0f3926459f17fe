"""The SLURM guide's cost and GPU-hours (docs/how-to/slurm-claude-code.md, "Know the cost before you
launch") are worked out here from the configs its sweep composes: its tasks at full scale under
budget=24h, at its seeds. A budget, a task's GPUs or the sweep changed and the page not: this fails."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO, compose_config
from test_documented_commands import blocks_of
from test_guide_slurm import PAGE, shell_values

pytestmark = pytest.mark.fast


def the_paper_sweep() -> tuple[list[str], list[str], list[str]]:
    """The guide's full-scale sweep: its tasks, its seeds, and the overrides they share."""
    blocks = blocks_of(PAGE)
    values = shell_values(blocks)
    (full,) = [b for b in blocks if any("task.scale=full" in c and "launcher=slurm" in c for c in b.commands)]
    tasks, seeds, budgets = [], set(), set()
    for command in full.commands:
        if command.startswith("python -m mlrb"):
            words = dict(w.split("=", 1) for w in command.split() if "=" in w)
            tasks += re.sub(r"\$(\w+)", lambda m: values[m.group(1)], words["task"]).split(",")
            seeds.add(words["seed"])
            budgets.add(words["budget"])
    (seed_list,) = seeds
    return tasks, seed_list.split(","), sorted(budgets)


def money(value: float) -> str:
    return f"${value:,.0f}"


def test_the_guides_cost_and_gpu_hours_are_the_configs():
    tasks, seeds, budgets = the_paper_sweep()
    assert sorted(tasks) == sorted(
        ["llm_efficiency", "baby_lm", "mini_pile", "llm_merging", "edge_llm_compression", "edge_llm_training",
         "math_reasoning"]
    )  # fmt: skip
    (budget,) = budgets
    caps, hours, gpus = set(), set(), set()
    for task in tasks:
        adapters = ["task.scales.full.assets.adapters=[a/b,c/d]"] if task == "llm_merging" else []
        cfg = compose_config(f"task={task}", "task.scale=full", f"budget={budget}", *adapters)
        caps.add(cfg.budget.max_usd)
        hours.add(cfg.budget.wall_time_s / 3600)
        gpus.add(cfg.task.scales["full"]["hardware"]["gpus"])
    (cap,), (hour,), (gpu,) = caps, hours, gpus  # one of each across the tasks, as the table says
    runs = len(tasks) * len(seeds)
    page = (REPO / PAGE).read_text()
    row = (f"| {len(tasks)} tasks × {len(seeds)} seeds | {runs} | {runs} × {money(cap)} = {money(runs * cap)} "
           f"| {runs} × {hour:g} h × {gpu} GPU = {runs * hour * gpu:g} |")  # fmt: skip
    assert row in page, row
    assert f"caps its model calls at {money(cap)} (`max_usd`)" in page
    assert f"gives each run {hour:g} hours" in page
    from mlrb.sweep import PROFILES_DIR

    overhead = yaml.safe_load((PROFILES_DIR / "example_gpu_cluster.yaml").read_text())["overhead_min"]
    assert f"`overhead_min` ({overhead} minutes in the example)" in page
