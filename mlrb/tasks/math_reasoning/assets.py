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

import pathlib
import random

from mlrb.tasks.tiny_models import deterministic, read_jsonl, tiny_params, write_jsonl

# The builder's parameters; their values are in mlrb/conf/task/math_reasoning.yaml (scales.tiny.assets).
PARAMS = ("seed", "n_rows", "n_test", "vocab_size", "d_model", "layers", "heads", "ffn_dim")

_VARIABLES = ["x", "y", "z", "a", "b", "n", "m", "t", "k", "r"]
_PROOF_END = ":=\nbegin\n  {tactic},\nend"


def _linear(rng, v, n):
    a, c = rng.randint(2, 60), rng.randint(2, 60)
    b = a + c
    return (
        f"Solve for ${v}$: ${v} + {a} = {b}$. Show that ${v} = {c}$.",
        f"Subtracting {a} from both sides gives ${v} = {b} - {a} = {c}$.",
        f"theorem {n} ({v} : ℝ) (h₀ : {v} + {a} = {b}) : {v} = {c} " + _PROOF_END.format(tactic="linarith"),
    )


def _scaled(rng, v, n):
    k, c = rng.randint(2, 12), rng.randint(2, 30)
    return (
        f"If ${k} {v} = {k * c}$, show that ${v} = {c}$.",
        f"Dividing both sides by {k} gives ${v} = {c}$.",
        f"theorem {n} ({v} : ℝ) (h₀ : {k} * {v} = {k * c}) : {v} = {c} " + _PROOF_END.format(tactic="linarith"),
    )


def _product(rng, v, n):
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    return (
        f"Compute ${a} \\times {b}$. Show that it equals ${a * b}$.",
        f"Multiplying, ${a} \\times {b} = {a * b}$.",
        f"theorem {n} : ({a} : ℕ) * {b} = {a * b} " + _PROOF_END.format(tactic="norm_num"),
    )


def _remainder(rng, v, n):
    b, q = rng.randint(3, 12), rng.randint(2, 30)
    r = rng.randint(0, b - 1)
    a = b * q + r
    return (
        f"What is the remainder when ${a}$ is divided by ${b}$? Show that it is ${r}$.",
        f"Since ${a} = {b} \\cdot {q} + {r}$, the remainder is ${r}$.",
        f"theorem {n} : {a} % {b} = {r} " + _PROOF_END.format(tactic="norm_num"),
    )


def _sum(rng, v, n):
    a, b, c = (rng.randint(-30, 60) for _ in range(3))
    return (
        f"What is the sum of ${a}$, ${b}$ and ${c}$? Show that it is ${a + b + c}$.",
        f"Adding, ${a} + {b} + {c} = {a + b + c}$.",
        f"theorem {n} : ({a} : ℤ) + {b} + {c} = {a + b + c} " + _PROOF_END.format(tactic="norm_num"),
    )


def _commute(rng, v, n):
    a = rng.randint(1, 50)
    return (
        f"Show that for every natural number ${v}$, ${v} + {a} = {a} + {v}$.",
        "Addition of natural numbers is commutative.",
        f"theorem {n} ({v} : ℕ) : {v} + {a} = {a} + {v} " + _PROOF_END.format(tactic="rw add_comm"),
    )


def _square(rng, v, n):
    p, q = rng.sample(_VARIABLES, 2)
    return (
        f"Show that for all real numbers ${p}$ and ${q}$, $({p} + {q})^2 = {p}^2 + 2 {p} {q} + {q}^2$.",
        "Expand the square and collect terms.",
        f"theorem {n} ({p} {q} : ℝ) : ({p} + {q})^2 = {p}^2 + 2 * {p} * {q} + {q}^2 "
        + _PROOF_END.format(tactic="ring"),
    )


def _inequality(rng, v, n):
    a, b = rng.randint(1, 40), rng.randint(1, 40)
    return (
        f"Let ${v}$ be a real number with ${v} > {a}$. Show that ${v} + {b} > {a + b}$.",
        f"Adding {b} to both sides of ${v} > {a}$ gives ${v} + {b} > {a + b}$.",
        f"theorem {n} ({v} : ℝ) (h₀ : {a} < {v}) : {a + b} < {v} + {b} " + _PROOF_END.format(tactic="linarith"),
    )


def _divides(rng, v, n):
    a, k = rng.randint(2, 15), rng.randint(2, 15)
    return (
        f"Show that ${a}$ divides ${a * k}$.",
        f"We have ${a * k} = {a} \\cdot {k}$.",
        f"theorem {n} : ({a} : ℕ) ∣ {a * k} " + _PROOF_END.format(tactic="norm_num"),
    )


def _system(rng, v, n):
    w = rng.choice([u for u in _VARIABLES if u != v])
    x, y = rng.randint(1, 30), rng.randint(1, 30)
    return (
        f"If ${v} + {w} = {x + y}$ and ${v} - {w} = {x - y}$, show that ${v} = {x}$.",
        f"Adding the two equations gives $2 {v} = {2 * x}$, so ${v} = {x}$.",
        f"theorem {n} ({v} {w} : ℝ) (h₀ : {v} + {w} = {x + y}) (h₁ : {v} - {w} = {x - y}) : {v} = {x} "
        + _PROOF_END.format(tactic="linarith"),
    )


# (area of the problem name, generator)
TEMPLATES = [
    ("algebra", _linear), ("algebra", _scaled), ("algebra", _sum), ("algebra", _square),
    ("algebra", _inequality), ("algebra", _system), ("numbertheory", _product),
    ("numbertheory", _remainder), ("numbertheory", _commute), ("numbertheory", _divides),
]  # fmt: skip


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """n distinct problems in the real dataset's format, named like miniF2F's (synth_<area>_<i>)."""
    rng = random.Random(seed)
    rows: list[dict] = []
    seen = set()
    while len(rows) < n:
        area, make = rng.choice(TEMPLATES)
        name = f"synth_{area}_{len(rows)}"
        statement, proof, formal = make(rng, rng.choice(_VARIABLES), name)
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


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    p = tiny_params(params, PARAMS, "math_reasoning")
    out_dir = pathlib.Path(out_dir)
    rows = synthetic_rows(p["n_rows"], p["seed"])
    splits = write_splits(rows, p["n_test"], p["seed"], out_dir)
    # The tokenizer sees only training text: held-out references stay unseen.
    train = read_jsonl(out_dir / "public" / "train.jsonl")
    texts = [r[k] for r in train for k in ("informal_statement", "informal_proof", "formal_proof")]
    with deterministic(int(p["seed"])):
        model = build_tiny_model(texts, p, out_dir / "public" / "base_model")
    return {"params": p, "base_model": model, **splits}
