"""Rule checks that several tasks apply to a submitted Hugging Face model folder.

Each check returns a problem ("" when the rule holds) and, where useful, facts for
the score report. Reading weights' dtypes, shapes and sizes uses the safetensors
headers only (no torch, no loading); comparing weights loads one tensor at a time.

- `check_model_folder`: the folder is a plain transformers model (config, safetensors,
  tokenizer; no pickles, custom code, links, subfolders or adapters), of an allowed type and
  size, whose weight files are exactly the ones transformers loads (`weight_files`).
- `check_loadable`: transformers can load it (else scoring would crash, not judge), and what
  it loads is what the files hold (`loaded_differs`): the checks and the scorer read the same
  weights.
- `check_fp16_fp32`: FP16/FP32 weights only, no quantization config or modules.
- `check_base_model`: the declared starting model is an allowed *base* model, not an
  instruction-tuned one; `weight_distances` tells which known model the weights
  derive from, and `shares_toward` how far they were blended toward another one.
- `compare_to_base`: how the weights relate to a base model's (unchanged, pruned,
  shared, changed), for rules that forbid training.
- `checkpoint_copies`: weight matrices copied (or fine-tuned) from a known checkpoint, for
  rules that demand training from scratch.
- `PeakMemory`: peak memory of a model's evaluation.
"""

from __future__ import annotations

import fnmatch
import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Weights-only formats; pickled checkpoints (.bin, .pt, ...) can run code when loaded.
PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
FLOAT_DTYPES = {"F16", "F32"}  # safetensors' names for float16 and float32
CONFIG_FLOAT_DTYPES = {"float16", "float32"}
# Tensor names that quantization libraries add (GPTQ/AWQ, bitsandbytes, HQQ, fp8, ...).
QUANTIZATION_TENSOR_MARKERS = (
    "qweight",
    "qzeros",
    "g_idx",
    "absmax",
    "quant_map",
    "quant_state",
    "nested_absmax",
    ".SCB",
    "weight_format",
    "weight_scale",
    "input_scale",
    "scales_and_zeros",
)
# Words in a hub id that mark an instruction-tuned or chat model (not a base model).
INSTRUCTION_TUNED_PATTERN = re.compile(
    r"instruct|chat|(^|[-_/.])it($|[-_/.])|sft|rlhf|dpo|alpaca|vicuna|hermes|orca|zephyr|tulu|wizard|openchat",
    re.IGNORECASE,
)
_MAX_HEADER_BYTES = 100_000_000
# The weight files transformers loads from a folder: the one file, or the shards its index names.
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
# Files that make transformers load weights from somewhere else (a PEFT adapter names its base model).
ELSEWHERE_FILES = ("adapter_config.json",)


@dataclass
class TensorInfo:
    file: str
    name: str
    dtype: str
    shape: list[int]
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n


@dataclass
class WeightStats:
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def n_params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def dtypes(self) -> list[str]:
        return sorted({t.dtype for t in self.tensors})


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The JSON header of a .safetensors file, checked against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path.name} is too short to be safetensors")
        (n,) = struct.unpack("<Q", raw)
        if n > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{path.name} has an invalid header length")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has an invalid header")
    header.pop("__metadata__", None)
    for name, info in header.items():
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= size - 8 - n:
            raise ValueError(f"{path.name}: tensor {name} lies outside the file")
    return header


def weight_stats(model_dir: Path) -> WeightStats:
    """Every tensor in the folder's .safetensors files, from their headers only."""
    stats = WeightStats()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for name, info in read_safetensors_header(path).items():
            start, end = info["data_offsets"]
            stats.tensors.append(TensorInfo(path.name, name, str(info["dtype"]), list(info["shape"]), end - start))
    return stats


# ------------------------------------------------------------------ model folders


def check_model_folder(submission: Path, model_types: list[str], max_params: int | None = None):
    """A plain transformers model folder of an allowed type and size: (problem, facts)."""
    if not submission.is_dir():
        return "the submission is not a folder holding a model", {}
    links = [p.name for p in submission.rglob("*") if p.is_symlink()]
    if links:
        return f"the submission contains symbolic links ({', '.join(links[:5])})", {}
    problem = one_reading_problem(submission)
    if problem:
        return problem, {}
    pickled = [p.name for p in submission.rglob("*") if p.suffix in PICKLE_SUFFIXES]
    if pickled:
        return f"pickled weights are not accepted ({', '.join(pickled[:5])}); save with safetensors", {}
    try:
        config = json.loads((submission / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json is missing or not valid JSON ({type(e).__name__})", {}
    if not isinstance(config, dict):
        return f"config.json must hold a JSON object, not a {type(config).__name__}", {}
    if "auto_map" in config:
        return "the model declares custom code (auto_map); only transformers' own architectures are accepted", {}
    model_type = config.get("model_type")
    if model_type not in model_types:
        return f"model_type '{model_type}' is not allowed; allowed: {', '.join(model_types)}", {}
    if not any((submission / name).exists() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return "no tokenizer (tokenizer.json, tokenizer.model or vocab.json) in the submission", {}
    try:
        stats = weight_stats(submission)
    except Exception as e:  # a corrupt header: any of several error types
        return f"the weights cannot be read: {type(e).__name__}: {str(e)[:200]}", {}
    facts = {"model_type": model_type, "n_params": stats.n_params, "weight_bytes": stats.nbytes, "dtypes": stats.dtypes}
    if stats.n_params == 0:
        return "no safetensors weights in the submission", facts
    if max_params is not None and stats.n_params > max_params:
        return f"{stats.n_params:,} parameters exceed the limit of {max_params:,}", facts
    return "", facts


def weight_files(folder: Path) -> tuple[list[Path], str]:
    """The weight files transformers loads from FOLDER (model.safetensors, or the shards that
    model.safetensors.index.json names), and a problem ("" when none) when the folder holds other
    weights, which the checks would read and the scorer would not."""
    present = sorted(p.name for p in folder.glob("*.safetensors"))
    index = folder / WEIGHTS_INDEX
    if (folder / WEIGHTS_FILE).is_file():
        extra = [name for name in present if name != WEIGHTS_FILE] + ([WEIGHTS_INDEX] if index.exists() else [])
        if extra:
            return [], f"weights beside {WEIGHTS_FILE} ({', '.join(extra[:5])}) that transformers would not load"
        return [folder / WEIGHTS_FILE], ""
    if not index.is_file():
        if not present:
            return [], ""  # no weights at all: check_model_folder says so
        listed = ", ".join(present[:5])
        return [], f"weights must be {WEIGHTS_FILE}, or shards named by {WEIGHTS_INDEX} (found {listed})"
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted({str(name) for name in weight_map.values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], f"{WEIGHTS_INDEX} is not an index of weights (a JSON object with a weight_map)"
    outside = [name for name in shards if name not in present]
    if outside:
        return [], f"{WEIGHTS_INDEX} names weights that are not files of the folder ({', '.join(outside[:3])})"
    unused = [name for name in present if name not in shards]
    if unused:
        return [], f"weights {WEIGHTS_INDEX} does not name ({', '.join(unused[:5])}), which transformers would not load"
    return [folder / name for name in shards], ""


def one_reading_problem(submission: Path) -> str:
    """Why the rule checks and the scorer might read different weights from this folder ("" when
    they cannot): a subfolder or a file that is not plain, a file that makes transformers load
    weights from elsewhere, or weight files transformers would not load."""
    for path in submission.iterdir():
        if path.is_dir():
            return f"the submission holds a folder ({path.name}/): a model folder is flat, as save_pretrained writes it"
        if not path.is_file():
            return f"the submission holds {path.name}, which is not a plain file"
    elsewhere = [name for name in ELSEWHERE_FILES if (submission / name).exists()]
    if elsewhere:
        return (
            f"the submission holds {elsewhere[0]}, which makes transformers load a model from elsewhere; "
            "merge the adapter into its model (merge_and_unload) and save that"
        )
    return weight_files(submission)[1]


def check_loadable(submission: Path) -> str:
    """Load the model and tokenizer once, on the CPU in their own dtype, so a folder that
    transformers cannot load (say weights whose shapes disagree with config.json) is an
    invalid submission rather than a scorer failure; and check that the model it loads is the
    weight files' (`loaded_differs`)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        config = AutoConfig.from_pretrained(submission, trust_remote_code=False)
        loader = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = loader.from_pretrained(submission, dtype="auto", trust_remote_code=False)
        AutoTokenizer.from_pretrained(submission, trust_remote_code=False)
    except Exception as e:  # transformers raises many types for a broken folder
        first = (str(e).strip().splitlines() or [""])[-1][:200]
        return f"the model cannot be loaded with transformers: {type(e).__name__}: {first}"
    return loaded_differs(model, submission)


def loaded_differs(model, folder: Path) -> str:
    """Why the model transformers loaded from FOLDER is not the tensors its weight files hold ("" when
    it is): a tensor of the files that the model does not use or holds otherwise (config.json may
    tie or rename weights), or a parameter that is in no file (transformers initialised it at random)
    and shares no other one's storage (a tied weight)."""
    import torch
    from safetensors import safe_open

    loaded = {**dict(model.named_buffers()), **dict(model.named_parameters(remove_duplicate=False))}
    read: set[str] = set()
    for file in weight_files(folder)[0]:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                tensor = loaded.get(name)
                if tensor is None:
                    return f"{file.name} holds {name}, which the model transformers loads does not use"
                if not torch.equal(tensor, f.get_tensor(name).to(dtype=tensor.dtype, device=tensor.device)):
                    return (
                        f"{name} as transformers loads it is not {file.name}'s (config.json changes it, say by "
                        "tying weights): the checks and the scorer would read different weights"
                    )
                read.add(name)
    from_files = {loaded[name].data_ptr() for name in read}
    random = [
        name
        for name, p in model.named_parameters(remove_duplicate=False)
        if name not in read and p.data_ptr() not in from_files
    ]
    if random:
        return f"parameters in no weight file ({', '.join(random[:3])}): transformers would initialise them at random"
    return ""


def check_fp16_fp32(submission: Path) -> str:
    """FP16/FP32 only: no quantized or other dtypes, no quantization config or modules."""
    config = json.loads((submission / "config.json").read_text())
    if config.get("quantization_config"):
        quantization = config["quantization_config"]
        method = quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else "unknown"
        return f"the model is quantized (quantization_config, method '{method}'); FP16/FP32 only"
    declared = config.get("torch_dtype") or config.get("dtype")
    if declared is not None and declared not in CONFIG_FLOAT_DTYPES:
        return f"config.json declares dtype '{declared}'; FP16/FP32 only"
    stats = weight_stats(submission)
    other = sorted({t.dtype for t in stats.tensors} - FLOAT_DTYPES)
    if other:
        example = next(t.name for t in stats.tensors if t.dtype in other)
        return f"weights stored as {', '.join(other)} (e.g. {example}); FP16/FP32 only, no quantization"
    marked = [t.name for t in stats.tensors if any(m in t.name for m in QUANTIZATION_TENSOR_MARKERS)]
    if marked:
        return f"quantization modules in the weights ({', '.join(marked[:3])}); FP16/FP32 only"
    return ""


# ------------------------------------------------------------------- base models


def looks_instruction_tuned(name: str) -> bool:
    return bool(INSTRUCTION_TUNED_PATTERN.search(name))


def check_base_model(declared: str | None, allowed: list[str], instruction_tuned: list[str]) -> str:
    """The declared starting model must match an allowed base-model pattern and be neither
    a known instruction-tuned model nor named like one."""
    if not declared or not isinstance(declared, str):
        return 'the submission does not declare its base model (provenance.json: {"base_model": ...})'
    if declared in instruction_tuned or looks_instruction_tuned(declared):
        return f"'{declared}' is an instruction-tuned model; only base models are allowed"
    if not any(fnmatch.fnmatchcase(declared, pattern) for pattern in allowed):
        return f"'{declared}' is not an allowed base model; allowed: {', '.join(allowed)}"
    return ""


def weight_distances(submission: Path, candidates: dict[str, Path]) -> dict[str, float | None]:
    """Relative L2 distance of the submission's weights to each candidate model's:
    ||W - W_c|| / ||W_c|| over all tensors. None when the tensor names or shapes differ
    (not the same architecture, so not derived from it by fine-tuning)."""
    from safetensors import safe_open

    ours = _tensor_index(submission)
    distances: dict[str, float | None] = {}
    for name, model_dir in candidates.items():
        theirs = _tensor_index(model_dir)
        if set(theirs) != set(ours):
            distances[name] = None
            continue
        diff_sq = ref_sq = 0.0
        same = True
        for key, (file, shape) in theirs.items():
            if ours[key][1] != shape:
                same = False
                break
            with safe_open(str(model_dir / file), framework="pt") as f:
                ref = f.get_tensor(key).double()
            with safe_open(str(submission / ours[key][0]), framework="pt") as f:
                mine = f.get_tensor(key).double()
            diff_sq += float((mine - ref).pow(2).sum())
            ref_sq += float(ref.pow(2).sum())
        distances[name] = (diff_sq / ref_sq) ** 0.5 if same and ref_sq > 0 else None
    return distances


def shares_toward(submission: Path, base_dir: Path, other_dir: Path) -> tuple[float, dict[str, float]] | None:
    """How far the submission lies along the straight line from a base model to another
    model derived from it: <W - W_base, W_other - W_base> / ||W_other - W_base||^2 (0: no
    step toward the other model; 1: all the way; a blend W_base + a * (W_other - W_base)
    gives a), over all tensors and per tensor. None when names or shapes differ.

    Fine-tuning the base moves its weights in a direction nearly orthogonal to another
    fine-tune's (their updates share little), so an honest submission scores near 0
    even when it lies far from the base. The share over all tensors alone would let the
    other model's update be copied into a few tensors that hold little of it, so each
    tensor has its own; tensors holding under `MIN_TENSOR_WEIGHT` of the other model's
    update are left out of the per-tensor shares (a ratio of two near-zero steps says nothing)."""
    from safetensors import safe_open

    ours, base, other = _tensor_index(submission), _tensor_index(base_dir), _tensor_index(other_dir)
    if not set(ours) == set(base) == set(other):
        return None
    dots: dict[str, float] = {}
    norms_sq: dict[str, float] = {}
    for key, (file, shape) in base.items():
        if ours[key][1] != shape or other[key][1] != shape:
            return None
        with safe_open(str(base_dir / file), framework="pt") as f:
            reference = f.get_tensor(key).double()
        with safe_open(str(other_dir / other[key][0]), framework="pt") as f:
            direction = f.get_tensor(key).double() - reference
        with safe_open(str(submission / ours[key][0]), framework="pt") as f:
            step = f.get_tensor(key).double() - reference
        dots[key] = float((step * direction).sum())
        norms_sq[key] = float(direction.pow(2).sum())
    total = sum(norms_sq.values())
    if total <= 0:
        return None
    per_tensor = {key: dots[key] / norms_sq[key] for key in dots if norms_sq[key] > MIN_TENSOR_WEIGHT * total}
    return sum(dots.values()) / total, per_tensor


MIN_TENSOR_WEIGHT = 1e-3  # share of the other model's squared update a tensor must hold to be judged alone


# Half an ulp relative to the value (unit roundoff) and smallest normal, per safetensors float dtype.
_ROUNDING = {
    "F64": (2.0**-53, 2.2250738585072014e-308),
    "F32": (2.0**-24, 1.1754943508222875e-38),
    "F16": (2.0**-11, 6.103515625e-05),
    "BF16": (2.0**-8, 1.1754943508222875e-38),
}


def rounding_tolerance(reference, *dtypes: str):
    """Entry-wise bound on what storing REFERENCE in the coarsest of DTYPES (safetensors
    names, read from the headers before converting to double) can change: half an ulp,
    relative to |reference|, plus the dtype's smallest normal as an absolute floor (for
    subnormals and zeros). FP16: 4.9e-4 relative, floor 6.1e-5; BF16: 3.9e-3; FP32: 6e-8.
    Dtypes it does not know (integers, FP8) get no tolerance: such entries must match exactly."""
    relative, floor = max((_ROUNDING.get(d, (0.0, 0.0)) for d in dtypes), default=(0.0, 0.0))
    return reference.abs() * relative + floor


def _tensor_index(model_dir: Path) -> dict[str, tuple[str, list[int]]]:
    return {t.name: (t.file, t.shape) for t in weight_stats(model_dir).tensors}


def selected_from(tensor, base) -> bool:
    """Whether `tensor` is whole rows (or, for a matrix, whole columns) of `base` in their order,
    up to FP16 rounding: what structured pruning (removing neurons, heads) leaves of a tensor."""
    import torch

    if tensor.dim() != base.dim() or tensor.dim() not in (1, 2) or tensor.shape == base.shape:
        return False
    mine, ref = tensor.to(torch.float16), base.to(torch.float16)
    if mine.dim() == 2 and mine.shape[0] == ref.shape[0]:  # columns kept: compare as rows
        mine, ref = mine.T, ref.T
    if mine.dim() == 2 and mine.shape[1] != ref.shape[1]:
        return False

    def as_rows(t) -> list[bytes]:
        return [bytes(row.contiguous().view(torch.uint8).numpy()) for row in (t if t.dim() == 2 else t[:, None])]

    rows, wanted = as_rows(ref), as_rows(mine)
    at = 0  # kept rows appear in the base's order (each base row used once)
    for row in wanted:
        while at < len(rows) and rows[at] != row:
            at += 1
        if at == len(rows):
            return False
        at += 1
    return True


def compare_to_base(submission: Path, base_dir: Path, samples: int = 4096) -> dict[str, float]:
    """Share of the submission's parameters that are (a) unchanged base weights, up to
    FP16 rounding, possibly with entries zeroed (pruning), possibly from another layer
    (layer dropping renumbers layers; weight sharing repeats a tensor), possibly whole rows or
    columns of the base's tensor of that name (structured pruning), or (b) changed.

    Compares a fixed sample of positions per tensor against every base tensor of the
    same shape, so it stays cheap for billions of parameters. Changed weights mean
    something other than pruning, dropping, sharing or a dtype cast happened: training,
    distillation or a training-free transform (say low-rank factorisation) alike.
    """
    import torch
    from safetensors import safe_open

    def tensors(model_dir: Path):
        """(name, tensor), one at a time: never a whole model in memory."""
        for t in weight_stats(model_dir).tensors:
            with safe_open(str(model_dir / t.file), framework="pt") as f:
                yield t.name, f.get_tensor(t.name)

    generator = torch.Generator().manual_seed(0)
    positions: dict[tuple, torch.Tensor] = {}

    def sample(tensor):
        flat = tensor.reshape(-1)
        key = tuple(tensor.shape)
        if key not in positions:
            n = min(samples, flat.numel())
            positions[key] = torch.randperm(flat.numel(), generator=generator)[:n]
        return flat[positions[key]].to(torch.float16).float()

    base_files = _tensor_index(base_dir)

    def base_tensor(name: str):
        with safe_open(str(base_dir / base_files[name][0]), framework="pt") as f:
            return f.get_tensor(name)

    by_shape: dict[tuple, list] = {}
    for name, tensor in tensors(base_dir):
        by_shape.setdefault(tuple(tensor.shape), []).append((name, sample(tensor)))
    counts = {"unchanged": 0, "pruned": 0, "changed": 0, "zeroed_params": 0}
    total = 0
    for name, tensor in tensors(submission):
        n = tensor.numel()
        total += n
        mine = sample(tensor)
        kept = mine != 0
        counts["zeroed_params"] += int((tensor == 0).sum())
        match = None
        for _base_name, ref in sorted(by_shape.get(tuple(tensor.shape), []), key=lambda c: c[0] != name):
            if torch.equal(mine[kept], ref[kept]):
                match = "unchanged" if torch.equal(mine, ref) else "pruned"
                break
        if match is None and name in base_files and selected_from(tensor, base_tensor(name)):
            match = "pruned"  # structured pruning: whole rows or columns of the base's own tensor kept
        counts[match or "changed"] += n
    total = max(total, 1)
    return {
        "unchanged_share": counts["unchanged"] / total,
        "pruned_share": counts["pruned"] / total,
        "changed_share": counts["changed"] / total,
        "sparsity": counts["zeroed_params"] / total,
    }


# -------------------------------------------------------------- from scratch


def checkpoint_copies(
    submission: Path, checkpoint: Path, min_similarity: float = 0.5, samples: int = 4096
) -> list[dict[str, Any]]:
    """The submission's weight matrices (2-D and larger) that come from the checkpoint's:
    each compared, on a fixed sample of positions, with every checkpoint tensor of the same
    shape (and, for matrices, with its transpose); |cosine similarity| >= min_similarity
    counts as a copy. Returns one {"tensor", "checkpoint_tensor", "similarity", "params"}
    per copied tensor.

    Why cosine: training from scratch starts from a fresh random draw, and hidden units
    can be in any order, so matrices of independently trained models are uncorrelated
    (|cos| about 1/sqrt(samples)); a copied, rescaled, transposed or fine-tuned matrix
    keeps |cos| near 1. Vectors (norms, biases) are skipped: they start at 0 or 1 in every
    model; so are mask-like buffers (at most two distinct values, say GPT-2's causal mask in
    older checkpoints), the same in every model of a shape. Permuting a copied matrix's
    hidden units would evade this check.
    """
    import torch
    from safetensors import safe_open

    generator = torch.Generator().manual_seed(0)
    positions: dict[tuple, torch.Tensor] = {}

    def sample_index(shape: tuple) -> torch.Tensor:
        if shape not in positions:
            numel = 1
            for dim in shape:
                numel *= dim
            positions[shape] = torch.randperm(numel, generator=generator)[: min(samples, numel)]
        return positions[shape]

    def matrices(model_dir: Path):
        for t in weight_stats(model_dir).tensors:
            if len(t.shape) >= 2:
                with safe_open(str(model_dir / t.file), framework="pt") as f:
                    tensor = f.get_tensor(t.name).double()
                if torch.unique(tensor.reshape(-1)[sample_index(tuple(tensor.shape))]).numel() > 2:
                    yield t.name, tensor

    # Checkpoint samples, keyed by the shape of the submission tensor they can be compared with.
    references: dict[tuple, list[tuple]] = {}
    for name, tensor in matrices(checkpoint):
        shape = tuple(tensor.shape)
        references.setdefault(shape, []).append((name, tensor.reshape(-1)[sample_index(shape)]))
        if len(shape) == 2 and shape[0] != shape[1]:
            flipped = (shape[1], shape[0])
            transposed = tensor.t().reshape(-1)[sample_index(flipped)]
            references.setdefault(flipped, []).append((f"{name} (transposed)", transposed))

    copies: list[dict[str, Any]] = []
    for name, tensor in matrices(submission):
        shape = tuple(tensor.shape)
        mine = tensor.reshape(-1)[sample_index(shape)] if shape in references else None
        best_name, best = "", 0.0
        for ref_name, ref in references.get(shape, []):
            assert mine is not None  # sampled for every shape that has references
            norm = float(mine.norm() * ref.norm())
            similarity = abs(float(mine @ ref)) / norm if norm > 0 else 0.0
            if similarity > best:
                best_name, best = ref_name, similarity
        if best >= min_similarity:
            copies.append(
                {"tensor": name, "checkpoint_tensor": best_name, "similarity": round(best, 4), "params": tensor.numel()}
            )
    return copies


def check_not_known_checkpoint(submission: Path, checkpoints: dict[str, Path], min_similarity: float = 0.5):
    """(problem or "", facts): no weight matrix of the submission may come from a known
    pretrained checkpoint (see `checkpoint_copies`)."""
    facts: dict[str, object] = {"checked_against": sorted(checkpoints)}
    for name, path in sorted(checkpoints.items()):
        try:
            copies = checkpoint_copies(submission, path, min_similarity)
        except Exception as e:  # unreadable tensors: the folder check reads headers only
            return f"the weights cannot be compared with {name}: {type(e).__name__}: {str(e)[:200]}", facts
        if copies:
            facts["copied_from"] = {name: copies[:10]}
            share = sum(c["params"] for c in copies) / max(1, weight_stats(submission).n_params)
            first = copies[0]
            return (
                f"pretrained weights: {len(copies)} weight matrices ({share:.0%} of the parameters) come from the "
                f"public checkpoint {name} (e.g. {first['tensor']} ~ {first['checkpoint_tensor']}, "
                f"|cosine| {first['similarity']:.2f}); the model must be trained from scratch",
                facts,
            )
    return "", facts


# ----------------------------------------------------------------------- memory


MEMORY_METHOD = (
    "weights + peak of live tensors during evaluation (torch dispatch; forward calls that a traced one "
    "covers, in input shape and its predecessor's, run untraced), on any device"
)


class PeakMemory:
    """Peak memory of a loaded model while it is evaluated, in bytes: the submission's own.

    On every device the same measure, so CPU and GPU give the same verdict: the model's
    weights and buffers (each storage counted once, so shared weights count once) plus
    the peak of live tensors created during the evaluation (activations, logits, caches),
    tracked op by op with a dispatch mode. What the libraries hold for themselves is not
    the model's and is not counted: CUDA's context and cuBLAS workspaces (about 33 MB that
    `torch.cuda.max_memory_allocated` includes), process RSS on CPU, memory inside one
    kernel. On CUDA the allocator's peak above what was allocated before the evaluation
    is also kept, for the record (`allocator_peak_bytes`).

    Tracing every op costs more than a small model's evaluation itself, so only the calls
    that can set the peak are traced. A plain transformers model (no custom code is
    allowed) uses memory by its input's shape alone, and while a batch runs, what the
    batch before it left alive (its log-probabilities, the next input) is still held. So
    a forward call is skipped when an already traced call had at least its (batch,
    length) and followed a call with at least its predecessor's; every other call (and
    any call with a cache: generation) is traced up to the next call, and so is that
    next call, whose start measures what the traced one left alive. Ops between entering
    and the first call are traced. lm-eval orders batches longest first, so its first three
    calls are traced and the peak is exact. Were a later call larger, what its untraced
    predecessor left alive is counted as the most any traced call left alive (an upper
    bound: the predecessor's shape is covered by a traced one's).

        with PeakMemory(model, device) as peak:
            ...evaluate...
        peak.peak_bytes, peak.weight_bytes
    """

    def __init__(self, model, device: str):
        self.model = model
        self.device = device
        self.weight_bytes = 0
        self.peak_bytes = 0
        self.allocator_peak_bytes: int | None = None
        self.traced_calls = 0
        self.forward_calls = 0
        self._mode: Any = None  # a _LiveTensorBytes mode while entered
        self._tracing = False
        self._traced_keys: list[tuple] = []  # (previous call's batch, length, this call's batch, length)
        self._previous_shape: tuple | None = (0, 0)  # before the first call: nothing left alive
        self._previous_needed = True  # the window from entering to the first call is traced
        self._largest_leftover = 0
        self._allowance = 0
        self._hook: Any = None  # the forward pre-hook while entered
        self._allocated_before = 0

    def __enter__(self) -> PeakMemory:
        import torch

        fix_evaluation_settings(self.model)
        storages = {}
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            storage = tensor.untyped_storage()
            storages[(tensor.device.type, storage.data_ptr())] = storage.nbytes()
        self.weight_bytes = sum(storages.values())
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._allocated_before = torch.cuda.memory_allocated()
        self._mode = _LiveTensorBytes({ptr for _, ptr in storages})
        self._hook = self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        self._trace(True)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        self._hook.remove()
        self._trace(False, *exc)
        self.peak_bytes = self.weight_bytes + self._mode.peak
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.allocator_peak_bytes = (
                self.weight_bytes + int(torch.cuda.max_memory_allocated()) - self._allocated_before
            )

    def _trace(self, on: bool, *exc, allowance: int = 0) -> None:
        if on and not self._tracing:
            self._allowance = allowance  # untracked leftovers, counted as live while this window is open
            self._mode.current += allowance
            self._mode.__enter__()
        elif not on and self._tracing:
            self._mode.__exit__(*(exc or (None, None, None)))
            self._mode.current -= self._allowance
            self._allowance = 0
        self._tracing = on

    def _before_forward(self, module, args, kwargs):
        self.forward_calls += 1
        if self._tracing:  # live now: what the last call left behind
            self._largest_leftover = max(self._largest_leftover, self._mode.current - self._allowance)
        shape = _input_shape(args, kwargs)
        key = None if shape is None or self._previous_shape is None else self._previous_shape + shape
        needed = key is None or not any(
            all(a <= b for a, b in zip(key, seen, strict=True)) for seen in self._traced_keys
        )
        if needed or self._previous_needed:
            if not self._tracing:  # a larger call after untraced ones: bound what they left alive
                self._trace(True, allowance=self._largest_leftover)
            self.traced_calls += 1
            if key is not None:
                self._traced_keys.append(key)
        else:
            self._trace(False)
        self._previous_shape, self._previous_needed = shape, needed


def fix_evaluation_settings(model) -> None:
    """The settings a memory limit is measured at, whatever the submission's config.json says: the
    key-value cache on (as when generating on the device), PyTorch's own attention, no extra outputs.
    Read from the submission, one flag (use_cache: false) would meet a limit with no compression.
    A plain torch module has none of these settings."""
    config = getattr(model, "config", None)
    if config is None:
        return
    config.use_cache = True
    config.output_attentions = config.output_hidden_states = False
    model.set_attn_implementation("sdpa")


def _input_shape(args, kwargs) -> tuple | None:
    """(batch, length) of a forward call's input; None with a cache (generation) or no tensor input."""
    import torch

    if kwargs.get("past_key_values") is not None:
        return None
    inputs = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    return tuple(inputs.shape[:2]) if isinstance(inputs, torch.Tensor) else None


def _LiveTensorBytes(ignore: set):
    """A TorchDispatchMode that tracks the bytes of live tensor storages created by ops
    (built lazily so that importing this module does not import torch)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class LiveTensorBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, list] = {}  # storage pointer -> [bytes, live tensors using it]
            self.current = 0
            self.peak = 0

        def _release(self, key: int) -> None:
            entry = self.live.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                self.current -= entry[0]
                del self.live[key]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                    continue
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key == 0 or key in ignore:  # empty, or a view of the weights
                    continue
                if key in self.live:
                    self.live[key][1] += 1
                else:
                    self.live[key] = [storage.nbytes(), 1]
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                weakref.finalize(tensor, self._release, key)
            return out

    return LiveTensorBytes()
