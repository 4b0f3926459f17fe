"""Tiny, real assets for the Edge LLM compression task (tiny scale).

`build_tiny_assets` creates, deterministically from a seed, on CPU:

    public/base_model/   a tiny Phi (PhiForCausalLM, like microsoft/phi-2) in FP16 + tokenizer
    public/dev.jsonl     dev questions in MMLU's format, for the agent's own checks
    hidden/test.jsonl    held-out test questions, never shown to the agent

The base model is pretrained on synthetic fact tables (made-up countries and their
capitals, animals and their food, ...), both as statements and as questions, so it
*knows* the answers to dev and test questions, like phi-2 knows much of MMLU. The
task measures how much of that knowledge survives compression. Dev and test ask
about disjoint facts. Saved in FP16, as phi-2 is distributed.
"""

from __future__ import annotations

import pathlib
import random

from mlrb.task_kit.tiny_models import (
    BASE_MODEL_PARAMS,
    SKILLS,
    check_fact_params,
    fact_build,
    qa_text,
    train_tokenizer,
    write_jsonl,
)

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = (*BASE_MODEL_PARAMS, "batch_size", "n_dev", "n_test")


def _pretrain_texts(rng: random.Random, tables, n: int) -> list[str]:
    """Every fact as a question and as statements, plus sentences naming entities."""
    texts = []
    for _ in range(n):
        skill = rng.choice(list(tables))
        spec = SKILLS[skill]
        subject, answer = rng.choice(tables[skill])
        kind = rng.randrange(6)
        if kind == 0:
            texts.append(spec["subject_sentence"].format(s=subject))
        elif kind == 1:
            texts.append(rng.choice(spec["facts"]).format(s=subject, a=answer))
        else:
            texts.append(qa_text(skill, (subject, answer)))
    return texts


def make_phi(tokenizer, p: dict):
    from transformers import PhiConfig, PhiForCausalLM

    from mlrb.task_kit.tiny_models import causal_lm_sizes

    return PhiForCausalLM(PhiConfig(**causal_lm_sizes(tokenizer, p)))


def check_params(params: dict) -> dict:
    return check_fact_params(params, PARAMS, "edge_llm_compression", ("dev", "test"), ("batch_size",))


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    with fact_build(out_dir, params, PARAMS, "edge_llm_compression", ("dev", "test")) as b:
        p, rng = b.p, b.rng
        dev: list[dict] = []
        test: list[dict] = []
        for skill, facts in b.tables.items():
            skill_dev, skill_test = b.questions(skill, facts)
            dev += skill_dev
            test += skill_test
        rng.shuffle(dev)
        rng.shuffle(test)
        write_jsonl(b.public / "dev.jsonl", dev)
        write_jsonl(b.hidden / "test.jsonl", test)

        corpus = _pretrain_texts(rng, b.tables, 6000)
        tokenizer = train_tokenizer(corpus, p["vocab_size"])  # every entity occurs in the corpus
        model, loss = b.pretrain(make_phi, tokenizer, corpus)
        base_dir = b.public / "base_model"
        model.half().save_pretrained(base_dir, safe_serialization=True)
        tokenizer.save_pretrained(base_dir)

    return {
        "params": p,
        "base_model": {
            "path": "public/base_model",
            "params": sum(t.numel() for t in model.parameters()),
            "dtype": "float16",
            "pretrain_final_loss": round(loss, 4),
        },
        "dev": {"path": "public/dev.jsonl", "n": len(dev)},
        "test": {"path": "hidden/test.jsonl", "n": len(test)},
    }
