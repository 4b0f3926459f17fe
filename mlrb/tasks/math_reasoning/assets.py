"""Assets for the autoformalization task (ICML 2024 AI4Math, track 1-1).

Rows have the real dataset's fields: {name, informal_statement, informal_proof,
formal_proof}, the formal proof in Lean 3 (mathlib) style. `write_splits` turns rows
into the task's files at both scales:

    public/train.jsonl   rows with all four fields, to train on
    public/test.jsonl    held-out problems: name, informal_statement, informal_proof
    hidden/test.jsonl    the same problems with their reference formal_proof

At tiny scale `synthetic_splits` generates linear-arithmetic problems from a small
grammar (grammar.json): one to three hypotheses and a goal, with their numbers, variable
names and wording drawn. The held-out problems have shapes (which hypotheses, in which
order, and which goal) that no training problem has, so they are formalized by putting
learned parts together, not by copying a same-worded training proof; and
`build_tiny_model` makes a tiny BART (BartForConditionalGeneration, like the
published baseline's BART-base) with a byte-level BPE tokenizer trained on the
training text. The tiny BART is randomly initialised: there is no pretraining corpus
at this scale, so the tiny baseline trains it from scratch.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib
import random

from mlrb.task_kit.tiny_models import check_counts, deterministic, read_jsonl, tiny_params, write_jsonl

# The builder's parameters; their values are in this folder's task.yaml (scales.tiny.assets).
PARAMS = ("seed", "n_rows", "n_test", "vocab_size", "d_model", "layers", "heads", "ffn_dim")

_VARIABLES = ["x", "y", "z", "a", "b", "n", "m", "t", "k", "r"]
MAX_HYPOTHESES = 3
_SUBSCRIPTS = "".join(chr(ord("₀") + i) for i in range(MAX_HYPOTHESES))  # h₀, h₁... in the Lean statement
TWO_VARIABLE_KINDS = frozenset({"sum", "difference"})  # hypotheses that bring in a second variable
TEST_SHAPE_SHARE = 0.25  # of the problem shapes, held out: no training problem has one


@functools.cache
def grammar() -> dict:
    """The problems' phrases, informal and Lean (grammar.json): hypotheses, goals and the
    sentences that join them. Their numbers are drawn by `_hypothesis` and `_goal`."""
    return json.loads((pathlib.Path(__file__).parent / "grammar.json").read_text(encoding="utf-8"))


def _pins(hypotheses: tuple[str, ...]) -> bool:
    """Whether the hypotheses fix the value of the problem's variable."""
    return bool({"shifted", "scaled"} & set(hypotheses)) or TWO_VARIABLE_KINDS <= set(hypotheses)


def shapes() -> list[tuple[tuple[str, ...], str]]:
    """Every problem shape: 1 to MAX_HYPOTHESES different hypotheses in order, and a goal they
    prove (a value or its double needs the variable fixed; a bound, that or a lower bound)."""
    words = grammar()
    found = []
    for count in range(1, MAX_HYPOTHESES + 1):
        for hypotheses in itertools.permutations(words["hypotheses"], count):
            for goal in words["goals"]:
                if _pins(hypotheses) or (goal == "bound" and "above" in hypotheses):
                    found.append((hypotheses, goal))
    return found


def _hypothesis(kind: str, rng: random.Random, u: int, w: int) -> dict:
    """The numbers of one hypothesis, true of the variables' values u and w."""
    if kind == "shifted":
        a = rng.randint(2, 60)
        return {"a": a, "b": u + a}
    if kind == "scaled":
        k = rng.randint(2, 12)
        return {"k": k, "m": k * u}
    if kind == "above":
        return {"low": u - rng.randint(1, 15)}
    if kind == "below":
        return {"high": u + rng.randint(1, 15)}
    return {"s": u + w} if kind == "sum" else {"d": u - w}


def _goal(kind: str, rng: random.Random, u: int, pinned: bool, low: int | None) -> dict:
    """The goal's numbers: what the hypotheses prove."""
    if kind == "value":
        return {"value": u}
    if kind == "double":
        return {"twice": 2 * u}
    c = rng.randint(1, 40)
    return {"c": c, "bound": u + c - rng.randint(1, 10) if pinned or low is None else low + c}


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def problem(shape: tuple[tuple[str, ...], str], rng: random.Random, name: str) -> dict:
    """One problem of SHAPE in the real dataset's format, its variables, numbers and wording drawn."""
    words = grammar()
    hypotheses, goal = shape
    u, w = rng.sample(_VARIABLES, 2)
    u_value, w_value = rng.randint(1, 30), rng.randint(1, 30)
    two = bool(TWO_VARIABLE_KINDS & set(hypotheses))
    drawn = [(words["hypotheses"][k], {"u": u, "w": w, **_hypothesis(k, rng, u_value, w_value)}) for k in hypotheses]
    low = next((values["low"] for _, values in drawn if "low" in values), None)
    goal_values = {"u": u, **_goal(goal, rng, u_value, _pins(hypotheses), low)}
    informal = _listed([f"${phrase['informal'].format(**values)}$" for phrase, values in drawn])
    goal_informal = f"${words['goals'][goal]['informal'].format(**goal_values)}$"
    names = f"${u}$ and ${w}$" if two else f"${u}$"
    statement = rng.choice(words["statements"]["two" if two else "one"]).format(
        vars=names, hypotheses=informal, show=rng.choice(words["show"]), goal=goal_informal
    )
    proof = rng.choice(words["proofs"])
    formal = words["theorem"].format(
        name=name,
        binders=f"({u} {w} : ℝ)" if two else f"({u} : ℝ)",
        hypotheses=" ".join(
            f"(h{_SUBSCRIPTS[i]} : {phrase['formal'].format(**values)})" for i, (phrase, values) in enumerate(drawn)
        ),
        goal=words["goals"][goal]["formal"].format(**goal_values),
    )
    return {"name": name, "informal_statement": statement, "informal_proof": proof, "formal_proof": formal}


def synthetic_splits(n: int, n_test: int, seed: int) -> tuple[list[dict], list[dict]]:
    """n distinct problems, named like miniF2F's (synth_algebra_<i>), split into training and
    held-out rows whose shapes differ: a held-out problem combines hypotheses and a goal that
    no training problem combines, so copying a training proof with its numbers swapped does not
    formalize it; a model must put together the parts it learned."""
    rng = random.Random(seed)
    every = shapes()
    rng.shuffle(every)
    held_out_shapes = every[: round(len(every) * TEST_SHAPE_SHARE)]
    training_shapes = every[len(held_out_shapes) :]
    held_out = [True] * n_test + [False] * (n - n_test)
    rng.shuffle(held_out)
    train: list[dict] = []
    test: list[dict] = []
    seen = set()
    for i, is_test in enumerate(held_out):
        while True:
            row = problem(rng.choice(held_out_shapes if is_test else training_shapes), rng, f"synth_algebra_{i}")
            if row["informal_statement"] not in seen:
                break
        seen.add(row["informal_statement"])
        (test if is_test else train).append(row)
    return train, test


def write_rows(train: list[dict], test: list[dict], out_dir: pathlib.Path) -> dict:
    """The task's files: training rows whole, held-out inputs public, their references hidden."""
    write_jsonl(out_dir / "public" / "train.jsonl", train)
    write_jsonl(out_dir / "public" / "test.jsonl", [{k: r[k] for k in r if k != "formal_proof"} for r in test])
    write_jsonl(out_dir / "hidden" / "test.jsonl", test)
    return {
        "train": {"path": "public/train.jsonl", "n": len(train)},
        "test": {"inputs": "public/test.jsonl", "references": "hidden/test.jsonl", "n": len(test)},
    }


def write_splits(rows: list[dict], n_test: int, seed: int, out_dir: pathlib.Path) -> dict:
    """Full scale: hold out n_test of the competition's rows (seeded shuffle)."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return write_rows(rows[n_test:], rows[:n_test], out_dir)


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
    trainer = trainers.BpeTrainer(
        vocab_size=p["vocab_size"],
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=512,
    )
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=p["d_model"],
        encoder_layers=p["layers"],
        decoder_layers=p["layers"],
        encoder_attention_heads=p["heads"],
        decoder_attention_heads=p["heads"],
        encoder_ffn_dim=p["ffn_dim"],
        decoder_ffn_dim=p["ffn_dim"],
        max_position_embeddings=512,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    torch.manual_seed(p["seed"])
    model = BartForConditionalGeneration(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "path": "public/base_model",
        "params": sum(t.numel() for t in model.parameters()),
        "vocab_size": len(tokenizer),
        "pretrained": False,
    }


def check_params(params: dict) -> dict:
    p = tiny_params(params, PARAMS, "math_reasoning")
    check_counts(p, ["n_rows", "n_test", "vocab_size", "d_model", "layers", "heads", "ffn_dim"])
    return p


def build_tiny_assets(out_dir: pathlib.Path, params: dict) -> dict:
    p = check_params(params)
    out_dir = pathlib.Path(out_dir)
    splits = write_rows(*synthetic_splits(p["n_rows"], p["n_test"], p["seed"]), out_dir)
    # The tokenizer sees only training text: held-out references stay unseen.
    train = read_jsonl(out_dir / "public" / "train.jsonl")
    texts = [r[k] for r in train for k in ("informal_statement", "informal_proof", "formal_proof")]
    with deterministic(int(p["seed"])):
        model = build_tiny_model(texts, p, out_dir / "public" / "base_model")
    return {"params": p, "base_model": model, **splits}
