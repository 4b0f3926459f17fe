"""The scoring process: `python -I -m mlrb.scoring.worker REQUEST.json [MODULE,...]`.

Started before there is anything to score (while the agent works), it imports the
modules named (the task's judge's imports: torch, lm-eval; seconds), waits for the
harness to write REQUEST.json (it does once the submission is copied), then loads
the task from the request, scores the submission and writes the report.

Who is to blame when scoring raises instead of judging: a submission that cannot be
loaded or run (say a config.json that is not an object, or weights that do not fit
the config) is the agent's failure, reported as invalid with the reason (exit 0);
anything else is a scorer failure (exit 1), whose blame the harness settles with a control
(mlrb/harness/control.py): the task's baseline submission scored the same way. Only a failure the
control shares (the task's hidden data, the scorer's own code, the machine) is an
infrastructure error; otherwise the submission is invalid.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import NoReturn

from mlrb.core import registry
from mlrb.core.collector import lasting_imports
from mlrb.core.config import TaskConfig
from mlrb.scoring.report import ScoreReport

PROBE_TEXT = "The quick brown fox jumps over the lazy dog."
POLL_S = 0.02  # how often a waiting scorer looks for its request


def main(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    task_cfg = TaskConfig(**request["task"])
    task = registry.load_task(task_cfg, Path(request["environment"]) if request.get("environment") else None)
    judge = task.judge
    if request.get("submission_command_ran"):  # its own code ran apart (runner.py): only what it left is scored
        judge = judge.after_command()
    if task_cfg.scales[task_cfg.scale].get("eval", {}).get("tasks"):
        import datasets

        datasets.disable_caching()  # the evaluation sets are the user's, read-only: nothing is written beside them
    submission = Path(request["submission"])
    try:
        report = judge.score(submission, Path(request["assets"]), Path(request["work_dir"]))
    except Exception as error:  # scoring crashed: find out whose fault it is
        problem = submission_problem(submission)
        if not problem:
            raise  # the submission loads and runs: the scorer failed (exit 1)
        traceback.print_exc()  # kept in scorer.log
        report = ScoreReport.invalid(problem, scorer_error=f"{type(error).__name__}: {str(error)[:1000]}")
    Path(request["report"]).write_text(json.dumps(report.to_dict(), indent=2, default=float))


def submission_problem(submission: Path) -> str:
    """Why this submission cannot be used, or "" when it can, as far as can be told
    without the task: a model folder must load with transformers and run one forward
    pass (the scorer's first steps with any model)."""
    if not (submission / "config.json").is_file():
        return ""
    try:
        config = json.loads((submission / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json is not valid JSON ({type(e).__name__}: {e})"
    if not isinstance(config, dict):
        return f"config.json must hold a JSON object, not {type(config).__name__}"
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

        model_config = AutoConfig.from_pretrained(submission, trust_remote_code=False)
        loader = AutoModelForSeq2SeqLM if getattr(model_config, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = loader.from_pretrained(submission, dtype="auto", trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(submission, trust_remote_code=False)
        ids = tokenizer(PROBE_TEXT, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            if model_config.is_encoder_decoder:
                model(input_ids=ids, decoder_input_ids=ids[:, :1])
            else:
                model(input_ids=ids)
    except Exception as e:  # transformers and torch raise many types for a broken model
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        detail = " ".join(lines[:3])[:300]
        return f"the model cannot be loaded or run with transformers: {type(e).__name__}: {detail}"
    return ""


def prepare(modules: list[str], request_file: Path) -> None:
    """Import `modules`, then wait until the request exists (the harness writes it whole, by
    renaming). From the start, a watcher ends this process once the harness that started it
    is gone: the imports alone take tens of seconds on a loaded machine."""
    threading.Thread(target=exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    with lasting_imports():  # about half a CPU second of collections saved, and more while it scores
        for module in modules:
            importlib.import_module(module)
    while not request_file.exists():
        time.sleep(POLL_S)


def exit_when_orphaned(parent: int) -> None:
    """Exit the whole process once its parent is gone (it is reparented). Unconfined, nothing
    else would; in bwrap, --die-with-parent does it as well."""
    while os.getppid() == parent:
        time.sleep(0.2)
    print("the harness is gone: stopping the scorer", file=sys.stderr, flush=True)
    os._exit(1)


def end_process() -> NoReturn:
    """Exit once the report is written, after the exit handlers (temporary folders removed,
    logs flushed) but without the interpreter's teardown, which frees torch's, transformers'
    and lm-eval's objects one by one: about a second, in the run's time."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    prepare([m for m in ",".join(sys.argv[2:]).split(",") if m], Path(sys.argv[1]))
    main(sys.argv[1])
    end_process()
