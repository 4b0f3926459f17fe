"""Scoring with EleutherAI lm-evaluation-harness (lm-eval), offline-friendly.

`mc_task_config` turns an MMLU-format jsonl file into an lm-eval task config (a dict,
handed to lm-eval as it is: nothing written to disk); `evaluate` runs any lm-eval task
(such a config, a local task folder's or a built-in one, e.g. `mmlu`) on a Hugging Face
model directory and returns overall and per-subject accuracy.

lm_eval is imported lazily inside the functions: importing it costs ~1 s and
indexing its built-in task library another ~7 s, which we skip when possible.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

#: What a scorer that evaluates with lm-eval imports ahead (a task's judge's `imports`).
# transformers.modeling_utils: what loading any model imports on first use (1.6 s here).
IMPORTS = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "lm_eval.evaluator",
    "lm_eval.tasks",
    "lm_eval.models.huggingface",
)


def question_text(doc: dict) -> str:
    """The prompt, as lm-eval's mmlu_continuation lays it out: the model scores each choice's
    *text* after "Answer:", since tiny models cannot map facts to letters A-D. A function, not
    a Jinja template, which lm-eval would compile afresh for every document (about 1 ms each)."""
    return f"Question: {doc['question'].strip()}\nAnswer:"


def mc_task_config(task_name: str, data_file: Path) -> dict:
    """A 0-shot multiple-choice lm-eval task over an MMLU-format jsonl file
    ({"question", "subject", "choices": [..], "answer": int}), as the config dict lm-eval
    takes in place of a task name: `evaluate(model_dir, [mc_task_config(...)])`."""
    return {
        "task": task_name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(Path(data_file).resolve())}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "num_fewshot": 0,
        "doc_to_text": question_text,
        "doc_to_choice": "choices",  # a field: read as it is
        "doc_to_target": "answer",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1.0},
    }


def _task_manager(tasks: list, include_path: Path | None):
    """Index nothing when every task is given as a config (fast), only include_path when
    it defines every task named, and otherwise lm-eval's built-in tasks too (needed for
    e.g. `mmlu`)."""
    from lm_eval.tasks import TaskManager

    tasks = [t for t in tasks if not isinstance(t, dict)]
    if not tasks and include_path is None:
        return TaskManager(include_defaults=False)
    if include_path is not None:
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
        return TaskManager(include_path=str(include_path))
    return TaskManager()


def _leaf_tasks(name: str, group_subtasks: dict[str, list[str]]) -> list[str]:
    """Expand a group (e.g. mmlu -> mmlu_stem -> mmlu_anatomy ...) to its leaf tasks."""
    children = group_subtasks.get(name)
    if not children:
        return [name]
    return [leaf for child in children for leaf in _leaf_tasks(child, group_subtasks)]


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def evaluate(
    model_dir: Path,
    tasks: list[str | dict],
    include_path: Path | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    limit: int | None = None,
    dtype: str = "float32",
    around_model=None,
) -> dict:
    """Evaluate a Hugging Face model directory with lm-eval's `hf` backend.

    tasks: lm-eval task names, or task configs (dicts, such as `mc_task_config`'s).
    Returns {"accuracy": acc of tasks[0], "n": its number of scored docs,
    "per_subject": {subject: acc} for tasks[0] (doc["subject"], else the leaf task
    name), "lm_eval_version": str, "raw": JSON-safe subset of lm-eval's results}.

    around_model: optional `callable(model) -> context manager`, entered around the
    evaluation once the model is loaded (say to measure its peak memory); the model
    is then loaded here, exactly as lm-eval would load it.
    """
    import contextlib

    import lm_eval
    import lm_eval.evaluator
    from lm_eval.evaluator import simple_evaluate

    # lm-eval reports the machine with every evaluation (torch's environment report runs `pip list`
    # and more; git looks for a repository): about 0.7 CPU s a scoring, for fields mlrb drops.
    lm_eval.evaluator.add_env_info = lambda storage: None
    lm_eval.evaluator.get_git_commit_hash = lambda: None

    model_args = {"pretrained": str(model_dir), "dtype": dtype, "trust_remote_code": False}
    model, around = "hf", contextlib.nullcontext()
    if around_model is not None:
        from lm_eval.api.registry import get_model

        model = get_model("hf").create_from_arg_obj(
            model_args, {"batch_size": batch_size, "max_batch_size": None, "device": device}
        )
        around = around_model(model.model)
    with around:
        out = simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=list(tasks),
            batch_size=batch_size,
            device=device,
            limit=limit,
            task_manager=_task_manager(tasks, include_path),
            log_samples=True,
        )
    results = out["results"]
    samples = out.get("samples", {})
    first_name = tasks[0]["task"] if isinstance(tasks[0], dict) else tasks[0]

    # Per-sample accuracy of tasks[0]'s leaf tasks, grouped by subject.
    by_subject: dict[str, list[float]] = defaultdict(list)
    for leaf in _leaf_tasks(first_name, out.get("group_subtasks", {})):
        for s in samples.get(leaf, []):
            by_subject[str(s["doc"].get("subject", leaf))].append(float(s["acc"]))
    all_acc = [a for accs in by_subject.values() for a in accs]

    # Prefer lm-eval's own aggregate (for groups it is size-weighted, same as ours).
    first = results.get(first_name, {})
    accuracy = first.get("acc,none")
    if accuracy is None:  # e.g. a tag, which has no aggregate row
        accuracy = sum(all_acc) / len(all_acc) if all_acc else float("nan")

    raw_keys = ["results", "groups", "group_subtasks", "n-samples", "versions", "n-shot", "config"]
    return {
        "accuracy": float(accuracy),
        "n": len(all_acc),
        "per_subject": {k: sum(v) / len(v) for k, v in sorted(by_subject.items())},
        "lm_eval_version": lm_eval.__version__,
        "raw": _jsonable({k: out[k] for k in raw_keys if k in out}),
    }


def evaluate_spec(ev, model_dir: Path, held_out: Path, task_name: str, around_model=None) -> dict:
    """`evaluate` with a scale's EvalSpec: its lm-eval tasks, or, when it names none,
    the held-out MMLU-format jsonl `held_out` as the task `task_name`."""
    tasks = list(ev.tasks) or [mc_task_config(task_name, held_out)]
    return evaluate(
        model_dir,
        tasks,
        batch_size=ev.batch_size,
        device=ev.device,
        limit=ev.limit,
        dtype=ev.dtype,
        around_model=around_model,
    )
