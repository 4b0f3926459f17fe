"""A failed scoring is blamed on the harness only with proof (mlrb/harness/control.py): the task's own
baseline submission, scored by the same scorer in the same kind of sandbox, must fail too.
An agent that breaks the scorer on purpose gets an invalid, counted run, not a free re-roll."""

from __future__ import annotations

import pytest

from conftest import (
    HARNESS_EXPERIMENT,
    HARNESS_TASK,
    PLUMBING,
    only_run,
    plumbing_llm_merging,
    run_cli,
    store_args,
)
from mlrb.harness.assets import asset_dir
from mlrb.scoring.worker import PROBE_TEXT
from test_command_agent import command_override

pytestmark = pytest.mark.integration

# The cheapest way to break the scorer on the test set while passing its probe sentence and every
# rule check: the untouched base model, whose tokenizer gives every token the probe does not use an
# id past the embedding. The model loads and runs on the probe; the test set's other tokens index
# past the embedding and crash lm-eval. (The probe is written into the program: mlrb's own code
# never enters the sandbox.)
BREAK_THE_SCORER = (
    f"PROBE = {PROBE_TEXT!r}\n"
    + """
import json, os, shutil
from pathlib import Path
from transformers import AutoTokenizer
shutil.copytree(Path(os.environ["MLRB_DATA"]) / "base_model", "submission")
used = set(AutoTokenizer.from_pretrained("submission")(PROBE)["input_ids"])
size = json.loads(Path("submission/config.json").read_text())["vocab_size"]
tokenizer = json.loads(Path("submission/tokenizer.json").read_text())
vocab = tokenizer["model"]["vocab"]
tokenizer["model"]["vocab"] = {token: i if i in used or i < 4 else size + i for token, i in vocab.items()}
Path("submission/tokenizer.json").write_text(json.dumps(tokenizer))
"""
)


def test_a_submission_that_breaks_the_scorer_is_invalid_and_counted_when_the_control_scores(tmp_path, plumbing_cache):
    result = run_cli(*store_args(tmp_path, plumbing_cache), PLUMBING, "agent=command", command_override(BREAK_THE_SCORER),
                     cwd=tmp_path, env={"ANTHROPIC_API_KEY": "sk-ant-unused"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _, run = only_run(tmp_path, "llm_merging")
    tags, metrics = run.data.tags, run.data.metrics
    # The scorer did fail on it (its log says so), and the control scored: the failure is the submission's.
    assert tags["mlrb.status"] == "invalid", tags.get("mlrb.error")
    assert run.info.status == "FINISHED"  # not re-run by a relaunched sweep
    reason = tags["mlrb.invalid_reason"]
    assert reason.startswith("scoring failed on this submission (scorer exited 1: IndexError:"), reason
    assert "the task's baseline submission scored" in reason
    # An attempt, not a free re-roll: at tiny scale it counts as doing nothing. A plumbing run counts as
    # nothing whatever it scores: it records that reason, not the "not counted" of an infrastructure error.
    assert tags["mlrb.counted_as"] == "none" and "plumbing scale" in tags["mlrb.counted_reason"]
    assert "score" not in metrics and "counted_score" not in metrics
    # The control is kept beside the assets: a second failure does not run the baseline again.
    assets = asset_dir(plumbing_llm_merging(), plumbing_cache)
    (control,) = assets.parent.glob(f"{assets.name}.control/*/done")
    assert (control.parent / "submission" / "submission" / "config.json").is_file()


def test_a_timeout_the_control_shares_is_an_infrastructure_error_not_the_agent_s(tmp_path, cache_dir):
    # A time limit no scoring can meet (the scorer polls for its request every 20 ms): the machine is
    # too slow for the task, as the baseline shows; the honest submission is not blamed. On the cheapest
    # task (HARNESS_TASK), whose control is made by its baseline command as any task's is: which task
    # times out is incidental. With verbose=true, whose console shows an infrastructure error's traceback
    # (without it, one line naming the log file that holds it: tests/test_end_to_end.py's scorer failure).
    result = run_cli(*store_args(tmp_path, cache_dir), *HARNESS_TASK, "task.scales.folder.score_timeout_s=0.01",
                     "verbose=true", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and "Traceback" in result.stderr + result.stdout
    _, run = only_run(tmp_path, HARNESS_EXPERIMENT)
    assert run.data.tags["mlrb.status"] == "infra_error"
    error = run.data.tags["mlrb.error"]
    assert "scoring took longer than 0.01 s; the control failed too: scoring took longer than 0.01 s" in error, error
