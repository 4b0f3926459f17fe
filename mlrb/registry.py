"""Names a config may use, mapped to the code behind them.

Values are "module:attribute" strings so that looking a name up imports only
the module that implements it, and only when it is needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from mlrb.messages import ConfigError

TASKS: Mapping[str, str] = {
    "llm_merging": "mlrb.tasks.llm_merging.task:LlmMerging",
    "llm_efficiency": "mlrb.tasks.llm_efficiency.task:LlmEfficiency",
    "edge_llm_compression": "mlrb.tasks.edge_llm_compression.task:EdgeLlmCompression",
    "math_reasoning": "mlrb.tasks.math_reasoning.task:MathReasoning",
    "baby_lm": "mlrb.tasks.baby_lm.task:BabyLm",
    "mini_pile": "mlrb.tasks.mini_pile.task:MiniPile",
    "edge_llm_training": "mlrb.tasks.edge_llm_training.task:EdgeLlmTraining",
    "folder": "mlrb.tasks.folder.task:FolderTask",
}

AGENTS: Mapping[str, str] = {
    "baseline": "mlrb.agents.baseline:BaselineAgent",
    "llm": "mlrb.agents.llm:LlmAgent",
    "command": "mlrb.agents.command:CommandAgent",
    "human": "mlrb.agents.human:HumanAgent",
}

SANDBOXES: Mapping[str, str] = {
    "bwrap": "mlrb.sandbox.bwrap:BwrapSandbox",
    "docker": "mlrb.sandbox.docker:DockerSandbox",
    "unconfined": "mlrb.sandbox.unconfined:UnconfinedSandbox",
}


def check_choice(what: str, name: str, choices: Mapping[str, str]) -> None:
    if name not in choices:
        raise ConfigError(f"unknown {what} '{name}'; valid choices: {', '.join(sorted(choices))}")


def task_class(task_cfg: Any) -> Any:
    """The class behind a task config: its `kind` if set (folder tasks), else its name."""
    key = task_cfg.kind or task_cfg.name
    check_choice("task", key, TASKS)
    return load(TASKS[key])


def load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
