"""Tiny, real assets for the BabyLM task (strict-small track, tiny scale).

`build_tiny_assets` writes, deterministically from a seed:

    public/data/{train,dev,test}.jsonl   the corpus in AlgorithmicResearchGroup/babylm's format:
                                         six rows per split, {"filename", "content"}, one per
                                         source (childes, bnc_spoken, gutenberg, ...)
    public/tokenizer/                    a GPT-2-style tokenizer trained on the train split
                                         (GPT-2's own, which the published baseline uses,
                                         cannot be downloaded offline)
    hidden/suite.json, hidden/suite/     BLiMP-style minimal pairs, one file per phenomenon

The corpus is written in the tiny English of `from_scratch/grammar.py`, which has the
agreement rules the minimal pairs test: a model that learned the corpus's grammar
prefers the good sentence, an untrained one is at chance. Its people have made-up names
(`names` of them), used as unevenly as words are (a Zipf law, `zipf`), so how many
names' genders a model knows (himself or herself) grows with its capacity and training.
"""

from __future__ import annotations

import pathlib
import random

from mlrb.task_kit.tiny_models import check_counts, tiny_params, train_byte_level_tokenizer, write_jsonl
from mlrb.tasks.from_scratch import blimp, suites
from mlrb.tasks.from_scratch.grammar import Grammar, People

# BabyLM 2024's strict-small sources, with how often each writes a short story
# rather than one sentence per line.
SOURCES = {
    "childes": 0.1,
    "bnc_spoken": 0.2,
    "gutenberg": 0.6,
    "open_subtitles": 0.2,
    "simple_wiki": 0.4,
    "switchboard": 0.2,
}
SPLIT_SHARES = {"train": 1.0, "dev": 0.1, "test": 0.1}
# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = ("seed", "train_words", "vocab_size", "names", "zipf", "pairs_per_phenomenon", "checkpoint_command")


def source_text(grammar: Grammar, story_share: float, words: int) -> str:
    lines, count = [], 0
    while count < words:
        rng = grammar.rng
        line = grammar.story(rng.randint(3, 6)) if rng.random() < story_share else grammar.sentence()
        lines.append(line)
        count += len(line.split())
    return "\n".join(lines)


def check_params(params: dict) -> dict:
    p = tiny_params(params, PARAMS, "baby_lm")
    check_counts(p, ["train_words", "vocab_size", "names", "pairs_per_phenomenon"])
    return p


def build_tiny_assets(out_dir: pathlib.Path, params: dict, group: str) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    p = check_params(params)
    out_dir = pathlib.Path(out_dir)
    public, hidden = out_dir / "public", out_dir / "hidden"
    # The names come from their own random stream too: the corpus and the pairs share them.
    people = People.made_up(random.Random(int(p["seed"]) + 2), int(p["names"]), float(p["zipf"]))
    rng = random.Random(int(p["seed"]))
    grammar = Grammar(rng, people)
    words_per_source = int(p["train_words"]) // len(SOURCES)
    splits = {}
    for split, share in SPLIT_SHARES.items():
        words = int(share * words_per_source)
        splits[split] = [
            {"filename": f"{source}.{split}", "content": source_text(grammar, story, words)}
            for source, story in SOURCES.items()
        ]
        write_jsonl(public / "data" / f"{split}.jsonl", splits[split])
    tokenizer = train_byte_level_tokenizer([row["content"] for row in splits["train"]], int(p["vocab_size"]))
    tokenizer.save_pretrained(public / "tokenizer")

    # The pairs come from their own random stream, so the corpus does not depend on them.
    pair_rng = random.Random(int(p["seed"]) + 1)
    n_pairs = int(p["pairs_per_phenomenon"])
    counts = suites.write_hidden_suite(
        hidden, group, {uid: ("blimp", blimp.minimal_pairs(pair_rng, uid, n_pairs, people)) for uid in blimp.PHENOMENA}
    )
    return {
        "params": p,
        "data": {
            split: {"path": f"public/data/{split}.jsonl", "words": sum(len(r["content"].split()) for r in rows)}
            for split, rows in splits.items()
        },
        "tokenizer": {"path": "public/tokenizer", "vocab_size": len(tokenizer)},
        "suite": {"group": group, "pairs": counts},
    }
