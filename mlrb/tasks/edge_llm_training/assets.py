"""Tiny, real assets for the Edge-LLM training-from-scratch task (tiny scale).

`build_tiny_assets` writes, deterministically from a seed, the data in the layout of
AlgorithmicResearchGroup/edge_llm_training's two subsets:

    public/data/c4_combined_dataset/train.jsonl   web-like documents, {"text"} (C4's part)
    public/data/alpaca_cleaned/train.jsonl        instruction rows, {"instruction", "input",
                                                  "output"} (alpaca-cleaned's part)
    public/tokenizer/                             a GPT-2-style tokenizer trained on both
    hidden/suite.json, hidden/suite/              SuperGLUE-style sub-tasks (the YAML's `subtasks`)

Text and sub-tasks come from `from_scratch/superglue.py`, as for MiniPile, with another
seed; no training row holds a hidden passage.
"""

from __future__ import annotations

import pathlib

from mlrb.task_kit.tiny_models import write_jsonl
from mlrb.tasks.from_scratch import superglue

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = (*superglue.SUITE_PARAMS, "c4_docs", "alpaca_rows")


def check_params(params: dict) -> dict:
    return superglue.check_suite_params(params, PARAMS, "edge_llm_training", ("c4_docs", "alpaca_rows"))


def build_tiny_assets(out_dir: pathlib.Path, params: dict, group: str) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    b = superglue.suite_build(out_dir, params, PARAMS, "edge_llm_training", group)
    c4 = b.documents(int(b.p["c4_docs"]))
    alpaca = b.instructions(int(b.p["alpaca_rows"]))
    write_jsonl(b.public / "data" / "c4_combined_dataset" / "train.jsonl", [{"text": text} for text in c4])
    write_jsonl(b.public / "data" / "alpaca_cleaned" / "train.jsonl", alpaca)
    # Alpaca rows as the starter renders them, so the tokenizer knows their layout.
    rendered = [f"Instruction: {r['instruction']}\nInput: {r['input']}\nOutput: {r['output']}" for r in alpaca]
    data = {
        "c4_combined_dataset": {"path": "public/data/c4_combined_dataset/train.jsonl", "rows": len(c4)},
        "alpaca_cleaned": {"path": "public/data/alpaca_cleaned/train.jsonl", "rows": len(alpaca)},
    }
    return b.facts(data, b.tokenizer(c4 + rendered))
