"""The llm_merging task at tiny scale: real assets, real merges, real lm-eval scores."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_llm_merging
from mlrb.core.config import SandboxConfig
from mlrb.harness.assets import ensure_assets
from mlrb.scoring.runner import score_submission
from mlrb.tasks.base import Task
from mlrb.tasks.model_checks import weight_stats

# One test process for the module: the baseline merge (`merged`, the starter's merge.py, about
# 10 CPU s) is made once, not once in each process that runs one of its tests.
pytestmark = [pytest.mark.system, pytest.mark.xdist_group("llm_merging_merged")]


@pytest.fixture(scope="module")
def task() -> Task:
    return tiny_llm_merging()


@pytest.fixture(scope="module")
def assets(task, built_cache) -> Path:
    return ensure_assets(task, built_cache)


@pytest.fixture(scope="module")
def merged(task, assets, tmp_path_factory) -> Path:
    """The baseline merge, made by the starter script the agent gets."""
    out = tmp_path_factory.mktemp("merged") / "model"
    subprocess.run(
        [sys.executable, str(task.start.starter / "merge.py"), "--data", str(assets / "public"), "--output", str(out)],
        check=True,
    )
    return out


def score(task, assets, submission, tmp_path):
    """Scored as a default run scores: in a fresh bwrap sandbox."""
    return score_submission(task, submission, assets, tmp_path / "scoring", SandboxConfig())


def test_assets_keep_the_test_set_out_of_the_public_folder(assets):
    public = {p.relative_to(assets / "public").as_posix() for p in (assets / "public").rglob("*")}
    assert "base_model/config.json" in public and "dev.jsonl" in public
    assert len([p for p in (assets / "public" / "adapters").iterdir()]) >= 2
    assert not any("test" in p for p in public)
    rows = [json.loads(line) for line in (assets / "hidden" / "test.jsonl").read_text().splitlines()]
    assert len(rows) >= 100
    assert set(rows[0]) >= {"question", "subject", "choices", "answer"} and len(rows[0]["choices"]) == 4
    dev = [json.loads(line) for line in (assets / "public" / "dev.jsonl").read_text().splitlines()]
    as_key = lambda r: (r["question"], tuple(r["choices"]))  # noqa: E731
    assert {as_key(r) for r in dev}.isdisjoint({as_key(r) for r in rows})  # no test item is in the dev set


def test_assets_are_built_once_and_reused(task, cache_dir, assets):
    manifest = (assets / "manifest.json").stat().st_mtime
    assert ensure_assets(task, cache_dir) == assets
    assert (assets / "manifest.json").stat().st_mtime == manifest


def test_merging_measurably_changes_the_score(task, assets, merged, tmp_path):
    base = score(task, assets, assets / "public" / "base_model", tmp_path / "base")
    merge = score(task, assets, merged, tmp_path / "merge")
    assert base.valid and merge.valid, (base.reason, merge.reason)
    assert base.score < 0.35  # the unmerged base is near chance (0.25)
    assert merge.score - base.score >= 0.10
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert merge.score == pytest.approx(calibration["baseline_score"], abs=1e-6)  # deterministic
    assert calibration["reference_score"] > calibration["baseline_score"]
    skills = json.loads((assets / "manifest.json").read_text())["params"]["skills"]
    assert set(merge.metrics) == {f"score.{skill}" for skill in skills}  # accuracy per skill


def break_submission(merged: Path, tmp_path: Path, how: str) -> Path:
    sub = tmp_path / "sub"
    shutil.copytree(merged, sub)
    config = json.loads((sub / "config.json").read_text())
    if how == "pickle":
        (sub / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    elif how == "model_type":
        config["model_type"] = "gpt2"
    elif how == "custom_code":
        config["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}
    elif how == "too_big":
        pass  # judged against a lowered limit below
    elif how == "corrupt":
        (sub / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    elif how == "no_config":
        (sub / "config.json").unlink()
    elif how == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer.model"):
            (sub / name).unlink(missing_ok=True)
    elif how == "symlink":
        (sub / "answers.jsonl").symlink_to("/etc/hostname")
    if (sub / "config.json").exists():
        (sub / "config.json").write_text(json.dumps(config))
    return sub


@pytest.mark.parametrize(
    "how, reason",
    [
        ("pickle", "pickled weights are not accepted"),
        ("model_type", "model_type 'gpt2' is not allowed"),
        ("custom_code", "custom code"),
        ("corrupt", "the weights cannot be read"),
        ("no_config", "config.json is missing"),
        ("no_tokenizer", "no tokenizer"),
        ("symlink", "symbolic links"),
    ],
)
def test_rule_breakers_are_invalid_with_a_reason(task, assets, merged, tmp_path, how, reason):
    report = score(task, assets, break_submission(merged, tmp_path, how), tmp_path)
    assert not report.valid
    assert reason in report.reason
    assert report.score is None


def test_a_model_over_the_parameter_limit_is_invalid(assets, merged, tmp_path):
    task = tiny_llm_merging()
    task.cfg.scales["tiny"]["max_params"] = 1000  # the scorer process reads the task's config
    report = score(task, assets, merged, tmp_path)
    assert not report.valid and "exceed the limit of 1,000" in report.reason


def test_an_empty_or_missing_submission_is_invalid(task, assets, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in score(task, assets, tmp_path / "empty", tmp_path).reason
    assert "no submission" in score(task, assets, tmp_path / "absent", tmp_path).reason


def test_code_shipped_in_the_submission_cannot_reach_the_scorer(task, assets, merged, tmp_path):
    sub = tmp_path / "sub"
    shutil.copytree(merged, sub)
    marker = tmp_path / "pwned"
    payload = f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(0)\n"
    (sub / "sitecustomize.py").write_text(payload)
    (sub / "usercustomize.py").write_text(payload)
    (sub / "lm_eval.py").write_text(payload)  # (a package folder would make the model folder invalid)
    honest = score(task, assets, merged, tmp_path / "honest")
    report = score(task, assets, sub, tmp_path / "tampered")
    assert not marker.exists()
    assert report.valid and report.score == pytest.approx(honest.score)


def adapter_updates(assets: Path) -> dict:
    """{adapter: {base tensor name: its LoRA update}}, read with the starter's own reader."""
    sys.path.insert(0, str(tiny_llm_merging().start.starter))
    from merge import lora_deltas

    return {d.name: lora_deltas(d) for d in sorted((assets / "public" / "adapters").iterdir())}


def test_the_starter_reads_each_adapter_as_the_update_peft_merges_in_either_file_format(assets, tmp_path):
    """merge.py reads the adapters' two files itself (no peft import): each update is the one peft's
    own merge adds to the base, from safetensors and from an older peft's adapter_model.bin alike."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(tiny_llm_merging().start.starter))
    from merge import lora_deltas

    adapter = sorted((assets / "public" / "adapters").iterdir())[0]
    base = AutoModelForCausalLM.from_pretrained(assets / "public" / "base_model", dtype=torch.float32)
    before = {name: param.detach().clone() for name, param in base.named_parameters()}
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    by_peft = {
        name: param.detach() - before[name]
        for name, param in merged.named_parameters()
        if not torch.equal(param, before[name])
    }
    as_bin = tmp_path / "as-bin"
    as_bin.mkdir()
    shutil.copy(adapter / "adapter_config.json", as_bin)
    torch.save(load_file(adapter / "adapter_model.safetensors"), as_bin / "adapter_model.bin")
    for folder in (adapter, as_bin):
        updates = lora_deltas(folder)
        assert sorted(updates) == sorted(by_peft) and len(updates) >= 6
        for name, update in updates.items():
            torch.testing.assert_close(update, by_peft[name], rtol=1e-4, atol=1e-6)


def save_changed_base(assets: Path, out: Path, change) -> Path:
    """The base model with change(params) applied, saved as a submission."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(assets / "public" / "base_model", dtype=torch.float32)
    with torch.no_grad():
        change(model)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(assets / "public" / "base_model").save_pretrained(out)
    return out


def test_a_model_trained_instead_of_merged_is_invalid(task, assets, tmp_path):
    # Train the MLPs (where the adapters act) on the dev set: not a merge of the given models.
    import random

    from mlrb.task_kit.tiny_models import format_prompt, train_lm

    rows = [json.loads(line) for line in (assets / "public" / "dev.jsonl").read_text().splitlines()]
    pairs = [(format_prompt(r["question"]), " " + r["choices"][r["answer"]]) for r in rows]

    def train_mlps(model):
        from transformers import AutoTokenizer

        for name, param in model.named_parameters():
            param.requires_grad = ".mlp." in name
        with __import__("torch").enable_grad():
            tokenizer = AutoTokenizer.from_pretrained(assets / "public" / "base_model")
            train_lm(model, tokenizer, pairs, 30, 1e-3, 16, random.Random(0))

    report = score(task, assets, save_changed_base(assets, tmp_path / "trained", train_mlps), tmp_path)
    assert not report.valid
    assert "not a merge of the given models" in report.reason
    # Each MLP tensor: |cosine| 0.14-0.17 with the experts' span (a merge gives 0.5 or more).
    assert report.details["merge_check"]["tensors_below_min_cosine"] == 6
    assert report.details["merge_check"]["worst_cosine"] < 0.25


def test_a_model_with_a_tensor_no_adapter_touches_changed_is_invalid(task, assets, tmp_path):
    def add_noise(model):
        model.model.embed_tokens.weight.mul_(1.5)

    report = score(task, assets, save_changed_base(assets, tmp_path / "noisy", add_noise), tmp_path)
    assert not report.valid
    assert "tensors that no expert updates were changed (e.g. model.embed_tokens.weight" in report.reason


def test_a_dare_merge_counts_as_a_merge(task, assets, tmp_path):
    # DARE: drop 90% of each update's entries at random, rescale the rest, then average.
    import torch

    updates = adapter_updates(assets)

    def dare(model):
        params = dict(model.named_parameters())
        generator = torch.Generator().manual_seed(0)
        for deltas in updates.values():
            for name, delta in deltas.items():
                keep = (torch.rand(delta.shape, generator=generator) > 0.9).float()
                params[name] += 0.5 * delta * keep / 0.1

    report = score(task, assets, save_changed_base(assets, tmp_path / "dare", dare), tmp_path)
    assert report.valid, report.reason
    # Judged on the entries it keeps: |cosine| about 0.61 in each tensor (measured 0.60-0.62).
    cosines = report.details["merge_check"]["cosines_with_experts_updates"]
    assert len(cosines) == 6 and all(0.5 < c < 0.75 for c in cosines.values()), cosines


def test_a_ties_merge_counts_as_a_merge(task, assets, tmp_path):
    # TIES: trim each update to its top 20% magnitudes, elect each entry's sign by the summed
    # update, average the trimmed updates that agree with it (zero where none does).
    import torch

    updates = adapter_updates(assets)

    def ties(model):
        params = dict(model.named_parameters())
        for name in next(iter(updates.values())):
            trimmed = []
            for deltas in updates.values():
                delta = deltas[name].clone()
                delta[delta.abs() < delta.abs().quantile(0.8)] = 0
                trimmed.append(delta)
            stacked = torch.stack(trimmed)
            agree = (torch.sign(stacked) == torch.sign(stacked.sum(0))) & (stacked != 0)
            params[name] += (stacked * agree).sum(0) / agree.sum(0).clamp(min=1)

    report = score(task, assets, save_changed_base(assets, tmp_path / "ties", ties), tmp_path)
    assert report.valid, report.reason
    assert report.details["merge_check"]["worst_cosine"] > 0.75  # measured 0.85


def test_the_averaging_merge_plus_noise_is_not_a_merge(task, assets, tmp_path):
    # The review's case: averaging, plus Gaussian noise of 3x the merge's own change in every
    # tensor it touches. Pooled over tensors this gave |cosine| 0.317 and passed the old 0.25.
    import torch

    updates = adapter_updates(assets)
    generator = torch.Generator().manual_seed(0)

    def noisy_average(model):
        params = dict(model.named_parameters())
        for name in next(iter(updates.values())):
            change = sum(deltas[name] for deltas in updates.values()) / len(updates)
            noise = torch.randn(change.shape, generator=generator)
            params[name] += change + 3 * change.norm() * noise / noise.norm()

    report = score(task, assets, save_changed_base(assets, tmp_path / "noisy", noisy_average), tmp_path)
    assert not report.valid and report.score is None
    assert "is not a combination of the experts' updates (worst model.layers." in report.reason
    check = report.details["merge_check"]
    assert check["tensors_below_min_cosine"] == 6  # each tensor: 1/sqrt(1 + 3^2) = 0.32
    assert 0.25 < check["worst_cosine"] < 0.4
    assert f"|cosine| {check['worst_cosine']:.3f}" in report.reason and check["worst_tensor"] in report.reason


def test_an_untouched_tensor_may_change_by_rounding_only(task, assets, merged, tmp_path):
    # 1e-3 of each entry: far beyond FP32 rounding (the base's dtype), twice FP16's, well under
    # the 1% of the tensor's norm the old check allowed.
    def nudge(model):
        model.model.norm.weight.mul_(1 + 1e-3)

    report = score(task, assets, save_changed_base(assets, tmp_path / "nudged", nudge), tmp_path / "scored_nudged")
    assert not report.valid
    assert "tensors that no expert updates were changed (e.g. model.norm.weight: 64 of 64 entries" in report.reason
    # The baseline merge re-saved in FP16: every tensor rounded, and still a merge.
    import torch
    from transformers import AutoModelForCausalLM

    fp16 = tmp_path / "fp16"
    AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float16).save_pretrained(fp16)
    for path in merged.glob("tokenizer*"):
        shutil.copy(path, fp16)
    assert {t.dtype for t in weight_stats(fp16).tensors} == {"F16"}
    report = score(task, assets, fp16, tmp_path / "scored_fp16")
    assert report.valid, report.reason
    assert report.details["merge_check"]["worst_cosine"] > 0.99


def test_a_reference_that_does_not_beat_the_baseline_gives_no_normalised_score(tmp_path):
    # As at full scale when the best single expert scores below averaging.
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "calibration.json").write_text(json.dumps({"baseline_score": 0.5, "reference_score": 0.45}))
    assert tiny_llm_merging().anchors.read(tmp_path) == {
        "do_nothing_score": None,
        "baseline_score": 0.5,
        "reference_score": None,
    }
    (tmp_path / "hidden" / "calibration.json").write_text(json.dumps({"baseline_score": 0.5, "reference_score": 0.6}))
    assert tiny_llm_merging().anchors.read(tmp_path) == {
        "do_nothing_score": None,
        "baseline_score": 0.5,
        "reference_score": 0.6,
    }
