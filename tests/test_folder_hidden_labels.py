"""An MLRC-Bench task folder's hidden test labels stay out of the agent's reach at scoring too.

The test split is scored by running the agent's own method (`main.py -m my_method -p test`).
That code runs in a sandbox of its own that sees the submission's copy (with the test inputs put
in place), the task's Python and the system, never the task's asset folder; scripts/eval.py's
`get_score` then reads its outputs in the scorer's sandbox (mlrb/scoring/runner.py). Here an agent
(`agent=command`) writes a method that, at test time, searches the whole file system for
test_labels.json (tests/folder_tasks/mlrc-mini/scripts/prepare.py writes it into the hidden
scripts folder) and predicts those labels: it must score no better than honest work.

Nor does the scorer read them through a link the agent left: a submission linked to the hidden
answers (found through its sandbox's mount table) is scored without the link.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import mlflow_client, run_cli, store_args
from test_command_agent import command_override
from test_folder_tasks import HOUSE_PRICE, MLRC, SANDBOXES

# A method that is honest on dev (nearest centroid on feature a) and, on test, predicts the
# hidden labels wherever the scorer keeps them; with none to be found it says so and fails.
ATTACK_METHOD = """
import json, os, sys

FEATURES = ["a"]
NOT_SEARCHED = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/boot"}


def hidden_labels():
    for folder, subfolders, files in os.walk("/"):
        if "test_labels.json" in files:
            with open(os.path.join(folder, "test_labels.json")) as f:
                return json.load(f)
        subfolders[:] = [name for name in subfolders if os.path.join(folder, name) not in NOT_SEARCHED
                         and name not in ("site-packages", "dist-packages", "__pycache__")]
    raise RuntimeError("found no test_labels.json anywhere")


class MyMethod:
    def __init__(self, name):
        self.name = name
        self.centroids = {}
        self.labels = iter(hidden_labels()) if sys.argv[-1] == "test" else None

    def fit(self, rows):
        for label in sorted({int(r["label"]) for r in rows}):
            members = [r for r in rows if int(r["label"]) == label]
            self.centroids[label] = [sum(r[f] for r in members) / len(members) for f in FEATURES]

    def predict(self, row):
        if self.labels is not None:
            return next(self.labels)
        point = [row[f] for f in FEATURES]
        return min(self.centroids, key=lambda c: sum((p - q) ** 2 for p, q in zip(point, self.centroids[c])))
"""

# The agent: writes that method into its workspace and tries it on dev, as any agent would.
AGENT = f"""
import subprocess
from pathlib import Path
Path("methods/my_method.py").write_text({ATTACK_METHOD!r})
subprocess.run(["python", "main.py", "-m", "my_method", "-p", "dev"], check=True)
"""


def command_run(tmp_path, cache_dir, task: list[str], program: str, experiment: str) -> tuple[dict, dict]:
    """`agent=command` running PROGRAM on the folder TASK, as a user would; its run's tags and metrics."""
    result = run_cli(*store_args(tmp_path, cache_dir), *task, "agent=command", command_override(program),
                     cwd=tmp_path, env={"ANTHROPIC_API_KEY": "sk-ant-unused"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run.data.tags, run.data.metrics


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_method_that_searches_for_the_hidden_test_labels_finds_none(tmp_path, cache_dir, sandbox):
    task = ["task=folder", f"task.path={MLRC}", "task.scales.folder.baseline_score=0.6",
            "task.scales.folder.reference_score=1.0", f"sandbox={sandbox}"]  # fmt: skip
    tags, metrics = command_run(tmp_path, cache_dir, task, AGENT, "mlrc-mini")
    assert json.loads(tags["mlrb.dev_scores"]) == {"1": pytest.approx(66 / 90)}  # honest on dev: feature a alone
    # On test its method ran where there are no labels to find: invalid, with its own error as the reason.
    assert tags["mlrb.status"] == "invalid", (tags["mlrb.status"], metrics.get("score"))
    reason = tags["mlrb.invalid_reason"]
    assert reason == "`python main.py -m my_method -p test` exited 1: RuntimeError: found no test_labels.json anywhere"
    assert "score" not in metrics and "normalised_score" not in metrics
    assert tags["mlrb.counted_as"] == "none"  # no do-nothing anchor: an MLRC run is not counted either way
    log = (tmp_path / "run" / "scoring" / "submission_command.log").read_text()
    assert "found no test_labels.json anywhere" in log  # the method's own output, kept beside the scorer's log


@pytest.mark.fast
def test_the_test_inputs_are_put_in_place_without_following_the_agents_links(tmp_path):
    """The harness puts the test inputs into the submission's copy outside any sandbox: a link
    the agent left where they go is replaced, and what it leads to is left as it was."""
    from mlrb.tasks.folder.scoring import put_inputs_in_place

    hidden, copy, outside = tmp_path / "hidden", tmp_path / "copy", tmp_path / "outside"
    (hidden / "test_data" / "more").mkdir(parents=True)
    (hidden / "test_data" / "test.csv").write_text("a,b\n1,2\n")
    (hidden / "test_data" / "more" / "extra.csv").write_text("x\n")
    (hidden / "test_constants.py").write_text("SPLIT = 'test'\n")
    (hidden / "test_labels.json").write_text("[0]")
    outside.mkdir()
    (outside / "test.csv").write_text("kept")
    (outside / "constants.py").write_text("kept")
    (copy / "data").mkdir(parents=True)
    (copy / "data" / "train.csv").write_text("a,b,label\n")
    (copy / "data" / "test.csv").symlink_to(outside / "test.csv")
    (copy / "data" / "more").symlink_to(outside)
    (copy / "constants.py").symlink_to(outside / "constants.py")
    (copy / "output").symlink_to(outside)

    put_inputs_in_place(copy, hidden, "test")

    assert (outside / "test.csv").read_text() == "kept" and (outside / "constants.py").read_text() == "kept"
    assert sorted(p.name for p in outside.iterdir()) == ["constants.py", "test.csv"]
    assert (copy / "data" / "test.csv").read_text() == "a,b\n1,2\n" and not (copy / "data" / "test.csv").is_symlink()
    assert (copy / "data" / "more" / "extra.csv").read_text() == "x\n" and not (copy / "data" / "more").is_symlink()
    assert (copy / "data" / "train.csv").exists()  # the split's other files stay
    assert (copy / "constants.py").read_text() == "SPLIT = 'test'\n"
    assert not os.path.lexists(copy / "output")  # old outputs gone (a link too), never the labels copied
    assert not list(copy.rglob("test_labels.json"))


# An agent that learns where its public data lies on the host (its sandbox's mount table names
# /data's source) and links its submission to the hidden answers beside it, for eval.py to read
# in the scorer's sandbox, which shows them.
LINK_TO_THE_ANSWERS = """
import os
(public,) = [line.split()[3] for line in open("/proc/self/mountinfo") if line.split()[4] == "/data"]
os.symlink(os.path.join(os.path.dirname(public), "hidden", "answer.csv"), "submission.csv")
"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_submission_linked_to_the_hidden_answers_is_not_scored_through_the_link(tmp_path, cache_dir, sandbox):
    task = ["task=folder", f"task.path={HOUSE_PRICE}", "task.higher_is_better=false", f"sandbox={sandbox}"]
    tags, metrics = command_run(tmp_path, cache_dir, task, LINK_TO_THE_ANSWERS, "house-price-mini")
    assert tags["mlrb.status"] == "invalid", (tags["mlrb.status"], metrics.get("score"))  # not an MAE of 0
    reason = tags["mlrb.invalid_reason"]
    assert reason.startswith("scripts/eval.py get_score raised FileNotFoundError: "), reason
    assert reason.endswith("(links leading outside the submission were removed before scoring: submission.csv)")
    assert "score" not in metrics


@pytest.mark.fast
def test_links_leading_outside_a_submission_are_removed_and_named(tmp_path):
    from mlrb.tasks.folder.scoring import remove_links_out

    submission, outside = tmp_path / "submission", tmp_path / "hidden"
    (submission / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "answer.csv").write_text("id,y\n")
    (submission / "train.csv").write_text("id,x\n")
    (submission / "absolute").symlink_to(outside / "answer.csv")
    (submission / "sub" / "climbs").symlink_to("../../hidden/answer.csv")
    (submission / "folder").symlink_to(outside)
    (submission / "via").symlink_to("absolute")  # a link to a link that leads out
    (submission / "inside").symlink_to("train.csv")
    (submission / "here").symlink_to(".")
    (submission / "dangling").symlink_to("no-such-file")

    assert sorted(remove_links_out(submission)) == ["absolute", "folder", "sub/climbs", "via"]
    assert sorted(p.name for p in submission.iterdir()) == ["dangling", "here", "inside", "sub", "train.csv"]
    assert (outside / "answer.csv").read_text() == "id,y\n"  # what they led to is untouched

    (tmp_path / "linked").symlink_to(outside)  # a submission that is itself a link
    assert remove_links_out(tmp_path / "linked") == ["."] and not os.path.lexists(tmp_path / "linked")
