"""Is a submission a merge of the given models? The competition's rule: merge only the
given base model and experts (LoRA adapters, or full fine-tuned models), no training.

A merge changes the base only where some expert changed it, and by a combination of the
experts' updates: averaging, task arithmetic and layer-wise weights lie in the span of
the experts' updates (per tensor); TIES trims and elects signs entry by entry, and DARE
drops entries at random and rescales, which leaves the change correlated with that span
(DARE dropping 90% keeps |cosine| about sqrt(0.1) = 0.32). Training moves the weights in
a direction of its own, much less correlated with the experts' updates (at tiny scale,
training the MLPs on the dev set's questions, which are about the experts' own skills,
gives 0.16), and usually changes tensors no expert touched. So the check: every tensor no expert updates is the
base's (up to FP16 rounding), and the change of the others has |cosine| of at least
`min_cosine` with the span of the experts' updates. The base unchanged is a merge with
all weights 0 (and scores as doing nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlrb.tasks.rules import weight_stats

# Relative change ||W - W_base|| / ||W_base|| that FP16/BF16 rounding of a base tensor stays under.
ROUNDING = 1e-2


def _reader(model_dir: Path) -> dict[str, tuple[Path, list[int]]]:
    return {t.name: (model_dir / t.file, t.shape) for t in weight_stats(model_dir).tensors}


def _load(path: Path, name: str):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor(name).double()


def expert_updates(expert_dir: Path, base: dict[str, tuple[Path, list[int]]]) -> dict[str, Callable]:
    """{base tensor name: function returning the expert's update of it}, computed on demand:
    B @ A * scaling for a peft LoRA adapter, W_expert - W_base for a full model."""
    config_file = expert_dir / "adapter_config.json"
    if not config_file.exists():  # a full fine-tuned model of the base's architecture
        theirs = _reader(expert_dir)
        return {name: (lambda name=name: _load(*theirs[name][:1], name) - _load(base[name][0], name))
                for name in base if name in theirs and theirs[name][1] == base[name][1]}  # fmt: skip
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


def check_is_merge(submission: Path, public: Path, min_cosine: float = 0.25) -> tuple[str, dict]:
    """(problem or "", facts): is the submission the base model plus a combination of the
    experts' updates (see the module's docstring)?"""
    import torch

    base_dir = public / "base_model"
    base, ours = _reader(base_dir), _reader(submission)
    if {k: v[1] for k, v in base.items()} != {k: v[1] for k, v in ours.items()}:
        extra, missing = sorted(set(ours) - set(base)), sorted(set(base) - set(ours))
        example = (extra or missing or [next(k for k in base if base[k][1] != ours[k][1])])[0]
        return (f"not a merge of the given models: its tensors differ from the base model's (e.g. {example}); "
                "a merge keeps the base's architecture"), {}  # fmt: skip
    experts = sorted(d for d in (public / "adapters").iterdir() if d.is_dir())
    updates = [expert_updates(d, base) for d in experts]
    change_sq = explained_sq = 0.0
    untouched_changed: list[tuple[str, float]] = []
    for name, (path, _) in sorted(base.items()):
        reference = _load(path, name)
        change = _load(ours[name][0], name) - reference
        theirs = [u[name]().reshape(-1) for u in updates if name in u]
        if not theirs:
            relative = float(change.norm() / reference.norm()) if reference.norm() > 0 else float(change.norm())
            if relative > ROUNDING:
                untouched_changed.append((name, relative))
            continue
        flat = change.reshape(-1)
        span = torch.stack(theirs)  # experts x entries
        gram, dots = span @ span.T, span @ flat
        coefficients = torch.linalg.pinv(gram) @ dots
        change_sq += float(flat @ flat)
        explained_sq += float(dots @ coefficients)  # squared norm of the projection onto the span
    cosine: float | None = (explained_sq / change_sq) ** 0.5 if change_sq > 0 else None
    facts = {"experts": [d.name for d in experts], "cosine_with_experts_updates": cosine,
             "untouched_tensors_changed": len(untouched_changed)}  # fmt: skip
    if untouched_changed:
        name, relative = max(untouched_changed, key=lambda item: item[1])
        return (f"not a merge of the given models: {len(untouched_changed)} tensors that no expert updates were "
                f"changed (e.g. {name}, by {relative:.1%} of its norm)"), facts  # fmt: skip
    if cosine is not None and cosine < min_cosine:
        return (f"not a merge of the given models: the weight changes are not a combination of the experts' "
                f"updates (|cosine| {cosine:.3f} with their span; a merge gives at least {min_cosine:g})"), facts  # fmt: skip
    return "", facts
