"""BabyLM Challenge, strict-small track (MLRB task `baby_lm`): pretrain a language model
from scratch on about 10M words of child-directed and simple text, scored on BLiMP's
grammatical minimal pairs with lm-eval. Scoring and calibration: see
`mlrb/tasks/from_scratch/task.py`; tiny assets: `assets.py`.
"""

from __future__ import annotations

from mlrb.tasks.from_scratch.task import FromScratchTask


class BabyLm(FromScratchTask):
    suite_group = "mlrb_blimp"
    assets_version = 2
