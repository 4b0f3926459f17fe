"""MiniPile Challenge (MLRB task `mini_pile`): pretrain the best language model from scratch
on MiniPile (1M documents of the Pile) within 24 hours, scored with lm-eval's
`super-glue-lm-eval-v1`. Scoring and calibration: see `mlrb/tasks/from_scratch/task.py`;
tiny assets: `assets.py`.
"""

from __future__ import annotations

from mlrb.tasks.from_scratch.task import FromScratchTask


class MiniPile(FromScratchTask):
    suite_group = "mlrb_superglue"
    assets_version = 2
