"""The llm_efficiency task at tiny scale: a whole baseline run through the CLI, and each
rule broken once against the scorer directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import baseline_run, task_from_config
from mlrb.tasks import model_checks


def load_task(**overrides):
    return task_from_config("llm_efficiency", **overrides)


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    from mlrb.harness.assets import ensure_assets

    return ensure_assets(load_task(), cache_dir)


BASE, INSTRUCT = "mlrb/tiny-llama-base", "mlrb/tiny-llama-base-instruct"


def model_copy(assets: Path, name: str, tmp_path: Path, declared) -> Path:
    sub = tmp_path / "submission"
    shutil.copytree(assets / "public" / "models" / name.replace("/", "__"), sub)
    if declared is not None:
        (sub / "provenance.json").write_text(json.dumps({"base_model": declared}))
    return sub


# ---- rules without assets ------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    "name, instruction_tuned",
    [
        ("meta-llama/Llama-2-7b-chat-hf", True),
        ("mistralai/Mistral-7B-Instruct-v0.1", True),
        ("google/gemma-7b-it", True),
        ("mistralai/Mistral-7B-v0.1", False),
        ("EleutherAI/pythia-1b", False),
        ("meta-llama/Llama-2-7b-hf", False),
    ],
)
def test_instruction_tuned_names_are_recognised(name, instruction_tuned):
    assert model_checks.looks_instruction_tuned(name) is instruction_tuned


@pytest.mark.fast
def test_the_base_model_rule_reads_the_approved_patterns():
    allowed = ["meta-llama/Llama-2-*-hf", "EleutherAI/pythia-*"]
    assert model_checks.check_base_model("EleutherAI/pythia-410m", allowed, []) == ""
    assert "instruction-tuned" in model_checks.check_base_model("meta-llama/Llama-2-7b-chat-hf", allowed, [])
    assert "not an allowed base model" in model_checks.check_base_model("gpt2", allowed, [])
    assert "does not declare" in model_checks.check_base_model(None, allowed, [])


# ---- the tiny world, without a build ---------------------------------------------


@pytest.mark.fast
def test_each_question_offers_the_subjects_other_attribute_as_a_wrong_choice():
    import random

    from mlrb.tasks.llm_efficiency import assets as build

    rng = random.Random(0)
    world = build.make_world(rng, list(build.SKILLS), n_subjects=30, n_answers=12)
    for skill, subjects in world.items():
        pool = sorted({a for _, values in subjects for a in values})
        assert len(pool) <= 12  # subjects share the answers, so no answer names its subject
        rows = build._questions(rng, skill, subjects, pool)
        assert len(rows) == 2 * len(subjects)  # every subject is asked both attributes, in order
        for k, (subject, values) in enumerate(subjects):
            for index in (0, 1):
                row = rows[2 * k + index]
                assert row["question"] == build.SKILLS[skill]["attributes"][index]["question"].format(s=subject)
                assert row["choices"][row["answer"]] == values[index]
                assert values[1 - index] in row["choices"] and len(set(row["choices"])) == 4


@pytest.mark.fast
def test_the_web_text_states_facts_but_never_asks_about_one():
    import random

    from mlrb.tasks.llm_efficiency import assets as build

    rng = random.Random(1)
    world = build.make_world(rng, list(build.SKILLS), n_subjects=10, n_answers=8)
    texts = build._web_text(rng, world, 2000)
    questions = [a["question"].split("{s}")[0] for spec in build.SKILLS.values() for a in spec["attributes"]]
    assert not any(q in text for q in questions for text in texts)
    subject, (capital, _) = world["geography"][0]
    stated = " ".join(texts)
    assert f"The capital of {subject} is {capital}." in stated or f"{capital} is the capital of {subject}." in stated


# ---- the task ------------------------------------------------------------------


@pytest.mark.system
def test_assets_keep_the_test_set_hidden_and_offer_both_models(assets):
    public = {p.relative_to(assets / "public").as_posix() for p in (assets / "public").rglob("*")}
    assert {"instructions.jsonl", "dev.jsonl", "models/mlrb__tiny-llama-base/config.json"} <= public
    assert "models/mlrb__tiny-llama-base-instruct/config.json" in public
    assert not any("test" in p for p in public)
    # The instruction data asks about other facts than the test, each in several wordings.
    instructions = [json.loads(line) for line in (assets / "public" / "instructions.jsonl").read_text().splitlines()]
    tested = [json.loads(line)["question"] for line in (assets / "hidden" / "test.jsonl").read_text().splitlines()]
    assert len(instructions) == 2560 and len({row["instruction"] for row in instructions}) == 2560
    assert len(tested) == 960
    shape = load_task().spec.prompt.dataset_shape  # what the agent is told
    dev = (assets / "public" / "dev.jsonl").read_text().splitlines()
    assert f"instructions: {len(instructions)} rows" in shape and f"dev: {len(dev)} rows" in shape
    assert f"hidden test: {len(tested)} rows" in shape
    assert not any(question in row["instruction"] for question in tested for row in instructions)
    # The untouched base answers near a third (it recalls the subject's attributes, not which
    # was asked); the baseline's one epoch of Dolly-layout LoRA helps, the reference much more.
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert calibration["do_nothing_score"] < 0.45
    assert calibration["baseline_score"] > calibration["do_nothing_score"] + 0.2
    assert calibration["reference_score"] > calibration["baseline_score"] + 0.1


@pytest.mark.system
def test_baseline_run_is_recorded_with_its_score(tmp_path, cache_dir, assets):
    metrics = baseline_run("llm_efficiency", tmp_path, cache_dir).data.metrics
    assert metrics["reference_score"] > metrics["baseline_score"]
    # The baseline's LoRA moves the weights by a fraction of their norm (0.3 at its high rate).
    assert 0 < metrics["weight_distance_to_base"] < 0.5
    assert {"score.geography", "score.zoology"} <= set(metrics)


@pytest.mark.system
@pytest.mark.parametrize(
    "model, declared, reason",
    [
        (INSTRUCT, INSTRUCT, "is an instruction-tuned model; only base models are allowed"),
        (INSTRUCT, BASE, "derive from the instruction-tuned mlrb/tiny-llama-base-instruct"),
        (BASE, None, "does not declare its base model"),
        (BASE, "EleutherAI/pythia-1b", "is not an allowed base model"),
    ],
)
def test_base_model_rule_breakers_are_invalid(assets, tmp_path, model, declared, reason):
    report = load_task().judge.score(model_copy(assets, model, tmp_path, declared), assets, tmp_path / "work")
    assert not report.valid and report.score is None
    assert reason in report.reason


@pytest.mark.system
def test_weights_of_another_architecture_do_not_pass_as_the_base(assets, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    sub = tmp_path / "submission"
    tokenizer = AutoTokenizer.from_pretrained(assets / "public" / "models" / "mlrb__tiny-llama-base")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(sub)
    tokenizer.save_pretrained(sub)
    (sub / "provenance.json").write_text(json.dumps({"base_model": BASE}))
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and "do not derive from mlrb/tiny-llama-base" in report.reason


@pytest.mark.system
def test_empty_and_oversized_submissions_are_invalid(assets, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "config.json is missing" in load_task().judge.score(tmp_path / "empty", assets, tmp_path / "w").reason
    big = load_task(max_params=1000).judge.score(model_copy(assets, BASE, tmp_path, BASE), assets, tmp_path / "w2")
    assert not big.valid and "exceed the limit of 1,000" in big.reason


def moved_toward_sibling(assets, tmp_path, share_of):
    """A submission of the base with each tensor moved `share_of(name)` of the way toward the
    instruction-tuned sibling (0: the base's, 1: the sibling's), declaring the base."""
    import torch
    from transformers import AutoModelForCausalLM

    models = assets / "public" / "models"
    sub = model_copy(assets, BASE, tmp_path, BASE)
    moved = AutoModelForCausalLM.from_pretrained(models / "mlrb__tiny-llama-base", dtype=torch.float32)
    sibling = dict(AutoModelForCausalLM.from_pretrained(models / "mlrb__tiny-llama-base-instruct").named_parameters())
    with torch.no_grad():
        for name, param in moved.named_parameters():
            param += share_of(name) * (sibling[name] - param)
    moved.save_pretrained(sub, safe_serialization=True)
    return sub


@pytest.mark.system
@pytest.mark.parametrize("share", [0.49, 0.25])
def test_a_blend_toward_the_instruction_tuned_sibling_is_invalid(assets, tmp_path, share):
    # base + share * (sibling - base) lies nearer the base than the sibling, yet carries its tuning.
    sub = moved_toward_sibling(assets, tmp_path, lambda name: share)
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and report.score is None
    assert f"lie {share:.0%} of the way from mlrb/tiny-llama-base to it" in report.reason
    assert report.details["lineage"]["share_toward"][INSTRUCT] == pytest.approx(share, abs=1e-3)


@pytest.mark.system
def test_the_siblings_update_copied_into_a_few_tensors_is_invalid(assets, tmp_path):
    # The sibling's update copied whole into layer 0's attention: under 10% of the way over all
    # tensors, so the blend check alone passes it, but those tensors are the sibling's.
    sub = moved_toward_sibling(assets, tmp_path, lambda name: float(name.startswith("model.layers.0.self_attn.")))
    report = load_task().judge.score(sub, assets, tmp_path / "work")
    assert not report.valid and report.score is None
    overall = report.details["lineage"]["share_toward"][INSTRUCT]
    assert 0 < overall < load_task().spec.max_share_toward_instruction_tuned
    tensor, share = report.details["lineage"]["worst_tensor_toward"][INSTRUCT]
    assert tensor.startswith("model.layers.0.self_attn.") and share == pytest.approx(1.0, abs=1e-3)
    assert f"tensor {tensor} carries the instruction-tuned {INSTRUCT}'s update" in report.reason


@pytest.mark.system
def test_honest_fine_tunes_lie_well_inside_the_limit_toward_the_sibling(assets):
    # Measured at asset build on the baseline's and the reference's own submissions: a few
    # percent of the way (the reference, fine-tuned on the same kind of data, the most).
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    spec = load_task().spec
    for anchor in ("baseline", "reference"):
        assert (
            abs(calibration[f"{anchor}.weight_share_toward.{INSTRUCT}"]) < 0.7 * spec.max_share_toward_instruction_tuned
        ), anchor
        # and in each tensor, well nearer the base than the sibling
        worst = calibration[f"{anchor}.weight_max_tensor_share_toward.{INSTRUCT}"]
        assert worst < 0.8 * spec.max_tensor_share_toward_instruction_tuned, anchor
