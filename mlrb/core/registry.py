"""Names a config may use, mapped to the code behind them.

Agents and sandboxes are "module:attribute" strings, so that looking a name up imports
only the module that implements it, and only when it is needed; a task is found by its
folder, which is its name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlrb.core.messages import ConfigError

# Where tasks are: a package's folder (import name -> path). A task is a folder in one of them
# holding a `task.yaml` (its config, Hydra's group `task`, the folder's name being the task's)
# and a `task.py` whose function `task(cfg, environment)` returns its `Task`; nothing else lists tasks.
TASK_PACKAGES: dict[str, Path] = {"mlrb.tasks": Path(__file__).resolve().parents[1] / "tasks"}
TASK_CONFIG = "task.yaml"
# A task folder's rules, each with how it is enforced: data for its page (docs/hooks/tasks.py), no config.
TASK_RULES = "rules.yaml"


def task_folders() -> dict[str, tuple[str, Path]]:
    """Every task: its name -> (its module's package, its folder)."""
    return {
        config.parent.name: (package, config.parent)
        for package, root in TASK_PACKAGES.items()
        for config in sorted(root.glob(f"*/{TASK_CONFIG}"))
    }


def folder_loaders() -> set[str]:
    """The tasks that load a task from a folder the user names (their config's `path`, required):
    `folder` (MLAgentBench's and MLRC-Bench's layouts) and `harbor` (Harbor's). They are ways in,
    not benchmark tasks of their own: no scales, anchors or rules of theirs."""
    from omegaconf import OmegaConf

    configs = {name: OmegaConf.load(folder / TASK_CONFIG) for name, (_, folder) in task_folders().items()}
    return {name for name, config in configs.items() if "path" in config.keys()}  # `in` skips a `???` value


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

# The check of a review's judge (review.judge): its model's provider, price and API key.
REVIEW_JUDGE = "mlrb.models.judge_model:check_config"


def check_choice(what: str, name: str, choices: Mapping[str, Any]) -> None:
    if name not in choices:
        raise ConfigError(f"unknown {what} '{name}'; valid choices: {', '.join(sorted(choices))}")


def load_task(task_cfg: Any, environment: Path | None = None) -> Any:
    """The task a task config describes (mlrb.tasks.base.Task, a frozen value), its parts running
    in `environment` (the task's own Python environment; None: the harness's): made by the
    function `task(cfg, environment)` of its folder's task.py, the folder being its `kind` if set
    (folder tasks), else its name. Every task is made here."""
    key = task_cfg.kind or task_cfg.name
    folders = task_folders()
    check_choice("task", key, folders)
    return importlib.import_module(f"{folders[key][0]}.{key}.task").task(task_cfg, environment)


def load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
