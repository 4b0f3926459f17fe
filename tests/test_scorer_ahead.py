"""The scorer is started with the run, before there is anything to score, so that its imports
happen while the agent works (mlrb/scoring/runner.py Scorer): its time limit still counts from
the submission, a scorer nobody hands anything is stopped, it goes with a harness that dies,
and assets rebuilt in the meantime are the ones scored. Real bwrap sandboxes, the default
task's real assets."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, tiny_llm_merging
from mlrb.assets import ensure_assets
from mlrb.config import SandboxConfig
from mlrb.scoring.runner import Scorer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def assets(built_cache) -> Path:
    return ensure_assets(tiny_llm_merging(), built_cache)


def submission_from(assets: Path, folder: Path) -> Path:
    """A copy of the base model: a valid submission (the do-nothing one)."""
    shutil.copytree(assets / "public" / "base_model", folder)
    return folder


def processes_using(path: Path) -> list[int]:
    """Processes on this host (sandboxed ones included) whose command line names `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(path) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return found


def started_within(seconds: float, path: Path) -> bool:
    """Whether processes naming `path` appear within SECONDS: until the scorer's process has
    exec'd, its command line is still the harness's (a loaded machine stretches that)."""
    deadline = time.monotonic() + seconds
    while not processes_using(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def gone_within(seconds: float, path: Path) -> bool:
    deadline = time.monotonic() + seconds
    while processes_using(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_an_agent_that_works_longer_than_the_scoring_limit_is_still_scored(assets, tmp_path):
    task = tiny_llm_merging()
    task.spec.score_timeout_s = 10  # the limit is on scoring, counted from the submission
    with Scorer(task, assets, tmp_path / "scoring", SandboxConfig()) as scorer:
        time.sleep(12)  # the agent's work: the scorer has imported torch and lm-eval meanwhile, then waited
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.details["n"] == 240 and 0 < report.score < 1


def test_a_scorer_that_is_never_handed_a_submission_is_stopped(assets, tmp_path):
    scoring = tmp_path / "scoring"
    scorer = Scorer(tiny_llm_merging(), assets, scoring, SandboxConfig())
    assert started_within(10, scoring)  # bwrap and the scorer inside it
    report = scorer.score(tmp_path / "nothing here")
    assert not report.valid and "no submission" in report.reason
    assert gone_within(5, scoring), processes_using(scoring)
    assert not (scoring / "scorer.log").exists()  # its imports' output, not a scoring's: no artifact
    assert scorer.score(submission_from(assets, tmp_path / "submission")).valid  # handed one after all: a fresh one
    scorer.close()

    failed = Scorer(tiny_llm_merging(), assets, tmp_path / "failed", SandboxConfig())
    failed.close()  # as the run does when its agent failed
    assert gone_within(5, tmp_path / "failed") and not (tmp_path / "failed" / "scorer.log").exists()


@pytest.mark.parametrize("kind", ["bwrap", "unconfined"])
def test_a_waiting_scorer_goes_with_a_harness_that_is_killed(assets, tmp_path, kind):
    scoring = tmp_path / "scoring"
    harness = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from pathlib import Path\n"
            "sys.path.insert(0, 'tests')\n"
            "from conftest import tiny_llm_merging\n"
            "from mlrb.config import SandboxConfig\n"
            "from mlrb.scoring.runner import Scorer\n"
            f"Scorer(tiny_llm_merging(), Path({str(assets)!r}), Path({str(scoring)!r}), SandboxConfig(kind={kind!r}))\n"
            "print('started', flush=True)\n"
            "time.sleep(600)\n"
        )],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert harness.stdout is not None and harness.stdout.readline().strip() == "started"
    assert started_within(10, scoring)
    # bwrap arms its --die-with-parent a moment after it starts; a harness killed within those
    # milliseconds leaves it behind (bubblewrap 0.8). A harness lives for seconds at least.
    time.sleep(1)
    harness.send_signal(signal.SIGKILL)  # no cleanup of its own: the scorer must notice
    harness.wait()
    assert gone_within(10, scoring), processes_using(scoring)


def test_assets_rebuilt_while_the_agent_works_are_the_ones_scored(assets, tmp_path):
    # The run checks its assets again before scoring and rebuilds damaged ones: a new folder
    # at the same path, which a sandbox started on the old one would not show.
    copy = tmp_path / "cache" / "llm_merging" / assets.name
    shutil.copytree(assets, copy)
    with Scorer(tiny_llm_merging(), copy, tmp_path / "scoring", SandboxConfig()) as scorer:
        copy.rename(copy.with_name(copy.name + ".damaged"))
        shutil.copytree(copy.with_name(copy.name + ".damaged"), copy)
        test_set = copy / "hidden" / "test.jsonl"
        test_set.write_text("".join(test_set.read_text().splitlines(keepends=True)[:60]))
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.details["n"] == 60  # the rebuilt folder's test set, not the 240 items of the old one


def test_a_scorer_handed_a_second_submission_scores_it_afresh(assets, tmp_path):
    with Scorer(tiny_llm_merging(), assets, tmp_path / "scoring", SandboxConfig(kind="unconfined")) as scorer:
        first = scorer.score(submission_from(assets, tmp_path / "first"))
        second = scorer.score(tmp_path / "first")
    assert first.valid and second.valid and second.score == first.score
