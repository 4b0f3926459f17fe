"""Tiny, real assets for the LLM efficiency task ("1 LLM + 1 GPU + 1 Day", tiny scale).

`build_tiny_assets` creates, deterministically from a seed, on CPU:

    public/models/mlrb__tiny-llama-base/            the allowed base model (tiny Llama + tokenizer)
    public/models/mlrb__tiny-llama-base-instruct/   its instruction-tuned sibling: NOT allowed
    public/instructions.jsonl   open instruction data in Dolly-15k's format
                                (instruction, context, response, category)
    public/dev.jsonl            dev questions in MMLU's format, for the agent's own checks
    hidden/test.jsonl           held-out test questions, never shown to the agent

Like a real base model, the base is pretrained on "web text": every fact of the
synthetic fact tables (made-up countries and their capitals, ...) stated in several
ways, and, as on the web, question-and-answer pages in both prompt layouts, but no page
asks about a fact. So the base knows the words of questions and instructions yet
answers a question about a fact only as far as the question's words recall it.
Instruction data asks about *other* facts (disjoint from dev and test), each in several
wordings, as Dolly-15k's instructions vary; fine-tuning on it teaches the model to
answer questions from what it already knows; that is what the test measures, as MMLU
measures a fine-tuned base model. The instruction-tuned sibling was fine-tuned longer,
with a chat template, on more instruction data: the shortcut the rules forbid.
"""

from __future__ import annotations

import json
import pathlib
import random

from mlrb.tasks import hub
from mlrb.tasks.tiny_models import (
    BASE_MODEL_PARAMS,
    SKILLS,
    fact_build,
    make_llama,
    train_lm,
    train_tokenizer,
    write_jsonl,
)

BASE_NAME = "mlrb/tiny-llama-base"
INSTRUCT_NAME = "mlrb/tiny-llama-base-instruct"
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}<|assistant|>"

# The builder's parameters; their values are in mlrb/conf/task/llm_efficiency.yaml (scales.tiny.assets).
PARAMS = (*BASE_MODEL_PARAMS, "web_texts", "instruct_steps", "batch_size", "n_train", "rows_per_fact", "n_dev",
          "n_test")  # fmt: skip


# Question-and-answer pages of the web text, in the two layouts fine-tuning uses; they only
# ask what an entity is, never about a fact.
WEB_QA_LAYOUTS = ("Question: {q}\nAnswer: {a}", "Instruction: {q}\n\nResponse: {a}")
# How people word a question to an assistant (Dolly's instructions vary so): the web text's
# Q&A pages and the instruction data both use them.
WORDINGS = ("{q}", "Answer the question. {q}", "{q} Answer in one word.", "Please tell me: {q}",
            "I would like to know: {q}", "Quick question: {q}", "{q} Be brief.", "Can you tell me this? {q}")  # fmt: skip


def _web_text(rng: random.Random, tables, n: int) -> list[str]:
    """Statements of every fact, in varied wording, sentences naming entities and, as on the
    web, pages of questions and answers (what an entity is), so the base knows the words of
    questions and instructions; no question about a fact."""
    texts = []
    for _ in range(n):
        skill = rng.choice(list(tables))
        spec = SKILLS[skill]
        subject, answer = rng.choice(tables[skill])
        draw = rng.random()
        if draw < 0.1:
            layout = rng.choice(WEB_QA_LAYOUTS)
            question = rng.choice(WORDINGS).format(q=f"What is {subject}?")
            texts.append(layout.format(q=question, a=spec["subject_sentence"].format(s=subject)))
        elif draw < 0.3:
            texts.append(spec["subject_sentence"].format(s=subject))
        else:
            texts.append(rng.choice(spec["facts"]).format(s=subject, a=answer))
    return texts


def _instructions(rng: random.Random, skill: str, facts, rows_per_fact: int) -> list[dict]:
    """Dolly-15k-style rows asking about facts, each fact in `rows_per_fact` wordings."""
    question = SKILLS[skill]["question"]
    return [
        {"instruction": wording.format(q=question.format(s=s)), "context": "", "response": a, "category": "open_qa"}
        for s, a in facts
        for wording in rng.sample(WORDINGS, rows_per_fact)
    ]


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    with fact_build(out_dir, params, PARAMS, "llm_efficiency", ("train", "dev", "test")) as b:
        p, rng, public, n_train = b.p, b.rng, b.public, b.per_skill["train"]
        if not 1 <= p["rows_per_fact"] <= len(WORDINGS):
            raise ValueError(f"rows_per_fact must be 1-{len(WORDINGS)} (one row per wording), not {p['rows_per_fact']}")
        instructions: list[dict] = []
        dev: list[dict] = []
        test: list[dict] = []
        for skill, facts in b.tables.items():
            instructions += _instructions(rng, skill, facts[:n_train], p["rows_per_fact"])
            skill_dev, skill_test = b.questions(skill, facts[n_train:])
            dev += skill_dev
            test += skill_test
        for rows in (instructions, dev, test):
            rng.shuffle(rows)
        write_jsonl(public / "instructions.jsonl", instructions)
        write_jsonl(public / "dev.jsonl", dev)
        write_jsonl(b.hidden / "test.jsonl", test)

        corpus = _web_text(rng, b.tables, p["web_texts"])
        # The tokenizer also sees the instruction data's words.
        tok_texts = corpus + [f"Question: {r['instruction']}\nAnswer: {r['response']}" for r in instructions]
        tokenizer = train_tokenizer(tok_texts + ["<|user|> <|assistant|> Instruction: Context: Response:"],
                                    p["vocab_size"])  # fmt: skip
        model, base_loss = b.pretrain(make_llama, tokenizer, [t + tokenizer.eos_token for t in corpus])
        base_dir = public / "models" / hub.folder_name(BASE_NAME)
        model.save_pretrained(base_dir, safe_serialization=True)
        tokenizer.save_pretrained(base_dir)
        _model_card(base_dir, BASE_NAME, "A base model: pretrained on web text only, not instruction-tuned.")

        # The instruction-tuned sibling: full fine-tuning on chat-formatted questions.
        chat = [(f"<|user|> {r['instruction']}\n<|assistant|>", " " + r["response"]) for r in instructions]
        instruct_loss = train_lm(model, tokenizer, chat, p["instruct_steps"], 1e-3, p["batch_size"],
                                 random.Random(b.seed + 2))  # fmt: skip
        instruct_dir = public / "models" / hub.folder_name(INSTRUCT_NAME)
        model.save_pretrained(instruct_dir, safe_serialization=True)
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(instruct_dir)
        _model_card(instruct_dir, INSTRUCT_NAME, f"An instruction-tuned (chat) version of {BASE_NAME}.")

    return {
        "params": p,
        "models": {
            BASE_NAME: {"path": str(base_dir.relative_to(out_dir)), "pretrain_final_loss": round(base_loss, 4)},
            INSTRUCT_NAME: {"path": str(instruct_dir.relative_to(out_dir)), "final_loss": round(instruct_loss, 4)},
        },
        "n_params": sum(t.numel() for t in model.parameters()),
        "instructions": {"path": "public/instructions.jsonl", "n": len(instructions)},
        "dev": {"path": "public/dev.jsonl", "n": len(dev)},
        "test": {"path": "hidden/test.jsonl", "n": len(test)},
    }


def _model_card(model_dir: pathlib.Path, name: str, text: str) -> None:
    (model_dir / "README.md").write_text(f"# {name}\n\n{text}\n")
    (model_dir / "model_info.json").write_text(json.dumps({"name": name}) + "\n")
