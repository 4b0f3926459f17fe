"""MiniPile Challenge (MLRB task `mini_pile`): pretrain the best language model from scratch
on MiniPile (1M documents of the Pile) within 24 hours, scored with lm-eval's
`super-glue-lm-eval-v1`. Scoring and calibration: see `mlrb/tasks/from_scratch/task.py`;
tiny assets: `assets.py`.
"""

from __future__ import annotations

from pathlib import Path

from mlrb.core.config import TaskConfig
from mlrb.tasks.base import Task
from mlrb.tasks.from_scratch.task import from_scratch_task


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    return from_scratch_task(cfg, environment, module=__name__, suite_group="mlrb_superglue")
