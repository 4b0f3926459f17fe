"""Run names that read as the configuration, unique within a sweep.

A run is named task/agent/budget/seed; in a sweep that varies other keys too, the
launcher tells each job those keys (the config's `sweep.name_keys`) and each run's name ends
with their values (`llm_merging/baseline/smoke/1 task.scale=full`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

# Always in the name; a sweep's other varying keys are appended.
NAMED = ("task", "agent", "budget", "seed")


def split_override(override: str) -> tuple:
    key, _, value = override.lstrip("+~").partition("=")
    return key, value


def varying_keys(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """Keys whose value differs between the jobs of a sweep, in command-line order."""
    values: dict[str, set] = {}
    for overrides in job_overrides:
        for key, value in map(split_override, overrides):
            values.setdefault(key, set()).add(value)
    return [k for k in values if len(values[k]) > 1]


def extra_name_keys(job_overrides: Sequence[Sequence[str]]) -> list[str]:
    """The varying keys a run's name needs beyond task/agent/budget/seed (Hydra's own excluded)."""
    return [k for k in varying_keys(job_overrides) if k not in NAMED and not k.startswith("hydra.")]


def lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, dict):  # a config group (task, agent, budget: name; sandbox: kind): its choice
        return node.get("name", node.get("kind", node))
    return node


def run_name(cfg: Any) -> str:
    name = f"{cfg.task.name}/{cfg.agent.name}/{cfg.budget.name}/{cfg.seed}"
    keys = list(cfg.sweep.name_keys)
    if not keys:
        return name
    config = dataclasses.asdict(cfg)
    return " ".join([name] + [f"{key}={lookup(config, key)}" for key in keys])


def sweep_name(job_overrides: Sequence[Sequence[str]], first_run: str) -> str:
    """`sweep llm_merging/claude/smoke: seed=1,2,3`: what stays fixed, then each varying key and its values."""
    varying = varying_keys(job_overrides)
    parts = first_run.split(" ")[0].split("/")
    fixed = "/".join(
        p for p, key in zip(parts, NAMED[:3], strict=False) if key not in varying
    )  # the seed is rarely fixed
    values: dict[str, list[str]] = {}
    for overrides in job_overrides:
        for key, value in map(split_override, overrides):
            if key in varying and value not in values.setdefault(key, []):
                values[key].append(value)
    swept = " ".join(f"{key}={','.join(v)}" for key, v in values.items() if not key.startswith("hydra."))
    return f"sweep {fixed}: {swept}" if swept else f"sweep {fixed}"
