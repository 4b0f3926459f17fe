"""Hidden evaluation suites as lm-eval tasks, and per-sub-task scores from lm-eval's results.

At tiny scale a suite is a few jsonl files in the formats of BLiMP or SuperGLUE. Each
becomes a local lm-eval task that *includes lm-eval's own YAML* for that format (its
prompt, choices, target and metric) and only swaps the dataset for the local file, so
the tiny scale scores with exactly the prompts of `blimp` and `super-glue-lm-eval-v1`.
A local group ties them together. At full scale the suite is lm-eval's built-in task.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Sub-task format -> (lm-eval's YAML for it, relative to lm_eval/tasks; the split it scores).
FORMATS = {
    "blimp": ("blimp/_template_yaml", "train"),
    "boolq": ("super_glue/boolq/default.yaml", "validation"),
    "cb": ("super_glue/cb/default.yaml", "validation"),
    "copa": ("super_glue/copa/default.yaml", "validation"),
    "rte": ("super_glue/rte/default.yaml", "validation"),
    "wic": ("super_glue/wic/default.yaml", "validation"),
}
# (ReCoRD is left out: lm-eval 0.4.13's ReCoRD code imports transformers.data.metrics,
# which transformers 5 removed.)
# The metric that counts for a sub-task, in order of preference (ReCoRD has no accuracy).
PRIMARY_METRICS = ("acc", "f1", "em")
# Names of lm-eval's own sub-tasks that differ from the sub-task's (RTE is `sglue_rte` there).
LEAF_PREFIXES = ("blimp_", "sglue_")


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def write_suite(task_dir: Path, group: str, data_dir: Path, subtasks: dict[str, str]) -> list[str]:
    """Write `<group>_<subtask>.yaml` per sub-task ({name: format}; data at data_dir/<name>.jsonl)
    and `<group>.yaml`, a group averaging their accuracy unweighted (as BLiMP's does).
    Returns the leaf task names. Written at scoring time: the YAMLs hold absolute paths."""
    task_dir = Path(task_dir)
    task_dir.mkdir(parents=True, exist_ok=True)
    base = lm_eval_tasks_dir()
    leaves = []
    for name, fmt in subtasks.items():
        if fmt not in FORMATS:
            raise ValueError(f"unknown sub-task format '{fmt}'; known: {', '.join(FORMATS)}")
        template, split = FORMATS[fmt]
        data_file = (Path(data_dir) / f"{name}.jsonl").resolve()
        if not data_file.is_file():
            raise FileNotFoundError(f"hidden data for sub-task '{name}' is missing: {data_file}")
        leaf = f"{group}_{name}"
        config: dict[str, Any] = {
            "include": str(base / template),
            "task": leaf,
            "tag": [],  # not part of lm-eval's own groups
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(data_file)}},
            "training_split": None,
            "validation_split": split,
            "test_split": None,
            "num_fewshot": 0,
        }
        # JSON is valid YAML and quotes every string safely.
        (task_dir / f"{leaf}.yaml").write_text(json.dumps(config, indent=2) + "\n")
        leaves.append(leaf)
    group_config = {
        "group": group,
        "task": leaves,
        "aggregate_metric_list": [{"metric": "acc", "aggregation": "mean", "weight_by_size": False}],
        "metadata": {"version": 1.0},
    }
    (task_dir / f"{group}.yaml").write_text(json.dumps(group_config, indent=2) + "\n")
    return leaves


def subtask_scores(raw: dict, group: str) -> dict[str, float]:
    """{sub-task: its primary metric} for every leaf task in lm-eval's results, named
    without the group's or lm-eval's prefix (so tiny and full scale report alike)."""
    results = raw.get("results", {})
    groups = set(raw.get("group_subtasks", {})) | set(raw.get("groups", {}))
    scores = {}
    for leaf, row in results.items():
        if leaf in groups:
            continue
        value = next(
            (row[f"{m},none"] for m in PRIMARY_METRICS if isinstance(row.get(f"{m},none"), (int, float))), None
        )
        if value is None or math.isnan(value):
            continue
        name = leaf[len(group) + 1 :] if leaf.startswith(group + "_") else leaf
        for prefix in LEAF_PREFIXES:
            name = name[len(prefix) :] if name.startswith(prefix) else name
        scores[name] = float(value)
    return dict(sorted(scores.items()))


def write_hidden_suite(hidden: Path, group: str, subtasks: dict[str, tuple]) -> dict[str, int]:
    """Store a tiny suite in the hidden assets: hidden/suite/<name>.jsonl per sub-task
    ({name: (format, rows)}) and hidden/suite.json naming the group and formats, which the
    scorer turns into lm-eval tasks. Returns {name: number of rows}."""
    folder = Path(hidden) / "suite"
    folder.mkdir(parents=True, exist_ok=True)
    for name, (fmt, rows) in subtasks.items():
        if fmt not in FORMATS:
            raise ValueError(f"unknown sub-task format '{fmt}'; known: {', '.join(FORMATS)}")
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = {"group": group, "subtasks": {name: fmt for name, (fmt, _) in subtasks.items()}}
    (Path(hidden) / "suite.json").write_text(json.dumps(spec, indent=2) + "\n")
    return {name: len(rows) for name, (_, rows) in subtasks.items()}
