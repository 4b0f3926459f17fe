"""The scorer is started with the run, before there is anything to score, so that its imports
happen while the agent works (mlrb/scoring/runner.py Scorer): its time limit still counts from
the submission, a scorer nobody hands anything is stopped, it goes with a harness that dies,
and assets rebuilt in the meantime are the ones scored. It starts at once for the scripted
baseline, which runs a known solution; for any other agent once its workspace holds a
submission, so a run that hands nothing in starts none. Real bwrap sandboxes. The scorer's
own mechanics are tested on the harness's task (a few lines of plain Python to score: what
these tests check is the process, not the judge); a harness killed while its scorer imports, and
a whole run of an LLM agent, on the default task at its plumbing scale, whose scorer imports
torch and lm-eval."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import PLUMBING, REPO, harness_task, mlflow_client, plumbing_llm_merging, run_cli, store_args
from mlrb.core.config import SandboxConfig
from mlrb.harness.assets import ensure_assets
from mlrb.scoring.runner import Scorer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def assets(cache_dir) -> Path:
    return ensure_assets(harness_task(), cache_dir)


def answers(assets: Path) -> dict[str, float]:
    """The hidden prices the task's eval.py scores against, by test id."""
    with open(assets / "hidden" / "answer.csv") as f:
        return {row["id"]: float(row["y"]) for row in csv.DictReader(f)}


def submission_from(assets: Path, folder: Path) -> Path:
    """A valid submission: a price of 0 for every test house, so that its score (the mean
    absolute error) is the mean of the hidden prices."""
    folder.mkdir()
    rows = "".join(f"{i},0\n" for i in answers(assets))
    (folder / "submission.csv").write_text("id,y\n" + rows)
    return folder


def score_of_zeros(prices: dict[str, float]) -> float:
    """What eval.py scores a submission of zeros against PRICES: their mean absolute value."""
    return sum(abs(y) for y in prices.values()) / len(prices)


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
    task = harness_task("task.scales.folder.score_timeout_s=10")  # on scoring, counted from the submission
    with Scorer(task, assets, tmp_path / "scoring", SandboxConfig()) as scorer:
        time.sleep(12)  # the agent's work: the scorer has made its imports meanwhile, then waited
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.score == pytest.approx(score_of_zeros(answers(assets)))


def test_a_scorer_that_is_never_handed_a_submission_is_stopped(assets, tmp_path):
    scoring = tmp_path / "scoring"
    scorer = Scorer(harness_task(), assets, scoring, SandboxConfig())
    assert started_within(10, scoring)  # bwrap and the scorer inside it
    report = scorer.score(tmp_path / "nothing here")
    assert not report.valid and "no submission" in report.reason
    assert gone_within(5, scoring), processes_using(scoring)
    assert not (scoring / "scorer.log").exists()  # its imports' output, not a scoring's: no artifact
    assert scorer.score(submission_from(assets, tmp_path / "submission")).valid  # handed one after all: a fresh one
    scorer.close()

    failed = Scorer(harness_task(), assets, tmp_path / "failed", SandboxConfig())
    failed.close()  # as the run does when its agent failed
    assert gone_within(5, tmp_path / "failed") and not (tmp_path / "failed" / "scorer.log").exists()


@pytest.mark.parametrize("kind", ["bwrap", "unconfined"])
def test_a_waiting_scorer_goes_with_a_harness_that_is_killed(plumbing_cache, tmp_path, kind):
    # The default task's scorer, killed a second in: still importing torch and lm-eval, the state
    # a harness killed early leaves it in (seconds of imports; the kill costs about one of them).
    merging = ensure_assets(plumbing_llm_merging(), plumbing_cache)
    scoring = tmp_path / "scoring"
    harness = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from pathlib import Path\n"
            "sys.path.insert(0, 'tests')\n"
            "from conftest import plumbing_llm_merging\n"
            "from mlrb.core.config import SandboxConfig\n"
            "from mlrb.scoring.runner import Scorer\n"
            f"Scorer(plumbing_llm_merging(), Path({str(merging)!r}), Path({str(scoring)!r}),"
            f" SandboxConfig(kind={kind!r}))\n"
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
    copy = tmp_path / "cache" / assets.parent.name / assets.name
    shutil.copytree(assets, copy)
    with Scorer(harness_task(), copy, tmp_path / "scoring", SandboxConfig()) as scorer:
        copy.rename(copy.with_name(copy.name + ".damaged"))
        shutil.copytree(copy.with_name(copy.name + ".damaged"), copy)
        # the rebuilt folder's hidden prices differ from the old one's: each one higher
        rebuilt = {i: y + 10 for i, y in answers(assets).items()}
        rows = "".join(f"{i},{y}\n" for i, y in rebuilt.items())
        (copy / "hidden" / "answer.csv").write_text("id,y\n" + rows)
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.score == pytest.approx(score_of_zeros(rebuilt))  # not the old folder's prices
    assert report.score != pytest.approx(score_of_zeros(answers(assets)))


def test_a_scorer_handed_a_second_submission_scores_it_afresh(assets, tmp_path):
    with Scorer(harness_task(), assets, tmp_path / "scoring", SandboxConfig(kind="unconfined")) as scorer:
        first = scorer.score(submission_from(assets, tmp_path / "first"))
        second = scorer.score(tmp_path / "first")
    assert first.valid and second.valid and second.score == first.score


def test_a_scorer_not_started_ahead_starts_when_asked_or_when_it_scores(assets, tmp_path):
    later = Scorer(harness_task(), assets, tmp_path / "later", SandboxConfig(), ahead=False)
    assert not started_within(2, tmp_path / "later")
    later.start_ahead()  # the run's call once the workspace holds a submission
    assert started_within(10, tmp_path / "later")
    assert later.score(submission_from(assets, tmp_path / "submission")).valid
    later.close()

    with Scorer(harness_task(), assets, tmp_path / "at-score", SandboxConfig(), ahead=False) as at_score:
        assert at_score.score(tmp_path / "submission").valid  # never asked ahead: it starts to score

    never = Scorer(harness_task(), assets, tmp_path / "never", SandboxConfig(), ahead=False)
    assert not never.score(tmp_path / "nothing here").valid
    never.close()
    assert not processes_using(tmp_path / "never") and not (tmp_path / "never" / "scorer.log").exists()


class ScorerSightings:
    """Watches the host's processes, while a run under `folder` runs, for its scorer (the
    worker's command line names its request file there); `first` is when one was first seen."""

    def __init__(self, folder: Path):
        self.folder, self.first = str(folder), None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        while not self.done.is_set() and self.first is None:
            for pid in processes_using(Path(self.folder)):
                try:
                    if b"mlrb.scoring.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        self.first = time.time()
                except OSError:
                    pass
            time.sleep(0.05)

    def __enter__(self) -> ScorerSightings:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def test_an_llm_agent_s_scorer_starts_after_the_step_that_leaves_a_submission_and_never_without_one(
    plumbing_cache, tmp_path
):
    from fake_llm_server import FakeLlmServer, reply, tool

    env = {"ANTHROPIC_API_KEY": "sk-ant-scorer-ahead"}
    hands_in = [
        reply(tool("bash", command="sleep 3")),
        reply(tool("bash", command='cp -r "$MLRB_DATA/base_model" submission')),
        reply(tool("bash", command="sleep 6")),  # the scorer imports meanwhile
        reply(tool("submit", summary="the base model")),
    ]
    with FakeLlmServer(hands_in) as server, ScorerSightings(tmp_path / "hands-in") as seen:
        result = run_cli(*store_args(tmp_path / "hands-in", plumbing_cache), PLUMBING, "agent=claude", cwd=tmp_path,
                         env={**env, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path / "hands-in")
    (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    assert run.data.tags["mlrb.valid"] == "True"
    trajectory = Path(run.data.tags["mlrb.run_dir"]) / "trajectory.jsonl"
    events = [json.loads(line) for line in trajectory.read_text().splitlines()]
    copied, slept = [e["time"] for e in events if e["event"] == "tool_result" and e["step"] in (2, 3)]
    assert seen.first is not None and copied <= seen.first < slept, (seen.first, copied, slept)

    nothing = [reply(tool("bash", command="sleep 3")), reply(tool("submit", summary="nothing"))]
    with FakeLlmServer(nothing) as server, ScorerSightings(tmp_path / "nothing") as seen:
        result = run_cli(*store_args(tmp_path / "nothing", plumbing_cache), PLUMBING, "agent=claude", cwd=tmp_path,
                         env={**env, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no submission" in result.stdout and seen.first is None
