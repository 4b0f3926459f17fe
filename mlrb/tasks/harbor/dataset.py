"""A dataset of Harbor tasks (a folder of task folders) as one sweep: `python -m mlrb -m task=harbor
'task.path=DIR/*'` runs one job per task folder the pattern matches (a folder holding task.toml),
each its own task in the sweep's summary, the report and mlrb.compare. Hydra's sweeper takes the
pattern as one value; the sweep's launcher expands it here, before its jobs are named."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from mlrb.core.config import ConfigError

KEY = "task.path="
PATTERN_CHARS = "*?["


def is_pattern(path: str) -> bool:
    return any(char in path for char in PATTERN_CHARS)


def expand(job_overrides: Sequence[Sequence[str]]) -> list[list[str]]:
    """Each job whose task.path is a pattern, as one job per Harbor task folder it matches (in order
    of name); a ConfigError when it matches none."""
    jobs: list[list[str]] = []
    for overrides in job_overrides:
        named = [o for o in overrides if o.startswith(KEY) and is_pattern(o[len(KEY) :])]
        if not named:
            jobs.append(list(overrides))
            continue
        pattern = named[-1][len(KEY) :].strip("'\"")
        folders = sorted(
            path for path in glob.glob(str(Path(pattern).expanduser())) if (Path(path) / "task.toml").is_file()
        )
        if not folders:
            raise ConfigError(f"task.path={pattern} matches no Harbor task folder (a folder holding task.toml)")
        jobs += [[f"{KEY}{folder}" if o in named else o for o in overrides] for folder in folders]
    return jobs
