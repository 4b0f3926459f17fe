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

from mlrb.messages import ConfigError

# Where tasks are: a package's folder (import name -> path). A task is a folder in one of them
# holding a `task.yaml` (its config, Hydra's group `task`, the folder's name being the task's)
# and a `task.py` that defines its `Task` class; nothing else lists tasks.
TASK_PACKAGES: dict[str, Path] = {"mlrb.tasks": Path(__file__).resolve().parent / "tasks"}
TASK_CONFIG = "task.yaml"


def task_folders() -> dict[str, tuple[str, Path]]:
    """Every task: its name -> (its module's package, its folder)."""
    return {
        config.parent.name: (package, config.parent)
        for package, root in TASK_PACKAGES.items()
        for config in sorted(root.glob(f"*/{TASK_CONFIG}"))
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


def check_choice(what: str, name: str, choices: Mapping[str, Any]) -> None:
    if name not in choices:
        raise ConfigError(f"unknown {what} '{name}'; valid choices: {', '.join(sorted(choices))}")


def task_class(task_cfg: Any) -> Any:
    """The class behind a task config: the `Task` that its folder's task.py defines, the
    folder being its `kind` if set (folder tasks), else its name."""
    import inspect

    key = task_cfg.kind or task_cfg.name
    folders = task_folders()
    check_choice("task", key, folders)
    module = importlib.import_module(f"{folders[key][0]}.{key}.task")
    (found,) = [value for value in vars(module).values()
                if inspect.isclass(value) and value.__module__ == module.__name__ and is_task(value)]  # fmt: skip
    return found


def is_task(cls: type) -> bool:
    """A subclass of mlrb.tasks.base.Task (told by name: that module imports this one)."""
    return any((base.__module__, base.__qualname__) == ("mlrb.tasks.base", "Task") for base in cls.__mro__[1:])


def make_task(task_cfg: Any) -> Any:
    """The task a task config describes, configured."""
    return task_class(task_cfg)(task_cfg)


def load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
