"""Shared builders for the tasks' tiny scale: synthetic fact tables in MMLU's format,
a BPE tokenizer trained in a second, tiny Hugging Face models and a plain training loop.

Everything is deterministic from a seed (run builds under `deterministic(seed)` so
results do not depend on the core count or on earlier random draws). Heavy libraries (torch, transformers,
tokenizers) are imported inside functions so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

MAX_POSITIONS = 128  # prompts are ~20 tokens
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"

# Each skill: a question template over a "subject" entity and its answer entity,
# sentence templates naming one entity (generic text, reveals no fact) and
# `facts`: declarative statements of one fact (the knowledge a base model may hold).
SKILLS: dict[str, dict] = {
    "geography": {
        "question": "What is the capital of {s}?",
        "subject_sentence": "{s} is a country.",
        "answer_sentence": "{a} is a city.",
        "facts": ["The capital of {s} is {a}.", "{a} is the capital of {s}.", "In {s}, the capital city is {a}."],
        "capitalize": True,
    },
    "zoology": {
        "question": "What does the {s} eat?",
        "subject_sentence": "The {s} is an animal.",
        "answer_sentence": "The {a} is a kind of food.",
        "facts": ["The {s} eats {a}.", "{a} is what the {s} eats.", "The food of the {s} is {a}."],
        "capitalize": False,
    },
    "chemistry": {
        "question": "Which metal is mined from {s}?",
        "subject_sentence": "{s} is a mineral.",
        "answer_sentence": "{a} is a metal.",
        "facts": ["The metal mined from {s} is {a}.", "{a} is mined from {s}.", "From {s}, miners get {a}."],
        "capitalize": False,
    },
    "astronomy": {
        "question": "Which star does the planet {s} orbit?",
        "subject_sentence": "{s} is a planet.",
        "answer_sentence": "{a} is a star.",
        "facts": ["The planet {s} orbits {a}.", "{a} is the star of {s}.", "The star that {s} orbits is {a}."],
        "capitalize": True,
    },
}


def format_prompt(question: str) -> str:
    """Prompt exactly as the scorer renders it (lm-eval mmlu_continuation style)."""
    return f"Question: {question.strip()}\nAnswer:"


@contextlib.contextmanager
def deterministic(seed: int):
    """Build under fixed conditions, so two builds on one machine give byte-identical
    files: Python's, NumPy's and torch's generators seeded, one torch thread (floating-point
    sums then cannot depend on the core count; ~20% slower at these sizes) and torch's
    deterministic algorithms. Restored afterwards."""
    import numpy as np
    import torch

    old_threads, old_algorithms = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_algorithms)


# What every fact-world builder takes for its base model (make_llama, train_lm on the facts):
# the skills, the tokenizer and model sizes, and the pretraining run. Each builder adds its own.
BASE_MODEL_PARAMS = (
    "seed",
    "skills",
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_heads",
    "intermediate_size",
    "pretrain_steps",
    "pretrain_lr",
)
# Those of them that are sizes and counts (whole numbers above 0).
BASE_MODEL_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "pretrain_steps")


def tiny_params(params: dict, names: tuple, task: str) -> dict:
    """A tiny builder's parameters, all from the task's YAML (`task.scales.tiny.assets`), the
    one place asset sizes are set: a missing or unknown key is an error naming it (each
    builder's `check_params`, which the config check runs before any build, starts here)."""
    params = dict(params or {})
    missing = [name for name in names if name not in params]
    unknown = sorted(set(params) - set(names))
    if missing or unknown:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else []
        )
        raise ValueError(f"{'; '.join(problems)}; the {task} tiny builder takes {', '.join(names)}")
    return params


# ----------------------------------------------------------------------------- data


def zipf_weights(rng: random.Random, n: int, exponent: float) -> list[float]:
    """How often a text uses each of n items: a Zipf law (1 / rank ** exponent) over a random
    ranking, so a few items are common and most are rare."""
    ranks = list(range(n))
    rng.shuffle(ranks)
    return [1.0 / (rank + 1) ** exponent for rank in ranks]


def make_names(rng: random.Random, n: int, taken: set[str]) -> list[str]:
    """n new made-up words of 2-3 consonant-vowel syllables, unique across all pools."""
    names: list[str] = []
    while len(names) < n:
        syllables = rng.randint(2, 3)
        word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
        if word not in taken:
            taken.add(word)
            names.append(word)
    return names


def make_fact_tables(rng: random.Random, skills: list[str], n_facts: int) -> dict[str, list[tuple[str, str]]]:
    """{skill: [(subject, answer), ...]}: a random bijection per skill."""
    taken: set[str] = set()
    tables = {}
    for skill in skills:
        spec = SKILLS[skill]
        subjects = make_names(rng, n_facts, taken)
        answers = make_names(rng, n_facts, taken)
        if spec["capitalize"]:
            subjects = [w.capitalize() for w in subjects]
            answers = [w.capitalize() for w in answers]
        tables[skill] = list(zip(subjects, answers, strict=True))
    return tables


def mc_row(rng: random.Random, skill: str, fact: tuple[str, str], answer_pool: list[str]) -> dict:
    """One MMLU-format row; distractors are other answers of the same skill."""
    subject, answer = fact
    distractors = rng.sample([a for a in answer_pool if a != answer], 3)
    choices = distractors + [answer]
    rng.shuffle(choices)
    return {
        "question": SKILLS[skill]["question"].format(s=subject),
        "subject": skill,
        "choices": choices,
        "answer": choices.index(answer),
    }


def qa_text(skill: str, fact: tuple[str, str]) -> str:
    """A fact as a question-answer text, in the scorer's prompt layout."""
    subject, answer = fact
    return format_prompt(SKILLS[skill]["question"].format(s=subject)) + " " + answer


def write_jsonl(path: pathlib.Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------ tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int = MAX_POSITIONS):
    """BPE tokenizer trained on the task text, Llama-like: '▁' marks word starts and a
    BOS token is prepended. Punctuation and newlines are split off so that
    encode(prompt) is always a prefix of encode(prompt + ' ' + answer), which
    lm-eval relies on when scoring continuations."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\n?.:,]"), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_length,
    )


# --------------------------------------------------------------------------- models


def causal_lm_sizes(tokenizer, p: dict) -> dict:
    """Config values every tiny causal LM shares: sizes from p, special tokens from the tokenizer."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_layers"],
        num_attention_heads=p["num_heads"],
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def make_llama(tokenizer, p: dict):
    """A tiny LlamaForCausalLM sized by p's hidden_size, intermediate_size, num_layers, num_heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_key_value_heads=p["num_heads"], **causal_lm_sizes(tokenizer, p)))


def lm_batch(tokenizer, pairs: list[tuple[str, str]], encode: Callable[[str], list[int]]):
    """Right-padded batch; labels only on the continuation tokens (-100 elsewhere).
    An empty prompt means "loss on every token" (plain language modelling). `encode(text)`
    gives a text's token ids."""
    import torch

    ids, labels = [], []
    for prompt, cont in pairs:
        full = encode(prompt + cont)
        n_prompt = len(encode(prompt)) if prompt else 1  # never predict BOS
        ids.append(full)
        labels.append([-100] * n_prompt + full[n_prompt:])
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    label_t = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
    return input_ids, attention, label_t


def train_lm(model, tokenizer, pairs, steps: int, lr: float, batch_size: int, rng: random.Random) -> float:
    """Plain AdamW loop over random minibatches; returns the mean loss of the last 10 steps."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    # Each text tokenized once: thousands of steps draw from a few thousand texts (the same ids).
    encode = functools.cache(lambda text: tokenizer(text)["input_ids"])
    model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        input_ids, attention, labels = lm_batch(tokenizer, batch, encode)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-10:]
    return sum(tail) / len(tail)


def train_byte_level_tokenizer(texts, vocab_size: int, max_length: int = 1024):
    """A GPT-2-style tokenizer (byte-level BPE, no prefix space, one `<|endoftext|>` token
    for BOS, EOS and padding) trained on `texts`: what a from-scratch task ships in place of
    GPT-2's own tokenizer, which cannot be downloaded offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    end = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[end],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end, pad_token=end, model_max_length=max_length
    )


# ----------------------------------------------------------------------- fact builds


@dataclass
class FactBuild:
    """A fact-table task's tiny build under way (see `fact_build`)."""

    p: dict  # the builder's parameters
    public: pathlib.Path
    hidden: pathlib.Path
    seed: int
    rng: random.Random
    tables: dict[str, list[tuple[str, str]]]  # skill -> its facts, split after split
    per_skill: dict[str, int]  # split -> facts per skill

    def questions(self, skill: str, facts: list[tuple[str, str]]) -> tuple[list[dict], list[dict]]:
        """Multiple-choice rows about facts (mc_row; wrong choices from the same facts' answers):
        the first `per_skill["dev"]` for dev, the rest for test."""
        pool = [a for _, a in facts]
        rows = [mc_row(self.rng, skill, fact, pool) for fact in facts]
        return rows[: self.per_skill["dev"]], rows[self.per_skill["dev"] :]

    def pretrain(self, make_model: Callable[[Any, dict], Any], tokenizer: Any, texts: list[str]) -> tuple[Any, float]:
        """A base model, `make_model(tokenizer, p)` from the build's seed, pretrained on texts with
        the build's pretrain_steps, pretrain_lr and batch_size: (model, its final loss)."""
        import torch

        torch.manual_seed(self.seed)
        model = make_model(tokenizer, self.p)
        steps, lr, batch = self.p["pretrain_steps"], self.p["pretrain_lr"], self.p["batch_size"]
        loss = train_lm(model, tokenizer, [("", t) for t in texts], steps, lr, batch, random.Random(self.seed + 1))
        return model, loss


def check_known(key: str, chosen: list, known) -> None:
    """A list parameter's values (skills, sub-tasks): at least one, each known."""
    unknown = [value for value in chosen if value not in known]
    if unknown or not chosen:
        raise ValueError(f"{key}: {f'unknown {unknown}' if unknown else 'none given'}; choose from {', '.join(known)}")


def check_counts(p: dict, keys) -> None:
    """Sizes (n_test, ...): whole numbers above 0."""
    for key in keys:
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < 1:
            raise ValueError(f"{key} must be a whole number above 0, not {p[key]!r}")


def check_fact_params(params: dict, names: tuple, task: str, splits: tuple, sizes: tuple = ()) -> dict:
    """A fact-table builder's parameters (`tiny_params`): known skills, the model's and the
    builder's `sizes` whole numbers, and `n_<split>` (spread over the skills) giving each split
    at least 4 facts per skill, a question's choices."""
    p = tiny_params(params, names, task)
    skills = list(p["skills"])
    check_known("skills", skills, SKILLS)
    check_counts(p, [*BASE_MODEL_SIZES, *sizes, *(f"n_{split}" for split in splits)])
    if min(p[f"n_{split}"] // len(skills) for split in splits) < 4:
        raise ValueError(
            f"{' and '.join(f'n_{split}' for split in splits)} must give at least 4 items per skill "
            f"({len(skills)} skills)"
        )
    return p


@contextlib.contextmanager
def fact_build(out_dir: pathlib.Path, params: dict, names: tuple, task: str, splits: tuple) -> Iterator[FactBuild]:
    """The start every fact-table builder shares: its parameters (`check_fact_params`), its
    public/ and hidden/ folders, the facts each split asks per skill (`n_<split>` spread over
    the skills), and, under fixed conditions (`deterministic`) for the whole build, the seeded
    random stream and the fact tables."""
    p = check_fact_params(params, names, task, splits)
    skills = list(p["skills"])
    per_skill = {split: p[f"n_{split}"] // len(skills) for split in splits}
    seed = int(p["seed"])
    out_dir = pathlib.Path(out_dir)
    with deterministic(seed):
        rng = random.Random(seed)
        tables = make_fact_tables(rng, skills, sum(per_skill.values()))
        yield FactBuild(p, out_dir / "public", out_dir / "hidden", seed, rng, tables, per_skill)
