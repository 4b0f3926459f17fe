"""A task's asset builder: the part that makes the folder its runs read, `public/` (the
agent may read it) and `hidden/` (it never may), by the maker that the scale's
`assets.source` names.

Each maker is `(out_dir, params) -> facts for the manifest`, params being the scale's
`assets` less `source` and `anchor_seeds` (the anchors' own). A packaged task's makers are
`build` (its assets.py, on this machine: the tiny scale) and `hub` (downloaded through the
Hugging Face cache: the full scale); a task folder's one maker copies and prepares its
files. The anchors part (anchors.py) then measures on what was made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.core import registry
from mlrb.core.config import ConfigError
from mlrb.tasks.anchors import DEFAULT_SEEDS

Maker = Callable[[Path, dict[str, Any]], dict[str, Any]]
# Part of the assets' params, not the builder's: where they come from, and the anchors' seeds.
NOT_THE_MAKERS = ("source", "anchor_seeds")


@dataclass(frozen=True)
class AssetBuilder:
    task_name: str
    # The scale's `assets`, `source` and `anchor_seeds` included.
    params: Mapping[str, Any]
    # source -> its maker; a source not here is refused by name.
    makers: Mapping[str, Maker]
    # "module:function" that checks the `build` maker's params before anything is built
    # (raising ValueError or TypeError that names the bad key and what is valid), imported
    # only then; None, or a module that does not exist or has no such function: nothing to check.
    check: str | None = None

    @property
    def source(self) -> str:
        return str(self.params.get("source", "build"))

    def makers_params(self) -> dict[str, Any]:
        return {key: value for key, value in self.params.items() if key not in NOT_THE_MAKERS}

    def make(self, out_dir: Path) -> dict[str, Any]:
        """Write the assets into out_dir; the facts for its manifest."""
        if self.source not in self.makers:
            raise ValueError(
                f"unknown assets.source '{self.source}' for task {self.task_name}; valid: {', '.join(self.makers)}"
            )
        return self.makers[self.source](out_dir, self.makers_params())

    def check_params(self, scale: str) -> None:
        """The params, checked when the config is, so that a bad one is one line (ConfigError)
        before anything is built or recorded."""
        seeds = self.params.get("anchor_seeds", DEFAULT_SEEDS)
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ConfigError(
                f"task.scales.{scale}.assets.anchor_seeds must be a whole number of seeds, at least 1 "
                f"(default {DEFAULT_SEEDS}); got {seeds!r}"
            )
        if self.source != "build" or self.check is None:
            return
        module, _, _ = self.check.partition(":")
        try:
            check = registry.load(self.check)
        except ModuleNotFoundError as e:
            if e.name != module:  # the builder module is there but imports what is missing: say so
                raise ConfigError(
                    f"task {self.task_name}: its builder {module} cannot be imported: {e}; install {e.name} beside mlrb"
                ) from None
            return  # no builder module (a task folder)
        except AttributeError:  # a builder module without a check
            return
        try:
            check(self.makers_params())
        except (ValueError, TypeError) as e:  # TypeError: a value of the wrong kind (n_test=abc)
            raise ConfigError(f"task.scales.{scale}.assets: {e}") from None
