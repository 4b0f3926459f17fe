"""The scoring process: `python -I -m mlrb.scoring.worker REQUEST.json`.

Builds the task from the request, scores the submission and writes the report.
An exception here is a scorer failure (exit 1), never an invalid submission:
the task's `score` returns invalid reports itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlrb import registry
from mlrb.config import TaskConfig


def main(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    task_cfg = TaskConfig(**request["task"])
    task = registry.load(registry.TASKS[task_cfg.name])(task_cfg)
    report = task.score(Path(request["submission"]), Path(request["assets"]), Path(request["work_dir"]))
    Path(request["report"]).write_text(json.dumps(report.to_dict(), indent=2, default=float))


if __name__ == "__main__":
    main(sys.argv[1])
