"""BabyLM Challenge, strict-small track (MLRB task `baby_lm`): pretrain a language model
from scratch on about 10M words of child-directed and simple text, scored on BLiMP's
grammatical minimal pairs with lm-eval. Scoring and calibration: see
`mlrb/tasks/from_scratch/task.py`; tiny assets: `assets.py`.
"""

from __future__ import annotations

from pathlib import Path

from mlrb.core.config import TaskConfig
from mlrb.tasks.base import Task
from mlrb.tasks.from_scratch.task import from_scratch_task


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    return from_scratch_task(cfg, environment, module=__name__, suite_group="mlrb_blimp")
