"""Tiny, real assets for the MiniPile task (tiny scale).

`build_tiny_assets` writes, deterministically from a seed:

    public/data/{train,validation,test}.jsonl   web-like documents in AlgorithmicResearchGroup/
                                                minipile's format: {"text"}
    public/tokenizer/                           a GPT-2-style tokenizer trained on the train split
    hidden/suite.json, hidden/suite/            SuperGLUE-style sub-tasks (the YAML's `subtasks`:
                                                COPA) in their datasets' fields

The documents (`from_scratch/superglue.py`) mix stories that state the world's causes and
effects, reading-quiz pages and sentences using ambiguous words; none holds a hidden row.
"""

from __future__ import annotations

import pathlib

from mlrb.task_kit.tiny_models import write_jsonl
from mlrb.tasks.from_scratch import superglue

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = (*superglue.SUITE_PARAMS, "train_docs", "validation_docs", "test_docs")


def check_params(params: dict) -> dict:
    return superglue.check_suite_params(params, PARAMS, "mini_pile", ("train_docs", "validation_docs", "test_docs"))


def build_tiny_assets(out_dir: pathlib.Path, params: dict, group: str) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    b = superglue.suite_build(out_dir, params, PARAMS, "mini_pile", group)
    splits = {}
    for split in ("train", "validation", "test"):
        splits[split] = b.documents(int(b.p[f"{split}_docs"]))
        write_jsonl(b.public / "data" / f"{split}.jsonl", [{"text": text} for text in splits[split]])
    data = {
        split: {"path": f"public/data/{split}.jsonl", "rows": len(docs), "words": sum(len(d.split()) for d in docs)}
        for split, docs in splits.items()
    }
    return b.facts(data, b.tokenizer(splits["train"]))
