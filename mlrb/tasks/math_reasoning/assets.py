"""Assets for the autoformalization task (ICML 2024 AI4Math, track 1-1).

Rows have the real dataset's fields: {name, informal_statement, informal_proof,
formal_proof}, the formal proof in Lean 3 (mathlib) style. `write_splits` turns rows
into the task's files at both scales:

    public/train.jsonl   rows with all four fields, to train on
    public/test.jsonl    held-out problems: name, informal_statement, informal_proof
    hidden/test.jsonl    the same problems with their reference formal_proof

At tiny scale `synthetic_rows` generates the rows from templates of simple algebra
and number-theory problems (numbers, variable names and wording vary), and
`build_tiny_model` makes a tiny BART (BartForConditionalGeneration, like the
published baseline's BART-base) with a byte-level BPE tokenizer trained on the
training text. The tiny BART is randomly initialised: there is no pretraining corpus
at this scale, so the tiny baseline trains it from scratch.
"""

from __future__ import annotations

import json
import pathlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from mlrb.tasks.tiny_models import check_counts, deterministic, read_jsonl, tiny_params, write_jsonl

# The builder's parameters; their values are in mlrb/conf/task/math_reasoning.yaml (scales.tiny.assets).
PARAMS = ("seed", "n_rows", "n_test", "vocab_size", "d_model", "layers", "heads", "ffn_dim")

_VARIABLES = ["x", "y", "z", "a", "b", "n", "m", "t", "k", "r"]
_PROOF_END = ":=\nbegin\n  {tactic},\nend"


@dataclass(frozen=True)
class Template:
    """A family of problems: its numbers and names drawn by `draw(rng, v)` (v: the problem's
    variable), then written into its statement, informal proof and Lean theorem."""

    area: str  # in the problem's name, as miniF2F's names have it
    draw: Callable[[random.Random, str], dict]
    statement: str
    proof: str
    theorem: str  # {n}: the problem's name
    tactic: str

    def make(self, rng: random.Random, v: str, n: str) -> tuple[str, str, str]:
        values = {"v": v, "n": n, **self.draw(rng, v)}
        formal = self.theorem.format(**values) + " " + _PROOF_END.format(tactic=self.tactic)
        return self.statement.format(**values), self.proof.format(**values), formal


def _linear(rng, v):
    a, c = rng.randint(2, 60), rng.randint(2, 60)
    return {"a": a, "b": a + c, "c": c}


def _scaled(rng, v):
    k, c = rng.randint(2, 12), rng.randint(2, 30)
    return {"k": k, "c": c, "kc": k * c}


def _product(rng, v):
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    return {"a": a, "b": b, "ab": a * b}


def _remainder(rng, v):
    b, q = rng.randint(3, 12), rng.randint(2, 30)
    r = rng.randint(0, b - 1)
    return {"a": b * q + r, "b": b, "q": q, "r": r}


def _sum(rng, v):
    a, b, c = (rng.randint(-30, 60) for _ in range(3))
    return {"a": a, "b": b, "c": c, "s": a + b + c}


def _commute(rng, v):
    return {"a": rng.randint(1, 50)}


def _square(rng, v):
    p, q = rng.sample(_VARIABLES, 2)
    return {"p": p, "q": q}


def _inequality(rng, v):
    a, b = rng.randint(1, 40), rng.randint(1, 40)
    return {"a": a, "b": b, "ab": a + b}


def _divides(rng, v):
    a, k = rng.randint(2, 15), rng.randint(2, 15)
    return {"a": a, "ak": a * k, "k": k}


def _system(rng, v):
    w = rng.choice([u for u in _VARIABLES if u != v])
    x, y = rng.randint(1, 30), rng.randint(1, 30)
    return {"w": w, "x": x, "sum": x + y, "diff": x - y, "twice": 2 * x}


# Each family's numbers and names, by the family's name in templates.json.
DRAWS = {"linear": _linear, "scaled": _scaled, "sum": _sum, "square": _square, "inequality": _inequality,
         "system": _system, "product": _product, "remainder": _remainder, "commute": _commute, "divides": _divides}  # fmt: skip


def templates() -> list[Template]:
    """The problem families, in templates.json's order (the builder draws one by position):
    their texts are data, with {n} the problem's name, {v} its variable and the draw's values."""
    texts = json.loads((pathlib.Path(__file__).parent / "templates.json").read_text(encoding="utf-8"))
    return [Template(draw=DRAWS[name], **family) for name, family in texts.items()]


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """n distinct problems in the real dataset's format, named like miniF2F's (synth_<area>_<i>)."""
    rng = random.Random(seed)
    families = templates()
    rows: list[dict] = []
    seen = set()
    while len(rows) < n:
        template = rng.choice(families)
        name = f"synth_{template.area}_{len(rows)}"
        statement, proof, formal = template.make(rng, rng.choice(_VARIABLES), name)
        if statement in seen:
            continue
        seen.add(statement)
        rows.append({"name": name, "informal_statement": statement, "informal_proof": proof, "formal_proof": formal})
    return rows


def write_splits(rows: list[dict], n_test: int, seed: int, out_dir: pathlib.Path) -> dict:
    """Hold out n_test rows (seeded shuffle): inputs public, references hidden."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    test, train = rows[:n_test], rows[n_test:]
    write_jsonl(out_dir / "public" / "train.jsonl", train)
    write_jsonl(out_dir / "public" / "test.jsonl", [{k: r[k] for k in r if k != "formal_proof"} for r in test])
    write_jsonl(out_dir / "hidden" / "test.jsonl", test)
    return {"train": {"path": "public/train.jsonl", "n": len(train)},
            "test": {"inputs": "public/test.jsonl", "references": "hidden/test.jsonl", "n": len(test)}}  # fmt: skip


def build_tiny_model(texts: list[str], p: dict, out: pathlib.Path) -> dict:
    """A randomly initialised tiny BART and a byte-level BPE tokenizer (digits split, so
    numbers can be copied digit by digit), saved in Hugging Face format."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # BART's ids 0-4
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=p["vocab_size"], special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        mask_token="<mask>", model_max_length=512,
    )  # fmt: skip
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=p["d_model"], encoder_layers=p["layers"], decoder_layers=p["layers"],
        encoder_attention_heads=p["heads"], decoder_attention_heads=p["heads"], encoder_ffn_dim=p["ffn_dim"],
        decoder_ffn_dim=p["ffn_dim"], max_position_embeddings=512, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        forced_eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(p["seed"])
    model = BartForConditionalGeneration(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {"path": "public/base_model", "params": sum(t.numel() for t in model.parameters()),
            "vocab_size": len(tokenizer), "pretrained": False}  # fmt: skip


def check_params(params: dict) -> dict:
    p = tiny_params(params, PARAMS, "math_reasoning")
    check_counts(p, ["n_rows", "n_test", "vocab_size", "d_model", "layers", "heads", "ffn_dim"])
    return p


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    p = check_params(params)
    out_dir = pathlib.Path(out_dir)
    rows = synthetic_rows(p["n_rows"], p["seed"])
    splits = write_splits(rows, p["n_test"], p["seed"], out_dir)
    # The tokenizer sees only training text: held-out references stay unseen.
    train = read_jsonl(out_dir / "public" / "train.jsonl")
    texts = [r[k] for r in train for k in ("informal_statement", "informal_proof", "formal_proof")]
    with deterministic(int(p["seed"])):
        model = build_tiny_model(texts, p, out_dir / "public" / "base_model")
    return {"params": p, "base_model": model, **splits}
