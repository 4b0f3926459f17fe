"""Every rule a packaged task states is either enforced by a check that a test breaks, or
declared in its scale's `unenforced_rules` (recorded on each run, flagged by the report).

A rule counts as enforced only where a test breaks that rule's own check: the test breaks the
rule and asserts the refusal, in words the check itself writes (or, for what the sandbox hides,
the kernel's answer to a read that the same test shows succeeding unconfined), and the task's
scorer runs that check. A test that merely exists, or shows something else, is no proof."""

from __future__ import annotations

import ast
import errno
import importlib
import inspect
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import tasks_hook
from mlrb.core import registry
from mlrb.core.config import ConfigError, TaskConfig, packaged_task
from mlrb.core.registry import folder_loaders, task_folders
from mlrb.report.aggregate import summarise
from mlrb.report.render import UNENFORCED_MARK, Report, results_table
from mlrb.report.runs import RunRow

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
TASKS = Path(registry.__file__).resolve().parents[1] / "tasks"
PACKAGED = sorted(set(task_folders()) - folder_loaders())
# The refusal is the kernel's (an errno), answering a read of what the sandbox does not mount.
KERNEL = "kernel"


@dataclass(frozen=True)
class Breaks:
    """`test` ("file::name") breaks a rule and asserts its refusal: each of `says`, a piece of
    the refusal as `check` ("module:function", or KERNEL) writes it."""

    test: str
    says: tuple[str, ...]
    check: str


# The tests that break each shared check.
BUDGET = Breaks(
    "test_end_to_end.py::test_the_wall_clock_budget_stops_the_agent_and_its_work_is_still_scored",
    ("wall_time",), "mlrb.core.budget:Budget.exhausted",
)  # fmt: skip
FORMAT = Breaks(
    "test_llm_merging.py::test_rule_breakers_are_invalid_with_a_reason",
    ("pickled weights are not accepted", "' is not allowed", "custom code"), "mlrb.tasks.model_checks:check_model_folder",
)  # fmt: skip
# The sandbox keeps every task's hidden/ folder out of the agent's reach alike: an agent that
# reads the hidden set by path, name or content finds nothing (each read shown to work unconfined).
HIDDEN = Breaks(
    "test_confinement.py::test_a_claude_agent_that_tries_every_escape_gets_nowhere",
    ("No such file or directory",),
    KERNEL,
)


# The default sandbox binds the device nodes of the run's own GPUs only: an agent given one that
# reaches for the node's others finds no such device (the same reads shown to work unconfined).
SINGLE_GPU = Breaks(
    "test_sandbox_gpus.py::test_an_agent_given_one_gpu_that_reaches_for_the_others_finds_no_such_device",
    ("No such file or directory",),
    KERNEL,
)


def params(test: str) -> Breaks:
    return Breaks(test, ("exceed the limit of",), "mlrb.tasks.model_checks:check_model_folder")


def pretrained(test: str) -> Breaks:
    return Breaks(test, ("pretrained weights",), "mlrb.tasks.model_checks:check_not_known_checkpoint")


def fp16_fp32(test: str) -> Breaks:
    return Breaks(test, ("weights stored as", "the model is quantized"), "mlrb.tasks.model_checks:check_fp16_fp32")


EDGE_TRAINING_MEMORY = Breaks(
    "test_edge_llm_training.py::test_over_the_memory_limit_is_invalid_before_or_during_evaluation",
    ("the weights alone take", "during evaluation exceeds the limit"),
    "mlrb.tasks.from_scratch.task:FromScratch.score",
)  # fmt: skip
EDGE_COMPRESSION_MEMORY = Breaks(
    "test_edge_llm_compression.py::test_the_untouched_base_is_over_the_memory_limit_during_evaluation",
    ("during evaluation exceeds the limit of",), "mlrb.tasks.edge_llm_compression.task:EdgeLlmCompression.score",
)  # fmt: skip
APPROVED_BASE = Breaks(
    "test_llm_efficiency.py::test_base_model_rule_breakers_are_invalid",
    ("is an instruction-tuned model; only base models are allowed", "is not an allowed base model",
     "does not declare its base model"), "mlrb.tasks.model_checks:check_base_model",
)  # fmt: skip
ONE_ENTRY = Breaks(
    "test_math_reasoning.py::test_malformed_submissions_are_invalid_with_the_reason",
    ("problems have no entry", "repeats the problem", "names an unknown problem"),
    "mlrb.tasks.math_reasoning.task:parse_submission",
)  # fmt: skip

# Each rule line a task states (its prompt's `rules`, any scale) -> the rule ids it states, each
# with the test that breaks its check, or None: not enforced, so a scale stating the line must
# declare the id in its unenforced_rules. A new or reworded line fails until it is added here.
RULES: dict[str, dict[str, dict[str, Breaks | None]]] = {
    "baby_lm": {
        "You may not train on BLiMP directly; it is for evaluation only, and you will not see it.": {
            "eval_data_hidden": HIDDEN
        },
        "You may not train on BLiMP directly. They are for evaluation only.": {"no_eval_training": None},
        "You may not fine-tune a pretrained model; you must train from scratch. Weights taken from a public "
        "checkpoint make the submission invalid.": {
            "no_pretrained_weights": pretrained("test_baby_lm.py::test_a_public_checkpoint_is_invalid_even_fine_tuned")
        },
        "You may not fine-tune a pretrained model. You must train from scratch.": {
            "no_pretrained_weights": pretrained("test_baby_lm.py::test_a_public_checkpoint_is_invalid_even_fine_tuned")
        },
        "You must train strictly on the dataset provided.": {"only_given_data": None},
        "The submission must be a transformers model of an allowed type with at most 2,000,000 parameters, stored "
        "as safetensors, without custom code.": {
            "max_params": params("test_baby_lm.py::test_too_large_corrupt_or_empty_submissions_are_invalid"),
            "model_format": FORMAT,
        },
    },
    "mini_pile": {
        "You may not train on SuperGLUE; it is for evaluation only, and you will not see it.": {
            "eval_data_hidden": HIDDEN
        },
        "You may not train on SuperGLUE; it is for evaluation only.": {"no_eval_training": None},
        "You must pretrain from scratch; weights taken from a public checkpoint make the submission invalid.": {
            "no_pretrained_weights": pretrained(
                "test_mini_pile.py::test_the_public_checkpoint_and_empty_submissions_are_invalid"
            )
        },
        "You must pretrain from scratch; no pretrained weights.": {
            "no_pretrained_weights": pretrained(
                "test_mini_pile.py::test_the_public_checkpoint_and_empty_submissions_are_invalid"
            )
        },
        "Pretraining must complete within the time limit.": {"time_limit": BUDGET},
        "Pretraining must complete within 24 hours.": {"time_limit": BUDGET},
        "The submission must be a transformers model of an allowed type with at most 2,000,000 parameters, stored "
        "as safetensors, without custom code.": {
            "max_params": params("test_baby_lm.py::test_too_large_corrupt_or_empty_submissions_are_invalid"),
            "model_format": FORMAT,
        },
    },
    "edge_llm_training": {
        "Only the C4 and Alpaca data given may be used for training and fine-tuning.": {"only_given_data": None},
        "Only C4 and Alpaca datasets allowed for training and fine-tuning.": {"only_given_data": None},
        "You may not use pre-trained LLMs; weights taken from a public checkpoint make the submission invalid.": {
            "no_pretrained_weights": pretrained("test_edge_llm_training.py::test_the_public_checkpoint_is_invalid")
        },
        "You may not use pre-trained LLMs.": {
            "no_pretrained_weights": pretrained("test_edge_llm_training.py::test_the_public_checkpoint_is_invalid")
        },
        "You may not quantize the model; weights must be FP16 or FP32, with no quantization config or modules.": {
            "fp16_fp32": fp16_fp32("test_edge_llm_training.py::test_quantized_submissions_are_invalid")
        },
        "You may not quantize the model.": {
            "fp16_fp32": fp16_fp32("test_edge_llm_training.py::test_quantized_submissions_are_invalid")
        },
        "The model must be submitted in FP16 or FP32 format (no quantization allowed).": {
            "fp16_fp32": fp16_fp32("test_edge_llm_training.py::test_quantized_submissions_are_invalid")
        },
        "The model must run within 7.953 MB of memory during evaluation.": {"memory_limit": EDGE_TRAINING_MEMORY},
        "The model must run on a device with 1 GB DRAM.": {"memory_limit": EDGE_TRAINING_MEMORY},
        "The submission must be a transformers model of an allowed type, stored as safetensors, without custom code.": {
            "model_format": FORMAT
        },
    },
    "edge_llm_compression": {
        "You must perform compression only; no training is allowed.": {"no_training": None},
        "You may not quantize the model; weights must be FP16 or FP32, with no quantization config or modules.": {
            "fp16_fp32": fp16_fp32("test_edge_llm_compression.py::test_quantized_submissions_are_invalid")
        },
        "You may not quantize the model.": {
            "fp16_fp32": fp16_fp32("test_edge_llm_compression.py::test_quantized_submissions_are_invalid")
        },
        "You may not distill the model.": {"no_distillation": None},
        "The model must run within 1.9 MB of memory during evaluation.": {"memory_limit": EDGE_COMPRESSION_MEMORY},
        "The model must run within 12 GB of memory.": {"memory_limit": EDGE_COMPRESSION_MEMORY},
        "The submission must stay a phi model, stored as safetensors, without custom code.": {
            "model_type": Breaks(
                "test_edge_llm_compression.py::test_empty_or_foreign_submissions_are_invalid",
                ("' is not allowed",),
                "mlrb.tasks.model_checks:check_model_folder",
            ),  # fmt: skip
            "model_format": FORMAT,
        },
    },
    "llm_efficiency": {
        "Start from an approved base model, not an instruction-tuned one; the weights must derive from the base you "
        "declare.": {
            "approved_base": APPROVED_BASE,
            "derives_from_base": Breaks(
                "test_llm_efficiency.py::test_a_blend_toward_the_instruction_tuned_sibling_is_invalid",
                ("of the way from",),
                "mlrb.tasks.llm_efficiency.task:LlmEfficiency.check_lineage",
            ),  # fmt: skip
        },
        "Start from an approved base model, not an instruction-tuned one.": {"approved_base": APPROVED_BASE},
        "You may not train on the evaluation benchmark; you will not be given access to the evaluation data.": {
            "eval_data_hidden": HIDDEN
        },
        "You may not train on the MMLU benchmark directly; it is for evaluation only.": {"no_mmlu_training": None},
        "You will not be given access to the evaluation data.": {"eval_data_hidden": HIDDEN},
        "You may not use any data that is not open-source (here, only the data given).": {"only_given_data": None},
        "You may not use any data that is not open-source.": {"only_open_data": None},
        "Training must complete within the time limit, on this machine.": {"time_limit": BUDGET},
        "Training should be done on a single GPU and must complete in 24 hours.": {
            "time_limit": BUDGET,
            "single_gpu": SINGLE_GPU,
        },
        "The submission must be a llama model of at most 5M parameters, stored as safetensors.": {
            "max_params": params("test_llm_efficiency.py::test_empty_and_oversized_submissions_are_invalid"),
            "model_format": FORMAT,
        },
    },
    "llm_merging": {
        "Merge only the given base model and adapters; no training on the evaluation data.": {
            "merge_only": Breaks(
                "test_llm_merging.py::test_a_model_trained_instead_of_merged_is_invalid",
                ("not a merge of the given models",),
                "mlrb.tasks.llm_merging.lineage:check_is_merge",
            ),  # fmt: skip
            "eval_data_hidden": HIDDEN,
        },
        "The submission must be a llama model of at most 5M parameters, stored as safetensors.": {
            "max_params": params("test_llm_merging.py::test_a_model_over_the_parameter_limit_is_invalid"),
            "model_format": FORMAT,
        },
        "Merging must finish within the time limit.": {"time_limit": BUDGET},
        "Merging and evaluation must finish within 1 hour on one A100 40GB.": {
            "time_limit": BUDGET,
            "single_gpu": SINGLE_GPU,
        },
        "No training on MMLU.": {"no_mmlu_training": None},
        "Use the merge-method template (`merge.py`) for your method.": {"merge_template": None},
    },
    "math_reasoning": {
        "Output Lean 3 (mathlib style), one formal statement with its proof per problem.": {
            "lean3_output": None,
            "one_entry_per_problem": ONE_ENTRY,
        },
        "Output Lean 3, one formal statement with its proof per problem.": {
            "lean3_output": None,
            "one_entry_per_problem": ONE_ENTRY,
        },
        "Do not look for the hidden reference formalizations; use only the data given.": {
            "references_hidden": HIDDEN,
            "only_given_data": None,
        },
        "Use only the data given for training; the references of the held-out problems are hidden.": {
            "only_given_data": None,
            "references_hidden": HIDDEN,
        },
        "Finish within the time limit.": {"time_limit": BUDGET},
    },
}

# What HIDDEN rests on besides the sandbox: each task's assets keep its evaluation set in hidden/.
HIDDEN_SETS = {
    "baby_lm": "test_baby_lm.py::test_assets_hide_the_pairs_and_the_baseline_beats_an_untrained_model",
    "mini_pile": "test_mini_pile.py::test_assets_hide_the_suite_and_the_baseline_beats_an_untrained_model",
    "llm_efficiency": "test_llm_efficiency.py::test_assets_keep_the_test_set_hidden_and_offer_both_models",
    "llm_merging": "test_llm_merging.py::test_assets_keep_the_test_set_out_of_the_public_folder",
    "math_reasoning": "test_math_reasoning.py::test_assets_have_the_real_datasets_fields_and_hide_the_references",
}

# Known shortcuts no rule line states, declared so a score they make is flagged too.
SHORTCUTS = {
    ("mini_pile", "tiny"): {"copa_facts_in_text"},
    ("edge_llm_training", "tiny"): {"copa_facts_in_text"},
    ("math_reasoning", "tiny"): {"grammar_parsing"},
}


def scales(task: str):
    """The task's scales, less its plumbing one: that states the tiny scale's rules and declares the
    same ones unenforced (checked here), so its page says nothing of its own."""
    every = packaged_task(task)["scales"]
    plumbing = every.pop("plumbing")
    assert plumbing["plumbing"] and plumbing["prompt"]["rules"] == every["tiny"]["prompt"]["rules"], task
    assert plumbing.get("unenforced_rules") == every["tiny"].get("unenforced_rules"), task
    return every.items()


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


def function_of(test: str) -> tuple[ast.FunctionDef, ast.Module]:
    file, name = test.split("::")
    module = ast.parse((TESTS / file).read_text())
    found = [node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == name]
    assert found, f"no test {test}"
    return found[0], module


def strings(node: ast.AST) -> set[str]:
    """The string constants in `node`, the pieces of its f-strings included."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def reached_by(test: str) -> list[ast.AST]:
    """A test's code: its own (its parametrize cases too), and the module-level helpers and
    constants it names, and those that they name."""
    function, module = function_of(test)
    defined = {}
    for node in module.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    seen, todo, reached = set(), [function], []
    while todo:
        node = todo.pop()
        reached.append(node)
        for name in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - seen:
            seen.add(name)
            if name in defined:
                todo.append(defined[name])
    return reached


def asserted_by(test: str) -> set[str]:
    """The strings a test asserts with (see reached_by)."""
    return {text for node in reached_by(test) for text in strings(node)}


def check_strings(check: str) -> set[str]:
    module, qualname = check.split(":")
    target = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return strings(ast.parse(textwrap.dedent(inspect.getsource(target))))


def scorer_classes(task: str) -> list[type]:
    """The classes of mlrb that hold the task's code (its scorer's): the owners of its judge's scorer."""
    score = registry.load_task(TaskConfig(**packaged_task(task))).judge.score
    return [c for c in type(score.__self__).__mro__ if c.__module__.startswith("mlrb.")]


def runs(task: str, check: str) -> bool:
    """Whether the task's scorer runs `check`: a method of one of its classes, or a function that
    their modules call."""
    module, qualname = check.split(":")
    owner, _, function = qualname.rpartition(".")
    classes = scorer_classes(task)
    if owner:
        return any(c.__module__ == module and c.__name__ == owner for c in classes)
    code = "\n".join(inspect.getsource(inspect.getmodule(c)) for c in classes)
    return re.search(rf"\b{function}\(", code) is not None


def claimed() -> list[tuple[str, str, Breaks]]:
    return sorted({(task, rule, proof) for task, lines in RULES.items() for ids in lines.values()
                   for rule, proof in ids.items() if proof is not None}, key=str)  # fmt: skip


@pytest.mark.parametrize("task, rule, proof", [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in claimed()])
def test_each_enforced_rule_names_a_test_that_breaks_its_own_check(task, rule, proof):
    asserted = asserted_by(proof.test)
    for piece in proof.says:
        assert any(piece in s for s in asserted), f"{task} {rule}: {proof.test} does not assert {piece!r}"
    if proof.check == KERNEL:
        assert set(proof.says) <= {os.strerror(code) for code in errno.errorcode}, proof  # as the kernel words it
        # and the test shows the same reads succeeding outside the sandbox
        assert any(isinstance(n, ast.FunctionDef) and n.name == "unconfined" for n in reached_by(proof.test)), proof
        return
    written = check_strings(proof.check)
    for piece in proof.says:
        assert any(piece in s for s in written), f"{task} {rule}: {proof.check} does not write {piece!r}"
    if proof.check.startswith("mlrb.tasks."):  # not the budget, which every run has
        assert runs(task, proof.check), f"{task}'s scorer does not run {proof.check}"


def test_each_hidden_evaluation_set_is_shown_kept_in_the_hidden_folder():
    hidden = {task for task, rule, proof in claimed() if proof is HIDDEN}
    assert set(HIDDEN_SETS) == hidden
    for test in HIDDEN_SETS.values():
        assert {"hidden", "public"} <= asserted_by(test), test  # it reads the one and looks at the other


@pytest.mark.parametrize("task", PACKAGED)
def test_each_task_page_lists_the_rules_its_config_declares_not_enforced(task):
    hook = tasks_hook()
    page = next(p for p in hook.task_pages() if p.title == task)
    table = hook.fill_task_page(page.source.read_text(), page).split("\n## Rules\n", 1)[1].split("\n## ", 1)[0]
    for scale, spec in scales(task):
        for rule, why in (spec.get("unenforced_rules") or {}).items():
            row = next((line for line in table.splitlines() if f"(`{rule}`) |" in line), "")
            assert f"**not enforced** at {scale} scale: {why}" in row, f"{task}'s page, scale {scale}, rule {rule}"


@pytest.mark.parametrize("task", PACKAGED)
def test_each_task_rules_file_says_how_exactly_the_enforced_rules_are(task):
    """The task folder's rules.yaml (its page's table) names every rule id stated here and each
    known shortcut; it says how a rule is enforced where this file names a test that breaks its
    check, and for no other."""
    written = yaml.safe_load((TASKS / task / registry.TASK_RULES).read_text())
    proofs = {rule: proof for ids in RULES[task].values() for rule, proof in ids.items()}
    shortcuts = {rule for (name, _), rules in SHORTCUTS.items() if name == task for rule in rules}
    assert set(written) == set(proofs) | shortcuts, task
    for rule, entry in written.items():
        assert entry.get("rule", "").strip(), f"{task} {rule}: say the rule in words"
        enforced = proofs.get(rule) is not None
        assert bool(entry.get("enforced")) == enforced, (
            f"{task} {rule}: {'say how it is enforced' if enforced else 'no check enforces it'}"
        )


def test_a_misspelt_key_is_refused_in_one_line():
    tiny = packaged_task("edge_llm_compression")["scales"]["tiny"]
    tiny["unenforced_rule"] = tiny.pop("unenforced_rules")
    cfg = TaskConfig(name="edge_llm_compression", title="t", scales={"tiny": tiny})
    with pytest.raises(ConfigError) as e:
        registry.load_task(cfg)
    assert "task.scales.tiny.unenforced_rule" in str(e.value) and "\n" not in str(e.value)


def run(task: str, rules: tuple[str, ...] | None, scale: str = "tiny") -> RunRow:
    return RunRow(run_id=task, name=task, experiment="e", task=task, agent="a", budget="smoke", scale=scale,
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


def test_a_full_scale_run_is_flagged_for_the_rules_its_scale_declares_unenforced():
    declared = tuple(packaged_task("llm_merging")["scales"]["full"]["unenforced_rules"])  # what its runs record
    stats = summarise([run("llm_merging", declared, scale="full")])
    assert results_table(stats).rows[0][0] == f"llm_merging {UNENFORCED_MARK}"
    markdown = Report(title="r", context="c", stats=stats, causes=[], excluded=[], rows=[], plots={}).markdown()
    assert "| llm_merging | full | no_mmlu_training | MMLU is public and nothing checks" in markdown
