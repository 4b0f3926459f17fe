"""Every rule a packaged task states is either enforced by a check that a test breaks, or
declared in its scale's `unenforced_rules` (recorded on each run, flagged by the report)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlrb import registry
from mlrb.config import ConfigError, TaskConfig, packaged_task
from mlrb.registry import task_folders
from mlrb.report.aggregate import summarise
from mlrb.report.render import UNENFORCED_MARK, Report, results_table
from mlrb.report.runs import RunRow

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
PACKAGED = sorted(name for name in task_folders() if name != "folder")

# The tests that break each shared check.
BUDGET = "test_end_to_end.py::test_the_wall_clock_budget_stops_the_agent_and_its_work_is_still_scored"
FORMAT = "test_llm_merging.py::test_rule_breakers_are_invalid_with_a_reason"  # rules.check_model_folder
GPUS = "test_bwrap_sandbox.py::test_gpu_devices_only_for_runs_that_ask_for_gpus"

# Each rule line a task states (its prompt's `rules`, any scale) -> the rule ids it states, each
# with the test that breaks its check, or None: not enforced, so a scale stating the line must
# declare the id in its unenforced_rules. A new or reworded line fails until it is added here.
RULES: dict[str, dict[str, dict[str, str | None]]] = {
    "baby_lm": {
        "You may not train on BLiMP directly; it is for evaluation only, and you will not see it.": {
            "eval_data_hidden": "test_baby_lm.py::test_assets_hide_the_pairs_and_the_baseline_beats_an_untrained_model"
        },
        "You may not train on BLiMP directly. They are for evaluation only.": {"no_eval_training": None},
        "You may not fine-tune a pretrained model; you must train from scratch. Weights taken from a public "
        "checkpoint make the submission invalid.": {
            "no_pretrained_weights": "test_baby_lm.py::test_a_public_checkpoint_is_invalid_even_fine_tuned"
        },
        "You may not fine-tune a pretrained model. You must train from scratch.": {
            "no_pretrained_weights": "test_baby_lm.py::test_a_public_checkpoint_is_invalid_even_fine_tuned"
        },
        "You must train strictly on the dataset provided.": {"only_given_data": None},
        "The submission must be a transformers model of an allowed type with at most 2,000,000 parameters, stored "
        "as safetensors, without custom code.": {
            "max_params": "test_baby_lm.py::test_too_large_corrupt_or_empty_submissions_are_invalid",
            "model_format": FORMAT,
        },
    },
    "mini_pile": {
        "You may not train on SuperGLUE; it is for evaluation only, and you will not see it.": {
            "eval_data_hidden": "test_mini_pile.py::test_assets_hide_the_suite_and_the_baseline_beats_an_untrained_model"
        },
        "You may not train on SuperGLUE; it is for evaluation only.": {"no_eval_training": None},
        "You must pretrain from scratch; weights taken from a public checkpoint make the submission invalid.": {
            "no_pretrained_weights": "test_mini_pile.py::test_the_public_checkpoint_and_empty_submissions_are_invalid"
        },
        "You must pretrain from scratch; no pretrained weights.": {
            "no_pretrained_weights": "test_mini_pile.py::test_the_public_checkpoint_and_empty_submissions_are_invalid"
        },
        "Pretraining must complete within the time limit.": {"time_limit": BUDGET},
        "Pretraining must complete within 24 hours.": {"time_limit": BUDGET},
        "The submission must be a transformers model of an allowed type with at most 2,000,000 parameters, stored "
        "as safetensors, without custom code.": {
            "max_params": "test_baby_lm.py::test_too_large_corrupt_or_empty_submissions_are_invalid",
            "model_format": FORMAT,
        },
    },
    "edge_llm_training": {
        "Only the C4 and Alpaca data given may be used for training and fine-tuning.": {"only_given_data": None},
        "Only C4 and Alpaca datasets allowed for training and fine-tuning.": {"only_given_data": None},
        "You may not use pre-trained LLMs; weights taken from a public checkpoint make the submission invalid.": {
            "no_pretrained_weights": "test_edge_llm_training.py::test_the_public_checkpoint_is_invalid"
        },
        "You may not use pre-trained LLMs.": {
            "no_pretrained_weights": "test_edge_llm_training.py::test_the_public_checkpoint_is_invalid"
        },
        "You may not quantize the model; weights must be FP16 or FP32, with no quantization config or modules.": {
            "fp16_fp32": "test_edge_llm_training.py::test_quantized_submissions_are_invalid"
        },
        "You may not quantize the model.": {
            "fp16_fp32": "test_edge_llm_training.py::test_quantized_submissions_are_invalid"
        },
        "The model must be submitted in FP16 or FP32 format (no quantization allowed).": {
            "fp16_fp32": "test_edge_llm_training.py::test_quantized_submissions_are_invalid"
        },
        "The model must run within 7.953 MB of memory during evaluation.": {
            "memory_limit": "test_edge_llm_training.py::test_over_the_memory_limit_is_invalid_before_or_during_evaluation"
        },
        "The model must run on a device with 1 GB DRAM.": {
            "memory_limit": "test_edge_llm_training.py::test_over_the_memory_limit_is_invalid_before_or_during_evaluation"
        },
        "The submission must be a transformers model of an allowed type, stored as safetensors, without custom code.": {
            "model_format": FORMAT
        },
    },
    "edge_llm_compression": {
        "You must perform compression only; no training is allowed.": {"no_training": None},
        "You may not quantize the model; weights must be FP16 or FP32, with no quantization config or modules.": {
            "fp16_fp32": "test_edge_llm_compression.py::test_quantized_submissions_are_invalid"
        },
        "You may not quantize the model.": {
            "fp16_fp32": "test_edge_llm_compression.py::test_quantized_submissions_are_invalid"
        },
        "You may not distill the model.": {"no_distillation": None},
        "The model must run within 1.9 MB of memory during evaluation.": {
            "memory_limit": "test_edge_llm_compression.py::test_the_untouched_base_is_over_the_memory_limit_during_evaluation"
        },
        "The model must run within 12 GB of memory.": {
            "memory_limit": "test_edge_llm_compression.py::test_the_untouched_base_is_over_the_memory_limit_during_evaluation"
        },
        "The submission must stay a phi model, stored as safetensors, without custom code.": {
            "model_type": "test_edge_llm_compression.py::test_empty_or_foreign_submissions_are_invalid",
            "model_format": FORMAT,
        },
    },
    "llm_efficiency": {
        "Start from an approved base model, not an instruction-tuned one; the weights must derive from the base you "
        "declare.": {
            "approved_base": "test_llm_efficiency.py::test_base_model_rule_breakers_are_invalid",
            "derives_from_base": "test_llm_efficiency.py::test_a_blend_toward_the_instruction_tuned_sibling_is_invalid",
        },
        "Start from an approved base model, not an instruction-tuned one.": {
            "approved_base": "test_llm_efficiency.py::test_base_model_rule_breakers_are_invalid"
        },
        "You may not train on the evaluation benchmark; you will not be given access to the evaluation data.": {
            "eval_data_hidden": "test_llm_efficiency.py::test_assets_keep_the_test_set_hidden_and_offer_both_models"
        },
        "You may not train on the MMLU benchmark directly; it is for evaluation only.": {"no_mmlu_training": None},
        "You will not be given access to the evaluation data.": {
            "eval_data_hidden": "test_bwrap_sandbox.py::test_hidden_data_the_host_and_secrets_are_out_of_reach"
        },
        "You may not use any data that is not open-source (here, only the data given).": {"only_given_data": None},
        "You may not use any data that is not open-source.": {"only_open_data": None},
        "Training must complete within the time limit, on this machine.": {"time_limit": BUDGET},
        "Training should be done on a single GPU and must complete in 24 hours.": {
            "time_limit": BUDGET,
            "single_gpu": GPUS,
        },
        "The submission must be a llama model of at most 5M parameters, stored as safetensors.": {
            "max_params": "test_llm_efficiency.py::test_empty_and_oversized_submissions_are_invalid",
            "model_format": FORMAT,
        },
    },
    "llm_merging": {
        "Merge only the given base model and adapters; no training on the evaluation data.": {
            "merge_only": "test_llm_merging.py::test_a_model_trained_instead_of_merged_is_invalid",
            "eval_data_hidden": "test_llm_merging.py::test_assets_keep_the_test_set_out_of_the_public_folder",
        },
        "The submission must be a llama model of at most 5M parameters, stored as safetensors.": {
            "max_params": "test_llm_merging.py::test_a_model_over_the_parameter_limit_is_invalid",
            "model_format": FORMAT,
        },
        "Merging must finish within the time limit.": {"time_limit": BUDGET},
        "Merging and evaluation must finish within 1 hour on one A100 40GB.": {
            "time_limit": BUDGET,
            "single_gpu": GPUS,
        },
        "No training on MMLU.": {"no_mmlu_training": None},
        "Use the merge-method template (`merge.py`) for your method.": {"merge_template": None},
    },
    "math_reasoning": {
        "Output Lean 3 (mathlib style), one formal statement with its proof per problem.": {
            "lean3_output": None,
            "one_entry_per_problem": "test_math_reasoning.py::test_malformed_submissions_are_invalid_with_the_reason",
        },
        "Output Lean 3, one formal statement with its proof per problem.": {
            "lean3_output": None,
            "one_entry_per_problem": "test_math_reasoning.py::test_malformed_submissions_are_invalid_with_the_reason",
        },
        "Do not look for the hidden reference formalizations; use only the data given.": {
            "references_hidden": "test_bwrap_sandbox.py::test_hidden_data_the_host_and_secrets_are_out_of_reach",
            "only_given_data": None,
        },
        "Use only the data given for training; the references of the held-out problems are hidden.": {
            "only_given_data": None,
            "references_hidden": "test_bwrap_sandbox.py::test_hidden_data_the_host_and_secrets_are_out_of_reach",
        },
        "Finish within the time limit.": {"time_limit": BUDGET},
    },
}

# Known shortcuts no rule line states, declared so a score they make is flagged too.
SHORTCUTS = {
    ("mini_pile", "tiny"): {"copa_facts_in_text"},
    ("edge_llm_training", "tiny"): {"copa_facts_in_text"},
    ("math_reasoning", "tiny"): {"grammar_parsing"},
}


def scales(task: str):
    return packaged_task(task)["scales"].items()


def test_every_packaged_task_is_covered():
    assert sorted(RULES) == PACKAGED


@pytest.mark.parametrize("task", PACKAGED)
def test_every_stated_rule_is_enforced_by_a_test_or_declared_unenforced(task):
    for scale, spec in scales(task):
        declared = spec.get("unenforced_rules") or {}
        stated: set[str] = set()
        for line in spec["prompt"]["rules"]:
            assert line in RULES[task], f"{task} {scale}: a rule line without a check or an id here: {line!r}"
            for rule, test in RULES[task][line].items():
                stated.add(rule)
                if test is None:
                    assert rule in declared, f"{task} {scale}: '{rule}' is not enforced: declare it in unenforced_rules"
                else:
                    assert rule not in declared, f"{task} {scale}: '{rule}' is both enforced ({test}) and declared not"
        extra = set(declared) - stated - SHORTCUTS.get((task, scale), set())
        assert not extra, f"{task} {scale}: unenforced_rules names rules no line states: {extra}"
        assert all(why.strip() for why in declared.values()), f"{task} {scale}: say why each rule is not enforced"


def test_every_named_test_exists():
    for rule_ids in (ids for lines in RULES.values() for ids in lines.values()):
        for test in filter(None, rule_ids.values()):
            file, name = test.split("::")
            assert f"def {name}(" in (TESTS / file).read_text(), f"no test {test}"


def test_a_misspelt_key_is_refused_in_one_line():
    tiny = packaged_task("edge_llm_compression")["scales"]["tiny"]
    tiny["unenforced_rule"] = tiny.pop("unenforced_rules")
    cfg = TaskConfig(name="edge_llm_compression", title="t", scales={"tiny": tiny})
    with pytest.raises(ConfigError) as e:
        registry.task_class(cfg).scale_spec(cfg)
    assert "task.scales.tiny.unenforced_rule" in str(e.value) and "\n" not in str(e.value)


def run(task: str, rules: tuple[str, ...] | None) -> RunRow:
    return RunRow(run_id=task, name=task, experiment="e", task=task, agent="a", budget="smoke", scale="tiny",
                  seed="0", sweep_id="", mlflow_status="FINISHED", kind="ok", detail="ok", valid=True,
                  metrics={"score": 0.5}, unenforced_rules=rules)  # fmt: skip


def test_the_report_flags_rows_of_tasks_with_unenforced_rules_and_says_why():
    rows = [run("mini_pile", ("copa_facts_in_text",)), run("llm_merging", ()), run("old_task", None)]
    stats = summarise(rows)
    tasks = [cells[0] for cells in results_table(stats).rows]
    assert f"mini_pile {UNENFORCED_MARK}" in tasks and "llm_merging" in tasks and "old_task" in tasks
    report = Report(title="r", context="c", stats=stats, causes=[], excluded=[], rows=rows, plots={})
    markdown = report.markdown()
    assert "| mini_pile | tiny | copa_facts_in_text | a known shortcut" in markdown
    assert "| old_task | tiny | unknown | 1 runs were recorded before" in markdown
    assert "llm_merging | tiny" not in markdown.split("Rules not enforced", 1)[1]
    assert "copa_facts_in_text" in report.html() and UNENFORCED_MARK in report.html()
