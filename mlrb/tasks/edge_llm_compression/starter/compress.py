"""Starter kit: compress a pretrained causal LM without training (baseline: magnitude
pruning + layer dropping), and save it in FP16 as a Hugging Face model.

Usage:
    python compress.py --model DIR --output submission [--prune 0.3] [--drop-layers 1 | --drop-indices 1 5]
                       [--share-embeddings] [--mlp-keep 0.75]

Baseline, after the MLRB baseline for this competition (L1 pruning, weight sharing, layer dropping):
  1. weight sharing (`--share-embeddings`): the output head reuses the input embedding's
     weights, as GPT-2 does (config.tie_word_embeddings), so one matrix is stored instead of two;
  2. magnitude (L1) pruning: in every linear layer (the output head included), the `--prune`
     share of weights with the smallest absolute value is set to zero;
  3. layer dropping: the last `--drop-layers` decoder layers are removed, or those at
     `--drop-indices` (config.num_hidden_layers is updated to match);
  4. MLP neuron pruning (`--mlp-keep`, off in the baseline): each layer keeps that share of its
     MLP's hidden neurons, those whose input and output weights have the largest norms, and
     the others are removed (config.intermediate_size is updated to match).
Pruned zeros are stored densely, so pruning alone does not save memory; sharing, dropping
layers and the FP16 dtype do. No training, distillation or quantization: the rules
forbid them (weights must stay FP16 or FP32).

`compress` below is the part meant to be improved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def prune_linear_layers(model, share: float) -> int:
    """Zero the `share` smallest-magnitude weights of each linear layer; returns how many."""
    zeroed = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            weight = module.weight
            k = int(share * weight.numel())
            if k == 0:
                continue
            threshold = weight.abs().float().flatten().kthvalue(k).values
            mask = weight.abs().float() <= threshold
            weight[mask] = 0
            zeroed += int(mask.sum())
    return zeroed


def drop_layers(model, indices: list[int]) -> None:
    """Remove the decoder layers at these (0-based) positions."""
    layers = model.model.layers
    if not indices:
        return
    if any(not 0 <= i < len(layers) for i in indices) or len(set(indices)) >= len(layers):
        raise ValueError(f"cannot drop layers {indices} of {len(layers)}")
    model.model.layers = torch.nn.ModuleList(layer for i, layer in enumerate(layers) if i not in set(indices))
    for i, layer in enumerate(model.model.layers):  # renumber: the attention cache is indexed by layer
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = i
    model.config.num_hidden_layers = len(model.model.layers)


def prune_mlp_neurons(model, keep: float) -> None:
    """Keep the `keep` share of each layer's MLP neurons (fc1 rows, fc2 columns) with the largest
    product of input and output weight norms; remove the rest."""
    if keep >= 1.0:
        return
    kept = max(1, round(keep * model.config.intermediate_size))
    with torch.no_grad():
        for layer in model.model.layers:
            fc1, fc2 = layer.mlp.fc1, layer.mlp.fc2
            importance = fc1.weight.float().norm(dim=1) * fc2.weight.float().norm(dim=0)
            index = importance.topk(kept).indices.sort().values
            new1 = torch.nn.Linear(fc1.in_features, kept, bias=fc1.bias is not None, dtype=fc1.weight.dtype)
            new2 = torch.nn.Linear(kept, fc2.out_features, bias=fc2.bias is not None, dtype=fc2.weight.dtype)
            new1.weight.copy_(fc1.weight[index])
            new2.weight.copy_(fc2.weight[:, index])
            if fc1.bias is not None:
                new1.bias.copy_(fc1.bias[index])
            if fc2.bias is not None:
                new2.bias.copy_(fc2.bias)
            layer.mlp.fc1, layer.mlp.fc2 = new1, new2
    model.config.intermediate_size = kept


def share_embeddings(model) -> None:
    """Make the output head use the input embedding's weights (stored once when saved)."""
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.get_input_embeddings().weight


def compress(model, prune: float, drop: list[int], share: bool = False, mlp_keep: float = 1.0):
    if share:
        share_embeddings(model)
    prune_linear_layers(model, prune)
    drop_layers(model, drop)
    prune_mlp_neurons(model, mlp_keep)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the pretrained model folder")
    parser.add_argument("--output", type=Path, required=True, help="where to save the compressed model")
    parser.add_argument("--prune", type=float, default=0.3, help="share of each linear layer's weights to zero")
    parser.add_argument("--drop-layers", type=int, default=1, help="how many of the last decoder layers to remove")
    parser.add_argument("--drop-indices", type=int, nargs="+", help="which decoder layers (0-based) to remove instead")
    parser.add_argument("--share-embeddings", action="store_true", help="the output head reuses the input embedding")
    parser.add_argument("--mlp-keep", type=float, default=1.0, help="share of each layer's MLP neurons to keep")
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float16)
    n_layers = len(model.model.layers)
    drop = args.drop_indices or list(range(n_layers - args.drop_layers, n_layers))
    before = sum(p.numel() for p in model.parameters())
    compress(model, args.prune, drop, args.share_embeddings, args.mlp_keep)
    after = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.output, safe_serialization=True)
    AutoTokenizer.from_pretrained(args.model).save_pretrained(args.output)
    shared = ", output head shares the input embedding" if args.share_embeddings else ""
    neurons = f", kept {args.mlp_keep:.0%} of MLP neurons" if args.mlp_keep < 1 else ""
    print(
        f"compressed {before:,} -> {after:,} parameters (pruned {args.prune:.0%}, dropped layers {drop}{shared}{neurons})"
    )


if __name__ == "__main__":
    main()
