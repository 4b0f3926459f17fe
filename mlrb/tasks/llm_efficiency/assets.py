"""Tiny, real assets for the LLM efficiency task ("1 LLM + 1 GPU + 1 Day", tiny scale).

`build_tiny_assets` creates, deterministically from a seed, on CPU:

    public/models/mlrb__tiny-llama-base/            the allowed base model (tiny Llama + tokenizer)
    public/models/mlrb__tiny-llama-base-instruct/   its instruction-tuned sibling: NOT allowed
    public/instructions.jsonl   open instruction data in Dolly-15k's format
                                (instruction, context, response, category)
    public/dev.jsonl            dev questions in MMLU's format, for the agent's own checks
    hidden/test.jsonl           held-out test questions, never shown to the agent

What the test measures: answering a question from what the model already knows. Made-up
subjects (countries, animals, minerals, planets) each have two attributes of one kind
(a country's capital and its largest port, both cities), drawn from a shared pool of
answers. The base is pretrained on "web text" that states every fact, so it knows them
as statements (it completes "The capital of Zorbia is" correctly for nearly every test
fact), and on question-and-answer pages that never ask about a fact. Asked the question
("What is the capital of Zorbia?\\nAnswer:"), the untouched base recalls the subject's
attributes but not which one was asked: each test question's wrong choices include the
subject's other attribute, so it scores near a third. Instruction data asks about other
subjects, each fact in several wordings, as Dolly-15k's instructions vary; fine-tuning on
it teaches the model to answer the attribute asked, how well depending on the recipe.
Because the knowledge itself is saturated and the test asks about 960 facts, a score
moves little between seeds. The instruction-tuned sibling was fully fine-tuned for longer,
at a higher rate, with a chat template: the shortcut the rules forbid. Its tuning went on
long enough that an honest LoRA fine-tune on the same kind of data lies only a few percent
of the way toward it (the lineage rule allows 10%).
"""

from __future__ import annotations

import json
import pathlib
import random

from mlrb.task_kit import hub
from mlrb.task_kit.tiny_models import (
    BASE_MODEL_PARAMS,
    BASE_MODEL_SIZES,
    check_counts,
    check_known,
    deterministic,
    make_llama,
    make_names,
    tiny_params,
    train_lm,
    train_tokenizer,
    write_jsonl,
)

BASE_NAME = "mlrb/tiny-llama-base"
INSTRUCT_NAME = "mlrb/tiny-llama-base-instruct"
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}<|assistant|>"

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = (
    *BASE_MODEL_PARAMS,
    "web_texts",
    "answers_per_skill",
    "instruct_steps",
    "instruct_lr",
    "batch_size",
    "n_train",
    "rows_per_fact",
    "n_dev",
    "n_test",
)

# Each skill: a sentence naming a subject (reveals no fact), whether names are capitalised,
# and two attributes of one kind. Each attribute: its question and statements of the fact
# (the question names the attribute before the subject, as its statements do).
SKILLS: dict[str, dict] = {
    "geography": {
        "subject_sentence": "{s} is a country.",
        "capitalize": True,
        "attributes": [
            {
                "question": "What is the capital of {s}?",
                "facts": ["The capital of {s} is {a}.", "{a} is the capital of {s}.", "In {s}, the capital is {a}."],
            },
            {
                "question": "What is the largest port of {s}?",
                "facts": [
                    "The largest port of {s} is {a}.",
                    "{a} is the largest port of {s}.",
                    "In {s}, the largest port is {a}.",
                ],
            },
        ],
    },
    "zoology": {
        "subject_sentence": "The {s} is an animal.",
        "capitalize": False,
        "attributes": [
            {
                "question": "What is the summer food of the {s}?",
                "facts": [
                    "The summer food of the {s} is {a}.",
                    "{a} is the summer food of the {s}.",
                    "In summer, the {s} eats {a}.",
                ],
            },
            {
                "question": "What is the winter food of the {s}?",
                "facts": [
                    "The winter food of the {s} is {a}.",
                    "{a} is the winter food of the {s}.",
                    "In winter, the {s} eats {a}.",
                ],
            },
        ],
    },
    "chemistry": {
        "subject_sentence": "{s} is a mineral.",
        "capitalize": False,
        "attributes": [
            {
                "question": "What is the main metal in {s}?",
                "facts": ["The main metal in {s} is {a}.", "{a} is the main metal in {s}.", "Most of {s} is {a}."],
            },
            {
                "question": "What is the trace metal in {s}?",
                "facts": ["The trace metal in {s} is {a}.", "{a} is the trace metal in {s}.", "A trace of {s} is {a}."],
            },
        ],
    },
    "astronomy": {
        "subject_sentence": "{s} is a planet.",
        "capitalize": True,
        "attributes": [
            {
                "question": "What is the home star of the planet {s}?",
                "facts": [
                    "The home star of the planet {s} is {a}.",
                    "{a} is the home star of the planet {s}.",
                    "The planet {s} orbits {a}.",
                ],
            },
            {
                "question": "What is the brightest night star of the planet {s}?",
                "facts": [
                    "The brightest night star of the planet {s} is {a}.",
                    "{a} is the brightest night star of the planet {s}.",
                    "At night, the planet {s} sees {a}.",
                ],
            },
        ],
    },
}

# Question-and-answer pages of the web text, in the two layouts fine-tuning uses; they only
# ask what an entity is, never about a fact.
WEB_QA_LAYOUTS = ("Question: {q}\nAnswer: {a}", "Instruction: {q}\n\nResponse: {a}")
# Share of the web text that is such pages; the rest states facts.
WEB_QA_SHARE = 0.1
# How people word a question to an assistant (Dolly's instructions vary so): the web text's
# Q&A pages and the instruction data both use them.
WORDINGS = (
    "{q}",
    "Answer the question. {q}",
    "{q} Answer in one word.",
    "Please tell me: {q}",
    "I would like to know: {q}",
    "Quick question: {q}",
    "{q} Be brief.",
    "Can you tell me this? {q}",
)

Subject = tuple[str, list[str]]  # a subject and its attributes' values, in SKILLS' order


def make_world(rng: random.Random, skills: list[str], n_subjects: int, n_answers: int) -> dict[str, list[Subject]]:
    """{skill: [(subject, [value of each attribute])]}: made-up names; a subject's attributes
    are two different answers from the skill's pool, which many subjects share."""
    taken: set[str] = set()
    world = {}
    for skill in skills:
        spec = SKILLS[skill]
        subjects, answers = make_names(rng, n_subjects, taken), make_names(rng, n_answers, taken)
        if spec["capitalize"]:
            subjects, answers = [w.capitalize() for w in subjects], [w.capitalize() for w in answers]
        world[skill] = [(s, rng.sample(answers, len(spec["attributes"]))) for s in subjects]
    return world


def _questions(rng: random.Random, skill: str, subjects: list[Subject], pool: list[str]) -> list[dict]:
    """MMLU-format rows asking each subject's every attribute. The wrong choices: the subject's
    other attribute (what recalling the subject without the question's attribute gives) and
    two other answers from the pool."""
    rows = []
    for subject, values in subjects:
        for index, answer in enumerate(values):
            others = [a for a in pool if a not in values]
            choices = [answer, *(v for v in values if v != answer), *rng.sample(others, 2)]
            rng.shuffle(choices)
            question = SKILLS[skill]["attributes"][index]["question"].format(s=subject)
            rows.append({"question": question, "subject": skill, "choices": choices, "answer": choices.index(answer)})
    return rows


def _instructions(rng: random.Random, skill: str, subjects: list[Subject], rows_per_fact: int) -> list[dict]:
    """Dolly-15k-style rows asking about facts, each fact in `rows_per_fact` wordings."""
    attributes = SKILLS[skill]["attributes"]
    return [
        {
            "instruction": wording.format(q=attributes[i]["question"].format(s=s)),
            "context": "",
            "response": a,
            "category": "open_qa",
        }
        for s, values in subjects
        for i, a in enumerate(values)
        for wording in rng.sample(WORDINGS, rows_per_fact)
    ]


def _web_text(rng: random.Random, world: dict[str, list[Subject]], n: int) -> list[str]:
    """n documents: statements of facts, each in one of its wordings, and, as on the web, pages
    of questions and answers about what an entity is (so the base knows the words of
    questions and instructions), none about a fact."""
    facts = [
        (skill, s, i, a) for skill, subjects in world.items() for s, values in subjects for i, a in enumerate(values)
    ]
    texts = []
    for _ in range(n):
        if rng.random() < WEB_QA_SHARE:
            skill = rng.choice(list(world))
            subject = rng.choice(world[skill])[0]
            question = rng.choice(WORDINGS).format(q=f"What is {subject}?")
            answer = SKILLS[skill]["subject_sentence"].format(s=subject)
            texts.append(rng.choice(WEB_QA_LAYOUTS).format(q=question, a=answer))
        else:
            skill, subject, index, answer = rng.choice(facts)
            texts.append(rng.choice(SKILLS[skill]["attributes"][index]["facts"]).format(s=subject, a=answer))
    return texts


def check_params(params: dict) -> dict:
    """The builder's parameters (`tiny_params`): known skills, a subject per skill in each
    split, enough answers for a question's choices, one wording per instruction row."""
    p = tiny_params(params, PARAMS, "llm_efficiency")
    skills = list(p["skills"])
    check_known("skills", skills, SKILLS)
    check_counts(
        p,
        [
            *BASE_MODEL_SIZES,
            "web_texts",
            "instruct_steps",
            "batch_size",
            "n_train",
            "n_dev",
            "n_test",
            "answers_per_skill",
            "rows_per_fact",
        ],
    )
    if min(p[f"n_{split}"] for split in ("train", "dev", "test")) < len(skills):
        raise ValueError(f"n_train, n_dev and n_test must each give a subject per skill (at least {len(skills)})")
    if p["answers_per_skill"] < 4:
        raise ValueError(f"answers_per_skill must be at least 4 (a question's choices), not {p['answers_per_skill']}")
    if not 1 <= p["rows_per_fact"] <= len(WORDINGS):
        raise ValueError(f"rows_per_fact must be 1-{len(WORDINGS)} (one row per wording), not {p['rows_per_fact']}")
    return p


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    """Build the assets into out_dir; returns manifest facts (paths relative to out_dir)."""
    p = check_params(params)
    skills = list(p["skills"])
    # n_<split>: subjects over all skills, each asked about both attributes.
    per_skill = {split: p[f"n_{split}"] // len(skills) for split in ("train", "dev", "test")}
    seed = int(p["seed"])
    out_dir = pathlib.Path(out_dir)
    public, hidden = out_dir / "public", out_dir / "hidden"
    with deterministic(seed):
        rng = random.Random(seed)
        world = make_world(rng, skills, sum(per_skill.values()), p["answers_per_skill"])
        instructions: list[dict] = []
        dev: list[dict] = []
        test: list[dict] = []
        n_train, n_dev = per_skill["train"], per_skill["dev"]
        for skill, subjects in world.items():
            pool = sorted({a for _, values in subjects for a in values})
            instructions += _instructions(rng, skill, subjects[:n_train], p["rows_per_fact"])
            dev += _questions(rng, skill, subjects[n_train : n_train + n_dev], pool)
            test += _questions(rng, skill, subjects[n_train + n_dev :], pool)
        for rows in (instructions, dev, test):
            rng.shuffle(rows)
        write_jsonl(public / "instructions.jsonl", instructions)
        write_jsonl(public / "dev.jsonl", dev)
        write_jsonl(hidden / "test.jsonl", test)

        corpus = _web_text(rng, world, p["web_texts"])
        # The tokenizer also sees the instruction data's words.
        tok_texts = corpus + [f"Question: {r['instruction']}\nAnswer: {r['response']}" for r in instructions]
        tokenizer = train_tokenizer(
            tok_texts + ["<|user|> <|assistant|> Instruction: Context: Response:"], p["vocab_size"]
        )
        import torch

        torch.manual_seed(seed)
        model = make_llama(tokenizer, p)
        base_loss = train_lm(
            model,
            tokenizer,
            [("", t + tokenizer.eos_token) for t in corpus],
            p["pretrain_steps"],
            p["pretrain_lr"],
            p["batch_size"],
            random.Random(seed + 1),
        )
        base_dir = public / "models" / hub.folder_name(BASE_NAME)
        model.save_pretrained(base_dir, safe_serialization=True)
        tokenizer.save_pretrained(base_dir)
        _model_card(base_dir, BASE_NAME, "A base model: pretrained on web text only, not instruction-tuned.")

        # The instruction-tuned sibling: full fine-tuning on chat-formatted questions.
        chat = [(f"<|user|> {r['instruction']}\n<|assistant|>", " " + r["response"]) for r in instructions]
        instruct_loss = train_lm(
            model, tokenizer, chat, p["instruct_steps"], p["instruct_lr"], p["batch_size"], random.Random(seed + 2)
        )
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
