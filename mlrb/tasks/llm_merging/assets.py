"""Tiny, real assets for the LLM Merging task (NeurIPS 2024 competition, tiny scale).

`build_tiny_assets` creates, deterministically from a seed and on CPU in well under
a minute:

    public/base_model/          tiny LlamaForCausalLM + BPE tokenizer (safetensors)
    public/adapters/<skill>/    one peft LoRA adapter per skill
    public/dev.jsonl            dev questions the agent may use to tune its merge
    hidden/test.jsonl           held-out test questions, never shown to the agent

Each *skill* is a synthetic fact table in its own domain (made-up countries and
their capitals, made-up animals and their food, ...). The base model is pretrained
on sentences naming every entity plus questions about separate *background* facts,
so it knows the format and how to look facts up, but none of the task's facts (about
chance on 4-way multiple choice). Each adapter is fine-tuned (LoRA on the MLPs) on
its own skill's facts only, so a single adapter scores ~100% on its own subject and
about chance on the others; a good merge should keep both.

Dev and test ask about disjoint facts, so fitting the dev set cannot leak test
answers. Rows follow MMLU's format:
    {"question": str, "subject": skill, "choices": [4 str], "answer": 0..3}

Prompts use lm-eval's mmlu_continuation layout ("Question: ...\\nAnswer: <choice>"),
which is what `mlrb.scoring.lmeval.mc_task_config` scores.

Heavy libraries (torch, transformers, peft, tokenizers) are imported inside
functions so importing this module stays cheap.
"""

from __future__ import annotations

import json
import pathlib
import random

from mlrb.task_kit.tiny_models import (
    BASE_MODEL_PARAMS,
    SKILLS,
    check_fact_params,
    deterministic,
    format_prompt,
    make_fact_tables,
    make_llama,
    mc_row,
    train_lm,
    train_tokenizer,
    write_jsonl,
)

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = (
    *BASE_MODEL_PARAMS,
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "train_steps",
    "lr",
    "batch_size",
    "n_dev",
    "n_test",
    "n_background",
)

# ----------------------------------------------------------------------------- data


def _split_rows(rng, tables, n_dev_per_skill) -> tuple[list[dict], list[dict]]:
    """Dev rows use the first facts of each table, test rows the rest (disjoint facts)."""
    dev: list[dict] = []
    test: list[dict] = []
    for skill, facts in tables.items():
        pool = [a for _, a in facts]
        for i, fact in enumerate(facts):
            row = mc_row(rng, skill, fact, pool)
            (dev if i < n_dev_per_skill else test).append(row)
    rng.shuffle(dev)
    rng.shuffle(test)
    return dev, test


def _pretrain_texts(rng: random.Random, tables, background, n: int) -> list[str]:
    """Generic text for the base: sentences naming every entity (so all words get
    embeddings) and QA pairs about *background* facts only, which teach the base how
    to answer such questions without revealing any task fact."""
    texts = []
    skills = list(tables)
    for _ in range(n):
        skill = rng.choice(skills)
        spec = SKILLS[skill]
        subject, answer = rng.choice(tables[skill] + background[skill])
        kind = rng.randrange(4)
        if kind == 0:
            texts.append(spec["subject_sentence"].format(s=subject))
        elif kind == 1:
            texts.append(spec["answer_sentence"].format(a=answer))
        else:
            bs, ba = rng.choice(background[skill])
            texts.append(format_prompt(spec["question"].format(s=bs)) + " " + ba)
    return texts


def _skill_pairs(skill: str, facts) -> list[tuple[str, str]]:
    """(prompt, continuation) pairs an adapter is trained on: its whole fact table."""
    q = SKILLS[skill]["question"]
    return [(format_prompt(q.format(s=s)), " " + a) for s, a in facts]


def _tidy_adapter_dir(out: pathlib.Path, skill: str) -> None:
    """peft records the build-time absolute base path, which is wrong once the caller
    moves out_dir: point it at the sibling base model instead, and replace peft's
    empty model-card template with a short, non-revealing description."""
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = "../../base_model"
    if isinstance(cfg.get("target_modules"), list):  # peft writes a set, in hash order
        cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(
        f"# LoRA adapter: {skill}\n\nLoRA fine-tuned from ../../base_model on {skill} questions.\n"
    )


def _train_adapter(base_dir: pathlib.Path, tokenizer, skill: str, facts, p: dict, seed: int, out: pathlib.Path) -> dict:
    """Fresh copy of the base + LoRA trained on one skill's facts; saves the adapter only."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=p["lora_rank"],
        lora_alpha=p["lora_alpha"],
        lora_dropout=0.0,
        target_modules=list(p["lora_targets"]),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    pairs = _skill_pairs(skill, facts)
    loss = train_lm(model, tokenizer, pairs, p["train_steps"], p["lr"], p["batch_size"], random.Random(seed))
    model.save_pretrained(str(out), safe_serialization=True)
    _tidy_adapter_dir(out, skill)
    n_lora = sum(t.numel() for name, t in model.named_parameters() if "lora_" in name)
    return {"final_loss": round(loss, 4), "lora_params": n_lora, "n_facts": len(facts)}


# ---------------------------------------------------------------------------- entry


def check_params(params: dict) -> dict:
    return check_fact_params(params, PARAMS, "llm_merging", ("dev", "test"), ("lora_rank", "train_steps", "batch_size"))


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    """Build the tiny LLM-merging assets into `out_dir` and return a manifest dict.

    params: every name in PARAMS, valued in this folder's task.yaml (scales.tiny.assets);
    everything is derived from `seed`.

    Takes about a minute on 2 CPU cores (runs under `deterministic(seed)`: two builds give
    byte-identical files). Paths in the returned dict are relative to out_dir.
    The caller handles caching, locking and atomic renames; this function only
    writes into out_dir.
    """
    import torch

    p = check_params(params)
    out_dir = pathlib.Path(out_dir)
    public, hidden = out_dir / "public", out_dir / "hidden"
    seed = int(p["seed"])
    skills = list(p["skills"])
    n_dev_per = p["n_dev"] // len(skills)
    n_test_per = p["n_test"] // len(skills)

    with deterministic(seed):  # results must not depend on the machine's core count
        rng = random.Random(seed)
        tables = make_fact_tables(rng, skills, n_dev_per + n_test_per + p["n_background"])
        background = {k: v[: p["n_background"]] for k, v in tables.items()}
        tables = {k: v[p["n_background"] :] for k, v in tables.items()}
        dev, test = _split_rows(rng, tables, n_dev_per)
        write_jsonl(public / "dev.jsonl", dev)
        write_jsonl(hidden / "test.jsonl", test)

        # Tokenizer + base model. The tokenizer also sees every dev/test choice so that
        # no answer word is out of vocabulary (it learns nothing about which is right).
        corpus = _pretrain_texts(rng, tables, background, 4000)
        tok_corpus = corpus + [format_prompt(r["question"]) + " " + c for r in dev + test for c in r["choices"]]
        tokenizer = train_tokenizer(tok_corpus, p["vocab_size"])
        torch.manual_seed(seed)
        model = make_llama(tokenizer, p)
        base_loss = train_lm(
            model,
            tokenizer,
            [("", t) for t in corpus],
            p["pretrain_steps"],
            p["pretrain_lr"],
            p["batch_size"],
            random.Random(seed + 1),
        )
        base_dir = public / "base_model"
        model.save_pretrained(base_dir, safe_serialization=True)
        tokenizer.save_pretrained(base_dir)

        adapters = {}
        for i, skill in enumerate(skills):
            out = public / "adapters" / skill
            info = _train_adapter(base_dir, tokenizer, skill, tables[skill], p, seed + 100 + i, out)
            adapters[skill] = {"path": str(out.relative_to(out_dir)), **info}

    return {
        "params": p,
        "skills": skills,
        "base_model": {
            "path": str(base_dir.relative_to(out_dir)),
            "params": sum(t.numel() for t in model.parameters()),
            "vocab_size": len(tokenizer),
            "pretrain_final_loss": round(base_loss, 4),
        },
        "adapters": adapters,
        "dev": {"path": "public/dev.jsonl", "n": len(dev)},
        "test": {"path": "hidden/test.jsonl", "n": len(test)},
    }
