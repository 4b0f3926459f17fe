"""Starter kit: autoformalization with a fine-tuned seq2seq model (baseline: BART).

Usage:
    python formalize.py --model DIR --data DIR --output submission.jsonl \
        [--steps 60] [--lr 1e-3] [--batch-size 16] [--max-new-tokens 160]

--data holds train.jsonl (name, informal_statement, informal_proof, formal_proof) and
test.jsonl (the same without formal_proof). The script fine-tunes --model (a Hugging
Face encoder-decoder, e.g. BART) to map "Informal Statement: ...\\nInformal Proof: ..."
to the Lean 3 formal statement and proof, then writes one line per test problem:

    {"name": "<the problem's name>", "formal_proof": "theorem <name> ... :=\\nbegin ... end"}

That file is the submission. It is scored against reference formalizations with BLEU
and ROUGE-L, and by how many compile (when a Lean 3 toolchain is available).

`render_input`, the training settings and the decoding are the parts meant to be improved.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer


def render_input(row: dict) -> str:
    return f"Informal Statement: {row['informal_statement']}\nInformal Proof: {row['informal_proof']}"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(model, tokenizer, rows, steps: int, lr: float, batch_size: int, max_length: int, device: str, seed: int):
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(1, steps + 1):
        batch = rng.sample(rows, min(batch_size, len(rows)))
        enc = tokenizer(
            [render_input(r) for r in batch], return_tensors="pt", padding=True, truncation=True, max_length=max_length
        )
        labels = tokenizer(
            [r["formal_proof"] for r in batch],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
        )["input_ids"]
        labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
        loss = model(
            input_ids=enc["input_ids"].to(device),
            attention_mask=enc["attention_mask"].to(device),
            labels=labels.to(device),
        ).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == steps:
            print(f"step {step}/{steps} loss {loss.item():.4f}", flush=True)
    model.eval()


@torch.no_grad()
def formalize(model, tokenizer, rows, batch_size: int, max_length: int, max_new_tokens: int, device: str):
    outputs = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        enc = tokenizer(
            [render_input(r) for r in batch], return_tensors="pt", padding=True, truncation=True, max_length=max_length
        ).to(device)
        generated = model.generate(**enc, max_new_tokens=max_new_tokens, num_beams=1, do_sample=False)
        outputs += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return [text.strip() for text in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="seq2seq model folder (e.g. BART)")
    parser.add_argument("--data", type=Path, required=True, help="folder with train.jsonl and test.jsonl")
    parser.add_argument("--output", type=Path, required=True, help="the submission file (jsonl)")
    parser.add_argument("--steps", type=int, default=60, help="training steps (batches)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).to(device)
    train_rows, test_rows = read_jsonl(args.data / "train.jsonl"), read_jsonl(args.data / "test.jsonl")
    train(model, tokenizer, train_rows, args.steps, args.lr, args.batch_size, args.max_length, device, args.seed)
    proofs = formalize(model, tokenizer, test_rows, args.batch_size, args.max_length, args.max_new_tokens, device)
    with open(args.output, "w") as f:
        for row, proof in zip(test_rows, proofs, strict=True):
            f.write(json.dumps({"name": row["name"], "formal_proof": proof}, ensure_ascii=False) + "\n")
    print(f"wrote {len(proofs)} formalizations to {args.output}")


if __name__ == "__main__":
    main()
