"""The edge_llm_compression task at tiny scale: a whole baseline run through the CLI, and
each rule broken once against the scorer directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import baseline_run, task_from_config
from mlrb.tasks.handling import solutions_of


def load_task(**overrides):
    return task_from_config("edge_llm_compression", **overrides)


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


def base_copy(assets: Path, tmp_path: Path, dtype: str = "float16") -> Path:
    """The base model re-saved in `dtype` (as given when float16)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sub = tmp_path / "submission"
    base = assets / "public" / "base_model"
    AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype)).save_pretrained(sub)
    AutoTokenizer.from_pretrained(base).save_pretrained(sub)
    return sub


@pytest.mark.system
def test_doing_nothing_is_invalid_and_the_reference_compresses_within_the_limit(assets):
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert "do_nothing_score" not in calibration
    assert "during evaluation exceeds the limit of 1.9 MB" in calibration["do_nothing_invalid"]
    assert calibration["reference.peak_memory_mb"] < load_task().spec.memory_limit_mb
    # The baseline's naive weight sharing (the head reuses the embedding) leaves it near chance (0.25).
    assert calibration["baseline_score"] < 0.35 < 0.6 < calibration["reference_score"]


@pytest.mark.system
def test_baseline_run_is_recorded_with_score_and_memory(tmp_path, cache_dir, assets):
    metrics = baseline_run("edge_llm_compression", tmp_path, cache_dir).data.metrics
    assert metrics["reference_score"] > metrics["baseline_score"]
    # Doing nothing is invalid, so a failure counts as the stated chance accuracy, below the baseline.
    assert metrics["do_nothing_score"] == 0.25 < metrics["baseline_score"]
    assert 0 < metrics["weight_memory_mb"] < metrics["peak_memory_mb"] <= load_task().spec.memory_limit_mb
    # Pruning, sharing and dropping layers, no training: no weight changed beyond zeroing.
    assert metrics["weights_changed_share"] == 0.0 and metrics["weights_pruned_share"] > 0.5
    assert 0.2 < metrics["weights_sparsity"] < 0.3  # 30% of every linear layer (the shared head: the embedding)
    # Half the layers dropped and the head stored once: about half the base's 1.09 MB of weights.
    assert metrics["weight_memory_mb"] < 0.6


@pytest.mark.system
def test_the_untouched_base_is_over_the_memory_limit_during_evaluation(assets, tmp_path):
    # The base as given (FP16): its weights alone fit under the limit, its evaluation does not.
    report = load_task().judge.score(base_copy(assets, tmp_path), assets, tmp_path / "work")
    assert not report.valid and report.score is None
    assert "during evaluation exceeds the limit of 1.9 MB" in report.reason
    assert report.metrics["peak_memory_mb"] > 1.9 > report.metrics["weight_memory_mb"]


@pytest.mark.system
def test_weights_over_the_memory_limit_are_invalid_before_evaluation(assets, tmp_path):
    report = load_task().judge.score(base_copy(assets, tmp_path, "float32"), assets, tmp_path / "work")
    assert not report.valid and "the weights alone take 2.18" in report.reason


@pytest.mark.system
def test_the_reference_removes_mlp_neurons_and_changes_no_weight(assets, tmp_path):
    task = load_task()
    workspace = solutions_of(task, assets / "public").run(task.spec.reference_command, tmp_path / "reference")
    report = task.judge.score(workspace / "submission", assets, tmp_path / "work")
    assert report.valid, report.reason
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert report.score == pytest.approx(calibration["reference_score"], abs=1e-6)
    # Every kept weight is the base's: whole tensors, and whole rows and columns of the MLPs' (structured pruning).
    assert report.metrics["weights_changed_share"] == 0.0
    assert (
        0.3
        < report.metrics["weights_pruned_share"]
        < 0.7
        < report.metrics["weights_pruned_share"] + report.metrics["weights_unchanged_share"]
    )
    config = json.loads((workspace / "submission" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["intermediate_size"]) == (4, round(0.8 * 384))  # all layers kept
    assert "cannot be ruled out" in report.details["training_check"]


def quantize(sub: Path, how: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(sub / "model.safetensors"))
    config = json.loads((sub / "config.json").read_text())
    name = next(k for k in weights if k.endswith("fc1.weight"))
    if how == "int8":
        weights[name] = weights[name].mul(127).round().to(torch.int8)
    elif how == "bfloat16":
        weights = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    elif how == "config":
        config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    elif how == "modules":
        weights[name.replace(".weight", ".qweight")] = weights[name].clone()
    save_file(weights, str(sub / "model.safetensors"), metadata={"format": "pt"})
    (sub / "config.json").write_text(json.dumps(config))


@pytest.mark.system
@pytest.mark.parametrize(
    "how, reason",
    [
        ("int8", "weights stored as I8"),
        ("bfloat16", "weights stored as BF16"),
        ("config", "the model is quantized (quantization_config, method 'bitsandbytes')"),
        ("modules", "quantization modules in the weights"),
    ],
)
def test_quantized_submissions_are_invalid(assets, tmp_path, how, reason):
    sub = base_copy(assets, tmp_path)
    quantize(sub, how)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and reason in report.reason


@pytest.mark.system
def test_empty_or_foreign_submissions_are_invalid(assets, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in load_task().judge.score(tmp_path / "empty", assets, tmp_path / "w").reason
    sub = base_copy(assets, tmp_path)
    config = json.loads((sub / "config.json").read_text())
    (sub / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    assert "model_type 'llama' is not allowed" in load_task().judge.score(sub, assets, tmp_path / "w2").reason
    # Weights whose shapes disagree with config.json: transformers cannot load them.
    (sub / "config.json").write_text(json.dumps({**config, "intermediate_size": 200}))
    report = load_task().judge.score(sub, assets, tmp_path / "w3")
    assert not report.valid and "the model cannot be loaded with transformers: RuntimeError" in report.reason
    shutil.rmtree(sub)


@pytest.mark.fast
def test_kept_rows_or_columns_of_a_base_tensor_are_pruning_and_anything_else_is_a_change():
    import torch

    from mlrb.tasks.model_checks import selected_from

    base = torch.arange(24, dtype=torch.float16).reshape(6, 4)
    assert selected_from(base[[0, 2, 5]], base)  # neurons removed (rows)
    assert selected_from(base[:, [1, 3]], base)  # their inputs removed (columns)
    assert selected_from(base[[1, 4], 0], base[:, 0])  # a bias, shortened
    assert not selected_from(base[[5, 0]], base)  # reordered: not what pruning leaves
    changed = base[[0, 2]].clone()
    changed[1, 1] += 1
    assert not selected_from(changed, base)  # a changed weight
    assert not selected_from(base, base)  # the same shape is the sampled comparison's


@pytest.mark.fast
def test_peak_memory_traces_only_the_calls_that_can_set_the_peak():
    """Batches as lm-eval runs them: each batch's log-probabilities stay alive while the next
    batch runs. The meter skips calls an earlier traced call covers, and still finds the peak."""
    import torch
    from transformers import PhiConfig, PhiForCausalLM

    from mlrb.tasks.model_checks import PeakMemory

    torch.manual_seed(0)
    model = PhiForCausalLM(PhiConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2)).eval()  # fmt: skip

    def evaluate(lengths):
        with PeakMemory(model, "cpu") as peak, torch.no_grad():
            for length in lengths:
                torch.log_softmax(model(torch.ones(8, length, dtype=torch.long)).logits, dim=-1)
        return peak

    longest_first = evaluate([40, 40, 30, 20, 10])  # lm-eval's order
    shortest_first = evaluate([10, 20, 30, 40, 40])  # every call larger than the last: all traced
    assert (longest_first.traced_calls, shortest_first.traced_calls) == (3, 5)
    assert longest_first.peak_bytes == shortest_first.peak_bytes
    # The 40-long batch's log-probabilities (8 x 40 x 64 floats) are alive while the next one runs.
    assert longest_first.peak_bytes > longest_first.weight_bytes + 2 * 8 * 40 * 64 * 4
    # A large batch after untraced small ones: what they left alive is bounded, never missed.
    late_large = evaluate([40, 10, 10, 10, 40])
    assert late_large.traced_calls == 4
    assert evaluate([10, 40]).peak_bytes <= late_large.peak_bytes <= longest_first.peak_bytes
