"""The edge_llm_training task at tiny scale: a whole baseline run through the CLI, and the
memory, FP16/FP32 and from-scratch rules broken against the scorer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import baseline_run, run_cli, task_from_config
from mlrb.tasks.handling import solutions_of


def load_task(**overrides):
    return task_from_config("edge_llm_training", **overrides)


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


# One process, so the untrained model is made once
ONE_UNTRAINED = pytest.mark.xdist_group("edge_llm_training_untrained")


@pytest.fixture(scope="module")
def untrained(assets, tmp_path_factory) -> Path:
    """The baseline's model before training (a valid submission of the baseline's shape)."""
    task = load_task()
    workspace = solutions_of(task, assets / "public").run(
        task.spec.do_nothing_command, tmp_path_factory.mktemp("untrained")
    )
    return workspace / "submission"


def copy_of(model: Path, tmp_path: Path) -> Path:
    sub = tmp_path / "submission"
    shutil.copytree(model, sub)
    return sub


@pytest.mark.fast
def test_full_scale_config_names_the_papers_setup(tmp_path):
    result = run_cli("--cfg", "job", "--resolve", "task=edge_llm_training", "task.scale=full", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # YAML folds long strings over lines
    for fact in ("dataset: AlgorithmicResearchGroup/edge_llm_training", "- c4_combined_dataset", "- alpaca_cleaned",
                 "memory_limit_mb: 1000", "fp16_fp32_only: true", "--layers 6 --heads 8 --width 256 --context 512",
                 "--tasks super-glue-lm-eval-v1"):  # fmt: skip
        assert fact in out, fact


@pytest.mark.system
def test_the_tiny_memory_limit_is_1gb_scaled_to_the_baseline(assets):
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    baseline_params = calibration["baseline.weight_memory_mb"] * 1e6 / 4  # saved in FP32
    assert load_task().spec.memory_limit_mb == pytest.approx(1000 * baseline_params / 17_735_936, rel=1e-3)
    assert calibration["baseline.peak_memory_mb"] < load_task().spec.memory_limit_mb


@pytest.mark.system
def test_data_has_both_subsets_and_the_baseline_beats_an_untrained_model(assets):
    data = assets / "public" / "data"
    c4 = json.loads((data / "c4_combined_dataset" / "train.jsonl").read_text().splitlines()[0])
    alpaca = json.loads((data / "alpaca_cleaned" / "train.jsonl").read_text().splitlines()[0])
    assert set(c4) == {"text"} and set(alpaca) == {"instruction", "input", "output"}
    c = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert abs(c["do_nothing_score"] - 0.5) < 0.05
    assert c["baseline_score"] > c["do_nothing_score"] + 0.1
    assert c["reference_score"] > c["baseline_score"] + 0.1


@pytest.mark.system
def test_baseline_run_is_recorded_with_score_and_memory(tmp_path, cache_dir, assets):
    metrics = baseline_run("edge_llm_training", tmp_path, cache_dir).data.metrics  # scores the build's anchor
    # The score is the accuracy on the hidden copa rows: a whole number of them right.
    rows = (assets / "hidden" / "suite" / "copa.jsonl").read_text().splitlines()
    right = metrics["score"] * len(rows)
    assert "score.copa" in metrics and right == pytest.approx(round(right), abs=1e-6) and 0 < round(right) < len(rows)
    assert 0 < metrics["weight_memory_mb"] < metrics["peak_memory_mb"] <= load_task().spec.memory_limit_mb


@pytest.mark.system
@ONE_UNTRAINED
def test_over_the_memory_limit_is_invalid_before_or_during_evaluation(untrained, assets, tmp_path):
    weights_mb = sum(p.stat().st_size for p in untrained.glob("*.safetensors")) / 1e6
    report = load_task(memory_limit_mb=weights_mb / 2).judge.score(
        copy_of(untrained, tmp_path), assets, tmp_path / "w1"
    )
    assert not report.valid and "the weights alone take" in report.reason
    # Weights that fit, an evaluation (activations, logits) that does not.
    report = load_task(memory_limit_mb=weights_mb * 1.05).judge.score(untrained, assets, tmp_path / "w2")
    assert not report.valid and report.score is None
    assert "during evaluation exceeds the limit" in report.reason
    assert report.metrics["peak_memory_mb"] > weights_mb * 1.05 > report.metrics["weight_memory_mb"]


@pytest.mark.system
@ONE_UNTRAINED
def test_an_fp16_model_is_valid(untrained, assets, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sub = tmp_path / "submission"
    AutoModelForCausalLM.from_pretrained(untrained, dtype=torch.float16).save_pretrained(sub)
    AutoTokenizer.from_pretrained(untrained).save_pretrained(sub)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert report.valid, report.reason
    assert report.metrics["weight_memory_mb"] == pytest.approx(report.details["weight_bytes"] / 1e6)
    assert report.details["dtypes"] == ["F16"]


def quantize(sub: Path, how: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(sub / "model.safetensors"))
    config = json.loads((sub / "config.json").read_text())
    name = next(k for k in weights if k.endswith("mlp.c_fc.weight"))
    if how == "int8":
        weights[name] = weights[name].mul(127 / weights[name].abs().max()).round().to(torch.int8)
    elif how == "bfloat16":
        weights = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    elif how == "config":
        config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    save_file(weights, str(sub / "model.safetensors"), metadata={"format": "pt"})
    (sub / "config.json").write_text(json.dumps(config))


@pytest.mark.system
@pytest.mark.parametrize(
    "how, reason",
    [
        ("int8", "weights stored as I8"),
        ("bfloat16", "weights stored as BF16"),
        ("config", "the model is quantized (quantization_config, method 'bitsandbytes')"),
    ],
)
@ONE_UNTRAINED
def test_quantized_submissions_are_invalid(untrained, assets, tmp_path, how, reason):
    sub = copy_of(untrained, tmp_path)
    quantize(sub, how)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and reason in report.reason


@pytest.mark.system
def test_the_public_checkpoint_is_invalid(assets, tmp_path):
    sub = copy_of(assets / "hidden" / "known_checkpoints" / "mlrb__tiny-gpt2", tmp_path)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and "pretrained weights" in report.reason and "mlrb/tiny-gpt2" in report.reason
