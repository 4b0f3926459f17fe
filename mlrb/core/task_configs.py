"""Hydra's config group `task`, read from the task folders where they are.

Each task is a folder holding its config (mlrb/core/registry.py). This config source shows those
folders to Hydra as the group `task`: `task/NAME` is NAME/task.yaml (its `name` the folder's
unless it sets one) and `task/NAME/FILE` another YAML file of that folder (values that tasks
share: `from_scratch/shared@_here_` in a task's defaults list). A search-path plugin puts it on
the search path of this process's Hydra, after the primary config folder and any
`--config-dir`, whose own `task/` files come first.

A file is read only when Hydra loads it, so composing a run parses its own task's config
alone. (Hydra's config store would hold every task's config, and Hydra copies the whole store
for each compose, three times a run.)
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

from mlrb.core import registry

GROUP = "task"
SCHEME = "mlrb-tasks"


class TaskFolders(ConfigSource):
    """The task folders of one package of tasks (`mlrb-tasks://PACKAGE`, registry.TASK_PACKAGES)."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    def root(self) -> Path | None:
        return registry.TASK_PACKAGES.get(self.path)

    def file(self, config_path: str) -> Path | None:
        """The file behind `task/NAME` or `task/NAME/FILE`, if the path names one."""
        root, parts = self.root(), PurePosixPath(config_path.strip("/").removesuffix(".yaml")).parts
        if root is None or len(parts) not in (2, 3) or parts[0] != GROUP:
            return None
        if len(parts) == 2:
            return root / parts[1] / registry.TASK_CONFIG
        name = f"{parts[2]}.yaml"
        return None if name == registry.TASK_CONFIG else root / parts[1] / name

    def shared_files(self, folder: str) -> list[Path]:
        root = self.root()
        found = sorted(root.glob(f"{folder}/*.yaml")) if root is not None and folder else []
        return [path for path in found if path.name not in (registry.TASK_CONFIG, registry.TASK_RULES)]

    def available(self) -> bool:
        root = self.root()
        return root is not None and root.is_dir()

    def is_config(self, config_path: str) -> bool:
        path = self.file(config_path)
        return path is not None and path.is_file()

    def is_group(self, config_path: str) -> bool:
        parts = PurePosixPath(config_path.strip("/")).parts
        if len(parts) < 2:
            return parts in ((), (GROUP,))
        return len(parts) == 2 and parts[0] == GROUP and bool(self.shared_files(parts[1]))

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        parts = PurePosixPath(config_path.strip("/")).parts
        root = self.root()
        configs: list[str] = []
        groups: list[str] = []
        if root is None:
            return []
        if parts == ():
            groups = [GROUP]
        elif parts == (GROUP,):
            configs = [name for name, (package, _) in registry.task_folders().items() if package == self.path]
            groups = [path.name for path in root.iterdir() if path.is_dir() and self.shared_files(path.name)]
        elif len(parts) == 2 and parts[0] == GROUP:
            configs = [path.stem for path in self.shared_files(parts[1])]
        wanted = {None: configs + groups, ObjectType.CONFIG: configs, ObjectType.GROUP: groups}[results_filter]
        return sorted(set(wanted))

    def load_config(self, config_path: str) -> ConfigResult:
        path = self.file(config_path)
        if path is None or not path.is_file():
            raise ConfigLoadError(f"Config not found: {config_path} (in {self.root()})")
        text = path.read_text(encoding="utf-8")
        node = OmegaConf.create(text)  # parsed as OmegaConf.load parses a file
        if path.name == registry.TASK_CONFIG and "name" not in node:
            node.name = path.parent.name
        return ConfigResult(
            config=node,
            path=f"{SCHEME}://{self.path}",
            provider="mlrb",
            header=ConfigSource._get_header_dict(text[:512]),
        )


class TaskSearchPath(SearchPathPlugin):
    """Every package of tasks on the search path, after the primary config's folder."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for package in registry.TASK_PACKAGES:
            search_path.append(provider="mlrb", path=f"{SCHEME}://{package}")


def register() -> None:
    """Make the task folders Hydra's group `task` in this process (its plugins are kept with
    Hydra's other state, so a sweep's job processes have them too)."""
    plugins = Plugins.instance()
    plugins.register(TaskFolders)
    plugins.register(TaskSearchPath)
