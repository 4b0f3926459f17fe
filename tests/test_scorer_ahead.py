"""The scorer is started with the run, before there is anything to score, so that its imports
happen while the agent works (mlrb/scoring/runner.py Scorer): its time limit still counts from
the submission, a scorer nobody hands anything is stopped, it goes with a harness that dies,
and assets rebuilt in the meantime are the ones scored. It starts at once for the scripted
baseline, which runs a known solution; for any other agent once its workspace holds a
submission, so a run that hands nothing in starts none. Real bwrap sandboxes, the default
task's real assets at its plumbing scale."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import PLUMBING, REPO, mlflow_client, plumbing_llm_merging, run_cli, store_args
from mlrb.core.config import SandboxConfig
from mlrb.harness.assets import ensure_assets
from mlrb.scoring.runner import Scorer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def assets(plumbing_cache) -> Path:
    return ensure_assets(plumbing_llm_merging(), plumbing_cache)


def hidden_rows(assets: Path) -> int:
    """How many questions the hidden test set holds."""
    return len((assets / "hidden" / "test.jsonl").read_text().splitlines())


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
    task = plumbing_llm_merging()
    task.spec.score_timeout_s = 10  # the limit is on scoring, counted from the submission
    with Scorer(task, assets, tmp_path / "scoring", SandboxConfig()) as scorer:
        time.sleep(12)  # the agent's work: the scorer has imported torch and lm-eval meanwhile, then waited
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.details["n"] == hidden_rows(assets) and 0 < report.score < 1


def test_a_scorer_that_is_never_handed_a_submission_is_stopped(assets, tmp_path):
    scoring = tmp_path / "scoring"
    scorer = Scorer(plumbing_llm_merging(), assets, scoring, SandboxConfig())
    assert started_within(10, scoring)  # bwrap and the scorer inside it
    report = scorer.score(tmp_path / "nothing here")
    assert not report.valid and "no submission" in report.reason
    assert gone_within(5, scoring), processes_using(scoring)
    assert not (scoring / "scorer.log").exists()  # its imports' output, not a scoring's: no artifact
    assert scorer.score(submission_from(assets, tmp_path / "submission")).valid  # handed one after all: a fresh one
    scorer.close()

    failed = Scorer(plumbing_llm_merging(), assets, tmp_path / "failed", SandboxConfig())
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
            "from conftest import plumbing_llm_merging\n"
            "from mlrb.core.config import SandboxConfig\n"
            "from mlrb.scoring.runner import Scorer\n"
            f"Scorer(plumbing_llm_merging(), Path({str(assets)!r}), Path({str(scoring)!r}),"
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
    copy = tmp_path / "cache" / "llm_merging" / assets.name
    shutil.copytree(assets, copy)
    with Scorer(plumbing_llm_merging(), copy, tmp_path / "scoring", SandboxConfig()) as scorer:
        copy.rename(copy.with_name(copy.name + ".damaged"))
        shutil.copytree(copy.with_name(copy.name + ".damaged"), copy)
        test_set = copy / "hidden" / "test.jsonl"
        kept = hidden_rows(assets) // 2
        test_set.write_text("".join(test_set.read_text().splitlines(keepends=True)[:kept]))
        report = scorer.score(submission_from(assets, tmp_path / "submission"))
    assert report.valid, report.reason
    assert report.details["n"] == kept  # the rebuilt folder's test set, not all the items of the old one


def test_a_scorer_handed_a_second_submission_scores_it_afresh(assets, tmp_path):
    with Scorer(plumbing_llm_merging(), assets, tmp_path / "scoring", SandboxConfig(kind="unconfined")) as scorer:
        first = scorer.score(submission_from(assets, tmp_path / "first"))
        second = scorer.score(tmp_path / "first")
    assert first.valid and second.valid and second.score == first.score


def test_a_scorer_not_started_ahead_starts_when_asked_or_when_it_scores(assets, tmp_path):
    later = Scorer(plumbing_llm_merging(), assets, tmp_path / "later", SandboxConfig(), ahead=False)
    assert not started_within(2, tmp_path / "later")
    later.start_ahead()  # the run's call once the workspace holds a submission
    assert started_within(10, tmp_path / "later")
    assert later.score(submission_from(assets, tmp_path / "submission")).valid
    later.close()

    with Scorer(plumbing_llm_merging(), assets, tmp_path / "at-score", SandboxConfig(), ahead=False) as at_score:
        assert at_score.score(tmp_path / "submission").valid  # never asked ahead: it starts to score

    never = Scorer(plumbing_llm_merging(), assets, tmp_path / "never", SandboxConfig(), ahead=False)
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
