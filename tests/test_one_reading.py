"""One reading of a submission (mlrb/tasks/model_checks.py): the rule checks read exactly the weights the
scorer evaluates, and the settings a limit is measured at are the task's, not the submission's.

Each task's real scorer, in its bwrap sandbox, is handed a folder that shows the checks the task's
own baseline submission (a weights file at the top) while a shard index points transformers at
other weights: it must refuse it. On a harness that read the top-level files for its checks, the
scorer evaluated the other model. These run on the tasks' plumbing assets (the tiny scale's models,
built in seconds); the memory limit's test needs the tiny scale's calibrated limit (system tier)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import task_from_config
from mlrb.core.config import SandboxConfig
from mlrb.harness.assets import ensure_assets
from mlrb.harness.control import control_submission
from mlrb.scoring.runner import score_submission
from mlrb.tasks import model_checks

# Every task whose submission is a model folder (math_reasoning's is a file of Lean proofs).
MODEL_TASKS = ["llm_merging", "llm_efficiency", "edge_llm_compression", "baby_lm", "mini_pile", "edge_llm_training"]


def two_models_in_one(shown: Path, dest: Path, hidden_dir: str | None = None) -> Path:
    """A copy of SHOWN whose weights file the checks of a top-level glob read, while its shard
    index sends transformers to other weights (SHOWN's, scaled): beside it, or in HIDDEN_DIR."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(shown, dest)
    tensors = load_file(dest / "model.safetensors")
    (dest / "model.safetensors").rename(dest / "shown.safetensors")
    other = f"{hidden_dir}/other.safetensors" if hidden_dir else "other.safetensors"
    (dest / other).parent.mkdir(exist_ok=True)
    save_file({name: t * 1.5 for name, t in tensors.items()}, dest / other, metadata={"format": "pt"})
    (dest / model_checks.WEIGHTS_INDEX).write_text(
        json.dumps({"metadata": {}, "weight_map": dict.fromkeys(tensors, other)})
    )
    return dest


@pytest.mark.integration
@pytest.mark.parametrize("task_name", MODEL_TASKS)
def test_the_checks_and_the_scorer_cannot_be_handed_different_weights(task_name, cache_dir, tmp_path):
    task = task_from_config(task_name, scale="plumbing")
    assets = ensure_assets(task, cache_dir)
    honest = control_submission(task, assets)  # the task's baseline submission: it passes every check
    submission = two_models_in_one(honest, tmp_path / "submission")
    report = score_submission(task, submission, assets, tmp_path / "scoring", SandboxConfig())
    assert not report.valid, report
    assert report.reason == (
        f"weights {model_checks.WEIGHTS_INDEX} does not name (shown.safetensors), which transformers would not load"
    )


@pytest.mark.integration
def test_what_else_could_point_the_scorer_elsewhere_is_refused_and_an_honest_sharded_model_is_not(
    cache_dir, tmp_path
):  # fmt: skip
    task = task_from_config("llm_merging", scale="plumbing")
    honest = control_submission(task, ensure_assets(task, cache_dir))
    in_a_folder = two_models_in_one(honest, tmp_path / "in_a_folder", hidden_dir="weights")
    assert "holds a folder (weights/)" in model_checks.one_reading_problem(in_a_folder)

    adapter = tmp_path / "adapter"
    shutil.copytree(honest, adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "x"}))
    assert "adapter_config.json, which makes transformers load a model from elsewhere" in (
        model_checks.one_reading_problem(adapter)
    )

    beside = tmp_path / "beside"
    shutil.copytree(honest, beside)
    shutil.copyfile(honest / "model.safetensors", beside / "approved.safetensors")
    assert model_checks.one_reading_problem(beside) == (
        "weights beside model.safetensors (approved.safetensors) that transformers would not load"
    )

    # The positive control: the same model saved in shards, as save_pretrained writes a large one.
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "sharded"
    shutil.copytree(honest, sharded)
    (sharded / "model.safetensors").unlink()
    AutoModelForCausalLM.from_pretrained(honest).save_pretrained(sharded, max_shard_size="100KB")
    assert len(model_checks.weight_files(sharded)[0]) > 1
    assert model_checks.one_reading_problem(sharded) == "" and model_checks.check_loadable(sharded) == ""


@pytest.mark.system
def test_a_memory_limit_is_measured_at_the_task_s_settings_not_the_submission_s(cache_dir, tmp_path):
    """edge_llm_compression: the untouched base model fails the memory limit (doing nothing); one
    flag in its config.json (no key-value cache) took it under the limit with the reference's
    accuracy. The scorer now sets what a limit measures itself; the reference still passes.
    At tiny scale: the limit is calibrated there (at plumbing scale, with its 32 test rows, the
    untouched base model stays under it)."""
    task = task_from_config("edge_llm_compression")
    assets = ensure_assets(task, cache_dir)
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    assert "exceeds the limit" in calibration["do_nothing_invalid"] and calibration["reference_score"] is not None

    flagged = tmp_path / "submission"
    shutil.copytree(assets / "public" / "base_model", flagged)
    config = json.loads((flagged / "config.json").read_text())
    config.update(use_cache=False, attn_implementation="eager", output_hidden_states=False)
    (flagged / "config.json").write_text(json.dumps(config))
    report = score_submission(task, flagged, assets, tmp_path / "scoring", SandboxConfig())
    assert not report.valid and "during evaluation exceeds the limit" in report.reason, report.reason
