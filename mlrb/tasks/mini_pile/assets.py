"""Tiny, real assets for the MiniPile task (tiny scale).

`build_tiny_assets` writes, deterministically from a seed:

    public/data/{train,validation,test}.jsonl   web-like documents in AlgorithmicResearchGroup/
                                                minipile's format: {"text"}
    public/tokenizer/                           a GPT-2-style tokenizer trained on the train split
    hidden/suite.json, hidden/suite/            SuperGLUE-style sub-tasks (BoolQ, COPA, RTE, WiC)
                                                in their datasets' fields

The documents (`from_scratch/superglue.py`) mix stories that state causes and effects,
reading-quiz pages and sentences using ambiguous words; none holds a hidden row.
"""

from __future__ import annotations

import pathlib
import random

from mlrb.tasks.from_scratch import suites, superglue
from mlrb.tasks.tiny_models import tiny_params, train_byte_level_tokenizer, write_jsonl

# The builder's parameters; their values are in mlrb/conf/task/mini_pile.yaml (scales.tiny.assets).
PARAMS = ("seed", "train_docs", "validation_docs", "test_docs", "vocab_size", "rows_per_subtask", "checkpoint_command")


def build_tiny_assets(out_dir: pathlib.Path, params: dict, group: str) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    p = tiny_params(params, PARAMS, "mini_pile")
    out_dir = pathlib.Path(out_dir)
    public, hidden = out_dir / "public", out_dir / "hidden"
    rng = random.Random(int(p["seed"]))
    suite, passages = superglue.hidden_suite(rng, int(p["rows_per_subtask"]))
    counts = suites.write_hidden_suite(hidden, group, suite)
    splits = {}
    for split in ("train", "validation", "test"):
        splits[split] = superglue.web_documents(rng, int(p[f"{split}_docs"]), exclude=passages)
        write_jsonl(public / "data" / f"{split}.jsonl", [{"text": text} for text in splits[split]])
    tokenizer = train_byte_level_tokenizer(splits["train"], int(p["vocab_size"]))
    tokenizer.save_pretrained(public / "tokenizer")
    return {
        "params": p,
        "data": {
            split: {"path": f"public/data/{split}.jsonl", "rows": len(docs), "words": sum(len(d.split()) for d in docs)}
            for split, docs in splits.items()
        },
        "tokenizer": {"path": "public/tokenizer", "vocab_size": len(tokenizer)},
        "suite": {"group": group, "rows": counts},
    }
