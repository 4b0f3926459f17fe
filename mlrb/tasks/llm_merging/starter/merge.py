"""Starter kit: merge LoRA adapters into one standalone model (baseline: parameter averaging).

Usage:
    python merge.py --data DIR --output submission [--weights 0.5 0.5]

DIR must contain `base_model/` (a Hugging Face causal LM + tokenizer) and
`adapters/<name>/` (peft LoRA adapters trained from that base). The merged model is
saved to --output as a full Hugging Face model (safetensors) plus the base tokenizer;
that directory is your submission and is scored as-is.

Baseline, as in the NeurIPS 2024 LLM Merging competition: average the adapters'
weight updates,

    W_merged = W_base + sum_i w_i * delta_i,   w_i = 1/n by default,
    delta_i  = B_i @ A_i * scaling_i            (the full LoRA update of adapter i)

Note: peft's `add_weighted_adapter(combination_type="linear")` is NOT this average
(it mixes the A and B factors separately), so the update is computed explicitly here.

`merge` below is the part meant to be improved; `lora_deltas` just reads the adapters.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def lora_deltas(adapter_dir: Path) -> dict[str, torch.Tensor]:
    """Full weight update of every LoRA-adapted layer, keyed by the base parameter name,
    e.g. 'model.layers.0.self_attn.q_proj.weight' -> B @ A * scaling."""
    # An adapter is the files peft wrote; reading them needs no peft (seconds to import).
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = adapter_dir / "adapter_model.safetensors"
    if weights.exists():
        state = load_file(weights)
    else:  # an adapter saved in PyTorch's format (older peft)
        state = torch.load(adapter_dir / "adapter_model.bin", map_location="cpu", weights_only=True)
    deltas = {}
    for key, lora_a in state.items():
        if ".lora_A." not in key:
            continue
        lora_b = state[key.replace(".lora_A.", ".lora_B.")]
        rank = lora_a.shape[0]
        # peft's scaling: alpha / r, or alpha / sqrt(r) with rank-stabilised LoRA.
        scaling = config["lora_alpha"] / (rank**0.5 if config.get("use_rslora") else rank)
        # 'base_model.model.<module>.lora_A.weight' -> '<module>.weight'
        module = key.split(".lora_A.")[0].removeprefix("base_model.model.")
        deltas[module + ".weight"] = (lora_b.float() @ lora_a.float()) * scaling
    return deltas


def merge(base_model, adapters: dict[str, dict[str, torch.Tensor]], weights: list[float]):
    """Add the weighted sum of the adapters' deltas to the base model in place.

    base_model: a transformers model; adapters: {name: lora_deltas(...)};
    weights: one float per adapter, in the same order as `adapters`.
    """
    params = dict(base_model.named_parameters())
    with torch.no_grad():
        for deltas, w in zip(adapters.values(), weights, strict=True):
            for param_name, delta in deltas.items():
                target = params[param_name]
                target += (w * delta).to(target.dtype)
    return base_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="dir with base_model/ and adapters/")
    parser.add_argument("--output", type=Path, required=True, help="where to save the merged model")
    parser.add_argument("--weights", type=float, nargs="*", help="one per adapter (sorted by name); default 1/n")
    args = parser.parse_args()

    adapter_dirs = sorted(d for d in (args.data / "adapters").iterdir() if d.is_dir())
    weights = args.weights or [1.0 / len(adapter_dirs)] * len(adapter_dirs)
    if len(weights) != len(adapter_dirs):
        parser.error(f"{len(adapter_dirs)} adapters but {len(weights)} weights")

    base = AutoModelForCausalLM.from_pretrained(args.data / "base_model", dtype=torch.float32)
    adapters = {d.name: lora_deltas(d) for d in adapter_dirs}
    merged = merge(base, adapters, weights)

    merged.save_pretrained(args.output, safe_serialization=True)
    AutoTokenizer.from_pretrained(args.data / "base_model").save_pretrained(args.output)
    print("merged", {d.name: w for d, w in zip(adapter_dirs, weights, strict=True)}, "->", args.output)


if __name__ == "__main__":
    main()
