"""Starter kit: fine-tune an approved base model with LoRA on open instruction data,
then save the merged model (baseline of the "1 LLM + 1 GPU + 1 Day" challenge).

Usage:
    python finetune.py --base-model DIR --data FILE.jsonl --output submission \
        [--epochs 1] [--lora-r 8] [--lora-alpha 32] [--targets q_proj v_proj] [--lr 2e-4] \
        [--layout dolly|question] [--loss-on all|response]

DIR is a Hugging Face causal LM (at $MLRB_DATA/models/<org>__<name>); FILE holds rows in
Databricks-Dolly-15k's format: {"instruction", "context", "response", "category"}.

Baseline, after MLRB's: LoRA (r=8, alpha=32, dropout 0.1 on the attention's q/v
projections) for one epoch over the data, each row rendered as
"Instruction: ...\\n\\nContext: ...\\n\\nResponse: ...", loss on every token
(`--loss-on response`: on the response's tokens only).
The LoRA update is merged into the weights and the full model is saved (safetensors)
with the base's tokenizer and `provenance.json` naming the base model, which the
scorer checks against the approved base models.

`format_row` and the training settings are the parts meant to be improved.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer


def format_row(row: dict, layout: str = "dolly") -> str:
    """One training text. dolly: the baseline's Instruction/Context/Response layout;
    question: the "Question: ...\nAnswer: ..." layout that lm-eval's MMLU prompts use."""
    if layout == "question":
        context = f"{row['context']}\n" if row.get("context") else ""
        return f"Question: {context}{row['instruction']}\nAnswer: {row['response']}"
    text = f"Instruction: {row['instruction']}\n\n"
    if row.get("context"):
        text += f"Context: {row['context']}\n\n"
    return text + f"Response: {row['response']}"


def prompt_of(row: dict, layout: str) -> str:
    """The text before the response (format_row's text up to "Response:" or "Answer:")."""
    text = format_row(row, layout)
    return text[: len(text) - len(row["response"])].rstrip(" ")


def batches(
    tokenizer, texts: list[str], batch_size: int, max_length: int, rng: random.Random, prompts: list[str] | None = None
):
    """One epoch of right-padded batches in random order; labels on every real token, or, given
    each text's prompt, on the tokens after it only."""
    order = list(range(len(texts)))
    rng.shuffle(order)
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        chunk = [texts[i] + (tokenizer.eos_token or "") for i in chosen]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        if prompts is not None:
            for row, i in enumerate(chosen):
                labels[row, : len(tokenizer(prompts[i])["input_ids"])] = -100
        yield enc["input_ids"], enc["attention_mask"], labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-model", type=Path, required=True, help="folder of the approved base model")
    parser.add_argument("--base-model-name", help="its hub id (default: from the folder name, org__name)")
    parser.add_argument("--data", type=Path, required=True, help="instruction data (jsonl, Dolly format)")
    parser.add_argument("--output", type=Path, required=True, help="where to save the fine-tuned model")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--lora-dropout", type=float, default=0.1)
    parser.add_argument("--targets", nargs="+", default=["q_proj", "v_proj"], help="module names to adapt")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--layout", choices=["dolly", "question"], default="dolly", help="how rows become text")
    parser.add_argument(
        "--loss-on",
        choices=["all", "response"],
        default="all",
        help="train on every token, or on the response's tokens only",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--dtype", default="float32", help="training dtype (bfloat16 on a GPU)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.base_model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.base_model, dtype=getattr(torch, args.dtype)).to(device)
    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.targets,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)

    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    texts = [format_row(row, args.layout) for row in rows]
    prompts = [prompt_of(row, args.layout) for row in rows] if args.loss_on == "response" else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    rng = random.Random(args.seed)
    steps_per_epoch = math.ceil(len(texts) / args.batch_size)
    total_steps = max(1, round(args.epochs * steps_per_epoch))
    model.train()
    step = 0
    while step < total_steps:
        for input_ids, attention, labels in batches(tokenizer, texts, args.batch_size, args.max_length, rng, prompts):
            loss = model(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)
            ).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 20 == 0 or step == total_steps:
                print(f"step {step}/{total_steps} loss {loss.item():.4f}", flush=True)
            if step >= total_steps:
                break

    merged = model.merge_and_unload()
    merged.save_pretrained(args.output, safe_serialization=True)
    tokenizer.save_pretrained(args.output)
    name = args.base_model_name or args.base_model.name.replace("__", "/")
    (args.output / "provenance.json").write_text(json.dumps({"base_model": name}, indent=2) + "\n")
    print(f"fine-tuned {name} for {total_steps} steps -> {args.output}")


if __name__ == "__main__":
    main()
