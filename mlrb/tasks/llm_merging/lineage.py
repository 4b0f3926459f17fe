"""Is a submission a merge of the given models? The competition's rule: merge only the
given base model and experts (LoRA adapters, or full fine-tuned models), no training.

A merge changes the base only where some expert changed it, and by a combination of the
experts' updates, tensor by tensor: averaging, task arithmetic and layer-wise weights lie
in the span of the experts' updates; TIES trims each update to its largest entries, elects
a sign and averages what agrees, and DARE drops a share p of each update's entries at
random and rescales the rest by 1/(1-p). Both leave the entries they drop exactly at the
base's value, so the check looks, per tensor, only at the entries the submission changed
beyond rounding (its support S), and asks how much of that change lies in the span of
the experts' updates restricted to S: |cosine| between the change on S and its projection.

Figures at tiny scale (3 LoRA experts on the MLPs; the worst of the 6 tensors): averaging,
task arithmetic and the calibration's one-hot merges 1.000 (also re-saved in FP16), TIES
(top 20% or 50%, elected sign, disjoint mean) 0.83-0.85, DARE p=0.5 0.76, p=0.9 0.60-0.61,
p=0.99 0.55; the averaging merge plus Gaussian noise 1.5x its change in each tensor 0.54,
3x 0.31 (noise lies outside the span: 1/sqrt(1 + 3^2)); training the MLPs on the dev set
0.14. Hence a
merge needs at least `min_cosine` (0.5) in EVERY touched tensor: the old rule, one cosine
pooled over all tensors at 0.25, accepted the noisy merge (0.317), and noise or training
confined to a few tensors would hide in the pool.

Every tensor no expert updates must be the base's up to rounding, entry by entry
(`rules.rounding_tolerance`: half an ulp of the coarser stored dtype, so an FP16 re-save
passes and a 1e-3 relative nudge does not). The base unchanged is a merge with all
weights 0 (and scores as doing nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlrb.tasks.model_checks import rounding_tolerance, weight_stats


def _reader(model_dir: Path) -> dict[str, tuple[Path, list[int], str]]:
    """{tensor name: (file, shape, stored dtype)}, from the headers."""
    return {t.name: (model_dir / t.file, t.shape, t.dtype) for t in weight_stats(model_dir).tensors}


def _load(path: Path, name: str):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name).double()


def expert_updates(expert_dir: Path, base: dict[str, tuple[Path, list[int], str]]) -> dict[str, Callable]:
    """{base tensor name: function returning the expert's update of it}, computed on demand:
    B @ A * scaling for a peft LoRA adapter, W_expert - W_base for a full model."""
    config_file = expert_dir / "adapter_config.json"
    if not config_file.exists():  # a full fine-tuned model of the base's architecture
        theirs = _reader(expert_dir)
        return {
            name: (lambda name=name: _load(*theirs[name][:1], name) - _load(base[name][0], name))
            for name in base
            if name in theirs and theirs[name][1] == base[name][1]
        }
    config = json.loads(config_file.read_text())
    state: dict[str, Any] = {}
    for path in sorted(expert_dir.glob("*.safetensors")):
        for t in weight_stats(expert_dir).tensors:
            if t.file == path.name:
                state[t.name] = _load(path, t.name)
    updates = {}
    for key, lora_a in state.items():
        if ".lora_A." not in key:
            continue
        lora_b = state[key.replace(".lora_A.", ".lora_B.")]
        rank = lora_a.shape[0]
        scaling = config["lora_alpha"] / (rank**0.5 if config.get("use_rslora") else rank)
        name = key.split(".lora_A.")[0].removeprefix("base_model.model.") + ".weight"
        updates[name] = lambda a=lora_a, b=lora_b, s=scaling: (b @ a) * s
    return updates


def check_is_merge(submission: Path, public: Path, min_cosine: float = 0.5) -> tuple[str, dict]:
    """(problem or "", facts): is the submission the base model plus a combination of the
    experts' updates, in every tensor (see the module's docstring)?"""
    import torch

    base_dir = public / "base_model"
    base, ours = _reader(base_dir), _reader(submission)
    if {k: v[1] for k, v in base.items()} != {k: v[1] for k, v in ours.items()}:
        extra, missing = sorted(set(ours) - set(base)), sorted(set(base) - set(ours))
        example = (extra or missing or [next(k for k in base if base[k][1] != ours[k][1])])[0]
        return (
            f"not a merge of the given models: its tensors differ from the base model's (e.g. {example}); "
            "a merge keeps the base's architecture"
        ), {}
    experts = sorted(d for d in (public / "adapters").iterdir() if d.is_dir())
    updates = [expert_updates(d, base) for d in experts]
    cosines: dict[str, float] = {}  # per touched tensor the submission changed
    untouched_changed: dict[str, tuple] = {}  # name: (entries changed beyond rounding, entries, dtypes)
    for name, (path, _, dtype) in sorted(base.items()):
        reference = _load(path, name)
        change = _load(ours[name][0], name) - reference
        # Entries changed beyond what storing the base in either dtype can do.
        beyond = change.abs() > rounding_tolerance(reference, dtype, ours[name][2])
        theirs = [u[name]() for u in updates if name in u]
        if not theirs:
            if bool(beyond.any()):
                untouched_changed[name] = (int(beyond.sum()), beyond.numel(), dtype, ours[name][2])
            continue
        if not bool(beyond.any()):
            continue  # left at the base: a weight of 0
        flat = change[beyond]
        span = torch.stack([u.to(change.dtype)[beyond] for u in theirs])  # experts x entries of S
        gram, dots = span @ span.T, span @ flat
        explained_sq = float(dots @ (torch.linalg.pinv(gram) @ dots))  # squared norm of the projection
        cosines[name] = min(1.0, max(0.0, explained_sq) / float(flat @ flat)) ** 0.5
    failing = sorted(name for name, cosine in cosines.items() if cosine < min_cosine)
    worst = min(cosines, key=lambda name: cosines[name]) if cosines else None
    facts = {
        "experts": [d.name for d in experts],
        "cosines_with_experts_updates": {name: round(cosine, 4) for name, cosine in cosines.items()},
        "worst_tensor": worst,
        "worst_cosine": cosines[worst] if worst else None,
        "tensors_below_min_cosine": len(failing),
        "untouched_tensors_changed": len(untouched_changed),
    }
    if untouched_changed:
        name = max(untouched_changed, key=lambda n: untouched_changed[n][0])
        changed, entries, theirs, mine = untouched_changed[name]
        return (
            f"not a merge of the given models: {len(untouched_changed)} tensors that no expert updates were "
            f"changed (e.g. {name}: {changed:,} of {entries:,} entries differ from the base's by more than "
            f"{theirs if theirs == mine else theirs + '/' + mine} rounding can)"
        ), facts
    if worst is not None and failing:
        return (
            f"not a merge of the given models: in {len(failing)} of {len(cosines)} tensors the weight change "
            f"is not a combination of the experts' updates (worst {worst}: |cosine| {cosines[worst]:.3f} with "
            f"their span on the entries it changes; a merge gives at least {min_cosine:g} in each)"
        ), facts
    return "", facts
