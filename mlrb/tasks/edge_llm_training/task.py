"""NeurIPS 2024 Edge-Device LLM competition, training-from-scratch track (MLRB task
`edge_llm_training`): train a language model from scratch on the given C4 subset and
alpaca-cleaned only, that runs within 1 GB of memory in FP16/FP32, scored with lm-eval's
`super-glue-lm-eval-v1`. Scoring and calibration: see `mlrb/tasks/from_scratch/task.py`
(the memory limit and the FP16/FP32 rule are config values); tiny assets: `assets.py`.
"""

from __future__ import annotations

from pathlib import Path

from mlrb.core.config import TaskConfig
from mlrb.tasks.base import Task
from mlrb.tasks.from_scratch.task import from_scratch_task


def task(cfg: TaskConfig, environment: Path | None) -> Task:
    return from_scratch_task(cfg, environment, module=__name__, suite_group="mlrb_superglue")
