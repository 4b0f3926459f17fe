"""`python -m mlrb.report` over a store filled by real runs of the default task:
a 2-seed x 2-budget sweep, an agent that fails, one that hands in pickled weights,
and a run whose scorer crashes (an infrastructure error). The report's numbers are
checked against what MlflowClient says about the same runs (tiny scale: its means are
the calibrated ones; system tier). What the report writes and logs for a sweep, and its
answers to bad input, are checked on a sweep of the cheapest real task (conftest's HARNESS_TASK:
the task is incidental there; integration tier)."""

from __future__ import annotations

import csv
import math
import re
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, broken_copy_of, mlflow_client, run_cli, run_module

SMOKE_S, ONE_HOUR_S = 600.0, 3600.0


def report(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_module("mlrb.report", *args, cwd=cwd, timeout=300)


def read_csv(path: Path) -> list:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# A store takes minutes to fill: its tests go to one test process, which fills it once.
ONE_STORE = pytest.mark.xdist_group("report_store")
ONE_HARNESS_STORE = pytest.mark.xdist_group("report_harness_store")


@pytest.fixture(scope="module")
def store(tmp_path_factory, built_cache) -> Path:
    """A folder whose mlruns/ holds 7 real runs (6 attempts, 1 infrastructure failure) and a sweep parent."""
    root = tmp_path_factory.mktemp("report-store")

    def run(*args: str, cache: Path = built_cache, expect: int = 0) -> None:
        result = run_cli(*args, f"tracking.dir={root / 'mlruns'}", f"paths.cache_dir={cache}", cwd=root, timeout=900)
        assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-3000:]

    run("-m", "seed=1,2", "budget=smoke,1h", f"hydra.sweep.dir={root / 'sweep'}")
    run("seed=3", "budget=1h", "task.scales.tiny.baseline_command='echo giving up >&2; exit 3'",
        f"hydra.run.dir={root / 'run3'}")  # fmt: skip
    run("seed=4", "task.scales.tiny.baseline_command='mkdir -p submission && echo junk > submission/model.bin'",
        f"hydra.run.dir={root / 'run4'}")  # fmt: skip
    # The scorer itself breaks on a corrupt hidden test set: an infrastructure error, not the agent's.
    broken = broken_copy_of(built_cache, root / "broken-cache")
    run("seed=5", f"hydra.run.dir={root / 'run5'}", cache=broken, expect=1)
    return root


@pytest.fixture(scope="module")
def harness_store(tmp_path_factory, cache_dir) -> Path:
    """A folder whose mlruns/ holds a 2-seed x 2-budget sweep of the cheapest real task (HARNESS_TASK,
    the baseline agent: the given train.py): 4 runs and their parent."""
    root = tmp_path_factory.mktemp("report-harness-store")
    result = run_cli("-m", *HARNESS_TASK, "seed=1,2", "budget=smoke,1h", f"hydra.sweep.dir={root / 'sweep'}",
                     f"tracking.dir={root / 'mlruns'}", f"paths.cache_dir={cache_dir}", cwd=root,
                     timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return root


def runs_of(store: Path, experiment_name: str = "llm_merging"):
    client = mlflow_client(store)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    return (
        client,
        [r for r in runs if r.data.tags.get("mlrb.role") != "sweep"],
        [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"],
    )


def expected(runs, budget: str, assets: str) -> dict:
    """The group's numbers, computed straight from the runs' MLflow metrics and tags."""
    group = [
        r for r in runs if r.data.tags["mlrb.budget"] == budget and r.data.tags["mlrb.assets_fingerprint"] == assets
    ]
    attempts = [r for r in group if r.info.status == "FINISHED"]
    valid = [r for r in attempts if r.data.tags["mlrb.valid"] == "True"]
    scores = [r.data.metrics["score"] for r in valid]
    counted = [r.data.metrics["counted_score"] for r in attempts]
    normalised = [r.data.metrics["counted_normalised_score"] for r in attempts]
    # an attempt without a valid submission counted as doing nothing
    assert all(
        r.data.metrics["counted_score"] == r.data.metrics["do_nothing_score"] for r in attempts if r not in valid
    )
    success = [r.data.metrics["success"] if r in valid else 0.0 for r in attempts]
    return {
        "runs": len(group),
        "attempts": len(attempts),
        "valid": len(valid),
        "score_mean": statistics.mean(scores),
        "score_sem": statistics.stdev(scores) / math.sqrt(len(scores)),
        "counted_mean": statistics.mean(counted),
        "counted_sem": statistics.stdev(counted) / math.sqrt(len(counted)),
        "counted_normalised_mean": statistics.mean(normalised),
        "counted_normalised_sem": statistics.stdev(normalised) / math.sqrt(len(normalised)),
        "success_rate": statistics.mean(success),
        "valid_rate": len(valid) / len(attempts),
        "cost_usd_mean": statistics.mean(r.data.metrics["cost_usd"] for r in attempts),
        "wall_time_s_mean": statistics.mean(r.data.metrics["wall_time_s"] for r in attempts),
    }


@pytest.mark.system
@ONE_STORE
def test_the_report_matches_the_runs_and_keeps_the_infrastructure_failure_out(store, tmp_path):
    out = tmp_path / "report"
    result = report("--out", str(out), cwd=store)  # the store found as the harness would: ./mlruns
    assert result.returncode == 0, result.stderr[-3000:]
    _, runs, _ = runs_of(store)
    (failed,) = [r for r in runs if r.info.status == "FAILED"]
    assert failed.data.tags["mlrb.status"] == "infra_error" and "ScorerError" in failed.data.tags["mlrb.error"]

    # Seed 5 ran on a broken copy of the assets: another fingerprint, so a row of its own.
    good = next(r.data.tags["mlrb.assets_fingerprint"] for r in runs if r is not failed)
    rows = read_csv(out / "summary.csv")
    summary = {row["budget"]: row for row in rows if row["assets"] == good}
    (broken,) = [row for row in rows if row["assets"] != good]
    assert set(summary) == {"smoke", "1h"} and broken["assets"] == failed.data.tags["mlrb.assets_fingerprint"]
    for budget in ("smoke", "1h"):
        want, got = expected(runs, budget, good), summary[budget]
        for key, value in want.items():
            assert float(got[key]) == pytest.approx(value, abs=1e-9), (budget, key)
    # smoke: seeds 1, 2 scored, seed 4 invalid; seed 5 an infrastructure error that is no attempt.
    assert (summary["smoke"]["runs"], summary["smoke"]["attempts"], summary["smoke"]["valid"]) == ("3", "3", "2")
    assert summary["smoke"]["invalid"] == "1"
    assert (broken["budget"], broken["runs"], broken["attempts"], broken["infra_error"]) == ("smoke", "1", "0", "1")
    assert (summary["1h"]["attempts"], summary["1h"]["agent_error"]) == ("3", "1")
    assert (
        float(summary["1h"]["budget_wall_time_s"]) == ONE_HOUR_S
        and float(summary["smoke"]["budget_wall_time_s"]) == SMOKE_S
    )

    per_run = {row["run_id"]: row for row in read_csv(out / "runs.csv")}
    assert len(per_run) == 7
    assert per_run[failed.info.run_id]["counted"] == "False" and per_run[failed.info.run_id]["score"] == ""

    causes = read_csv(out / "not_scored.csv")
    kinds = {(c["budget"], c["cause"]) for c in causes}
    assert kinds == {("smoke", "invalid"), ("smoke", "infra_error"), ("1h", "agent_error")}
    (invalid,) = [c for c in causes if c["cause"] == "invalid"]
    assert "pickled weights" in invalid["reason"] and invalid["which"] == "llm_merging/baseline/smoke/4"
    (infra,) = [c for c in causes if c["cause"] == "infra_error"]
    assert "ScorerError" in infra["reason"]

    markdown = (out / "summary.md").read_text()
    smoke_row = next(
        line for line in markdown.splitlines() if line.startswith(f"| llm_merging | baseline | smoke | {good} |")
    )
    want = expected(runs, "smoke", good)
    # counted over all three attempts (the invalid one as doing nothing); the valid score over the two valid ones
    assert f"| 3 (3) | {want['counted_mean']:.4g} ± {want['counted_sem']:.2g} (n=3) |" in smoke_row
    assert f"| 67% (2/3) | {want['score_mean']:.4g} ± {want['score_sem']:.2g} (n=2) |" in smoke_row
    broken_row = next(
        line
        for line in markdown.splitlines()
        if line.startswith(f"| llm_merging | baseline | smoke | {broken['assets']} |")
    )
    assert "1 infrastructure error" in broken_row
    not_counted = markdown.split("## Runs not counted", 1)[1]
    assert failed.info.run_id in not_counted and "ScorerError" in not_counted
    assert result.stdout.count("| llm_merging |") == 3  # the table is printed too

    for name in ("score_by_task.png", "score_vs_budget.png", "score_vs_cost.png", "cost_score_pareto.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "not logged to MLflow" in result.stdout  # these runs are not all of one sweep


@pytest.mark.integration
@ONE_HARNESS_STORE
def test_a_sweeps_report_is_logged_on_its_parent_run_with_a_self_contained_page(harness_store, tmp_path):
    store = harness_store
    client, runs, (parent,) = runs_of(store, HARNESS_EXPERIMENT)
    assert {r.data.tags["mlrb.scale"] for r in runs} == {"folder"}  # a task folder's one scale
    sweep_id = parent.data.tags["mlrb.sweep_id"]
    out = tmp_path / "report"
    result = report(
        "--sweep", sweep_id, "--html", "--tracking-dir", str(store / "mlruns"), "--out", str(out), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]

    summary = read_csv(out / "summary.csv")
    assert [(row["budget"], row["runs"], row["attempts"]) for row in summary] == [("smoke", "2", "2"), ("1h", "2", "2")]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {f"report/{name}" for name in ("summary.md", "summary.csv", "runs.csv", "not_scored.csv", "report.html",
                                          "score_by_task.png", "score_vs_budget.png", "score_vs_cost.png")} <= logged  # fmt: skip
    note = client.get_run(parent.info.run_id).data.tags["mlflow.note.content"]
    assert f"mlrb report: sweep {sweep_id}" in note and f"| {HARNESS_EXPERIMENT} | baseline | smoke | 2 (2) |" in note
    # and they are lines of the sweep's own record first, as a run's facts are: a sync rebuilds them
    from mlrb.store import record

    sweep_record = record.fold(record.read(Path(parent.data.tags["mlrb.run_dir"])))
    assert sweep_record["tags"]["mlflow.note.content"] == note and sweep_record["status"] == "FINISHED"
    assert {(Path(file).name, folder) for file, folder, _ in sweep_record["artifacts"]} >= {
        ("summary.md", "report"),
        ("report.html", "report"),
    }

    page = (out / "report.html").read_text()
    # plots inlined, every one: the three above. Cost against score (cost_score_pareto.png) needs counted
    # scores, and these runs have none: the folder's anchors are its baseline alone, no do-nothing score
    # (its starting workspace has no submission.csv, so doing nothing is invalid), hence no floor to count on.
    assert {r.data.tags["mlrb.counted_as"] for r in runs} == {"none"}
    assert not any("counted_score" in r.data.metrics or "do_nothing_score" in r.data.metrics for r in runs)
    assert page.count("<img ") == page.count('src="data:image/png;base64,') == 3
    assert 'src="score' not in page and 'src="cost' not in page
    assert f"<td>{HARNESS_EXPERIMENT}</td>" in page and f"sweep {sweep_id}" in page


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
@ONE_HARNESS_STORE
def test_bad_input_is_one_clear_line_and_a_failure(harness_store, tmp_path):
    store = harness_store
    cases = {
        f"unknown experiment 'nope'; experiments in the store: Default, {HARNESS_EXPERIMENT}": ["--experiment", "nope"],
        "no runs match (filters: task nope)": ["--task", "nope"],
        "no runs match (filters: agent baseline; budget 24h)": ["--agent", "baseline", "--budget", "24h"],
        f"no tracking store at {tmp_path / 'missing' / 'mlflow.db'}": ["--tracking-dir", str(tmp_path / "missing")],
        "the server does not answer": ["--tracking-uri", f"http://alice:s3cret@127.0.0.1:{free_port()}"],
    }
    for message, args in cases.items():
        tracking = [] if any(a.startswith("--tracking") for a in args) else ["--tracking-dir", str(store / "mlruns")]
        result = report(*args, *tracking, "--out", str(tmp_path / "out"), cwd=tmp_path)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mlrb.report: error: ") and message in lines[0], (args, lines)
        assert "s3cret" not in result.stderr + result.stdout
    assert not (tmp_path / "missing").exists(), "a report never creates a store"


@pytest.mark.fast
def test_help_is_fast_and_imports_neither_mlflow_nor_matplotlib():
    probe = "import sys; from mlrb.report.cli import parser; parser(); print(sorted(m for m in ('mlflow', 'matplotlib') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
    helped = report("--help", cwd=Path.cwd())
    assert helped.returncode == 0 and "--sweep" in helped.stdout and "--tracking-uri" in helped.stdout


# ---- the aggregation, on rows made by hand -------------------------------------------------

from mlrb.core.status import Status  # noqa: E402
from mlrb.report import aggregate, render  # noqa: E402
from mlrb.report.runs import ATTEMPTS, CAUSES, NOT_COUNTED, RunRow, classify  # noqa: E402

CALIBRATION = {"baseline_score": 0.45, "reference_score": 0.95}


def row(kind: str, name: str, budget: str = "smoke", valid: bool = False, **metrics: float) -> RunRow:
    status = {"infra_error": "FAILED", "killed": "KILLED", "running": "RUNNING", "crashed": "RUNNING"}.get(
        kind, "FINISHED"
    )
    return RunRow(run_id=name, name=name, experiment="e", task="t", agent="a", budget=budget, scale="tiny", seed="0",
                  sweep_id="", mlflow_status=status, kind=kind, detail=f"why {name}", valid=valid, metrics=metrics,
                  budget_wall_time_s=600.0)  # fmt: skip


@pytest.mark.fast
def test_invalid_attempts_count_as_they_were_counted_and_infrastructure_runs_not_at_all():
    rows = [
        row(
            "ok",
            "s1",
            valid=True,
            score=0.5,
            normalised_score=10.0,
            counted_score=0.5,
            counted_normalised_score=10.0,
            success=1.0,
            cost_usd=2.0,
            wall_time_s=10.0,
            **CALIBRATION,
        ),
        row(
            "budget_exhausted",
            "s2",
            valid=True,
            score=0.7,
            normalised_score=50.0,
            counted_score=0.7,
            counted_normalised_score=50.0,
            success=1.0,
            cost_usd=4.0,
            wall_time_s=30.0,
            **CALIBRATION,
        ),
        # counted as doing nothing, as its run recorded (0.3: -30 on the normalised scale)
        row(
            "invalid",
            "bad",
            counted_score=0.3,
            counted_normalised_score=-30.0,
            cost_usd=3.0,
            wall_time_s=20.0,
            **CALIBRATION,
        ),
        row("infra_error", "broken"),
        row("running", "busy"),
        row("crashed", "gone"),
    ]
    (stats,) = aggregate.summarise(rows)
    assert (stats.runs, stats.attempts, stats.valid) == (6, 3, 2)
    assert stats.score_mean == pytest.approx(0.6) and stats.score_sem == pytest.approx(0.1)
    assert stats.counted_mean == pytest.approx(0.5) and stats.uncounted == 0
    assert stats.counted_normalised_mean == pytest.approx(10.0)
    assert stats.counted_normalised_sem == pytest.approx(statistics.stdev([10.0, 50.0, -30.0]) / math.sqrt(3))
    assert stats.success_rate == pytest.approx(2 / 3) and stats.valid_rate == pytest.approx(2 / 3)
    assert stats.cost_usd_mean == pytest.approx(3.0) and stats.wall_time_s_mean == pytest.approx(20.0)
    assert stats.outcomes == {
        "ok": 1,
        "budget_exhausted": 1,
        "invalid": 1,
        "infra_error": 1,
        "running": 1,
        "crashed": 1,
    }

    assert [r.name for r in aggregate.not_counted(rows)] == ["broken", "gone", "busy"]
    causes = aggregate.why_not_scored(rows)
    assert [(c.kind, c.runs) for c in causes] == [
        ("invalid", ["bad"]), ("infra_error", ["broken"]), ("crashed", ["gone"]), ("running", ["busy"]),
    ]  # fmt: skip


@pytest.mark.fast
def test_one_run_has_no_error_bar_and_an_uncalibrated_task_no_normalised_score():
    (stats,) = aggregate.summarise([row("ok", "only", valid=True, score=0.5), row("agent_error", "quit")])
    assert stats.score_mean == 0.5 and stats.score_sem is None
    assert stats.success_rate is None  # no baseline known: nothing to compare with
    # no counted score recorded (no do-nothing anchor): no counted mean, rather than one over the valid run alone
    assert (stats.counted_mean, stats.counted_normalised_mean, stats.uncounted) == (None, None, 2)
    table = render.results_table([stats])
    assert table.rows[0][table.headers.index("counted score")] == "- (2 of 2 uncounted)"
    assert stats.valid_rate == 0.5
    assert aggregate.sem([]) is None and aggregate.mean([]) is None


@pytest.mark.fast
def test_every_kind_is_either_an_attempt_or_not_counted():
    assert set(ATTEMPTS) | set(NOT_COUNTED) == set(CAUSES) | {"ok"}
    assert not set(ATTEMPTS) & set(NOT_COUNTED)
    assert set(ATTEMPTS) | {"infra_error", "killed"} == {s.value for s in Status}  # the report reads every status
    assert set(render.KIND_LABELS) == {s.value for s in Status} | {"running", "crashed"}


def mlflow_run(status: str, tags: dict, start_s: float, params: dict | None = None):
    from mlflow.entities import Param, Run, RunData, RunInfo, RunTag

    info = RunInfo(run_id="r1", experiment_id="1", user_id="u", status=status, start_time=int(start_s * 1000),
                   end_time=None, lifecycle_stage="active", run_name="t/a/0")  # fmt: skip
    data = RunData(
        params=[Param(k, v) for k, v in (params or {}).items()], tags=[RunTag(k, v) for k, v in tags.items()]
    )
    return Run(info, data)


@pytest.mark.fast
def test_runs_are_classified_from_their_status_and_tags():
    now = 1_000_000.0
    assert classify(mlflow_run("RUNNING", {}, now - 60), None, now)[0] == "running"
    kind, detail, _ = classify(mlflow_run("RUNNING", {}, now - 60), "FINISHED", now)
    assert kind == "crashed" and "its sweep has ended" in detail
    old = mlflow_run("RUNNING", {}, now - 5 * 3600, {"budget.wall_time_s": "600.0"})
    assert classify(old, None, now)[0] == "crashed"
    assert classify(old, "RUNNING", now)[0] == "running"  # its sweep still runs: maybe queued behind others
    assert classify(mlflow_run("FAILED", {"mlrb.error": "ScorerError: boom\ntrace"}, now), None, now) == (
        "infra_error", "ScorerError: boom", False,
    )  # fmt: skip
    assert classify(mlflow_run("KILLED", {"mlrb.status": "killed"}, now), None, now)[0] == "killed"
    out_of_time = {"mlrb.status": "budget_exhausted", "mlrb.stop_reason": "wall_time", "mlrb.valid": "False",
                   "mlrb.invalid_reason": "no submission"}  # fmt: skip
    assert classify(mlflow_run("FINISHED", out_of_time, now), None, now) == (
        "budget_exhausted", "stopped at the wall_time limit; no submission", False,
    )  # fmt: skip
    assert classify(mlflow_run("FINISHED", {**out_of_time, "mlrb.valid": "True"}, now), None, now) == (
        "budget_exhausted", "", True,
    )  # fmt: skip
    # Runs recorded before the status vocabulary said "submitted": their validity decides.
    legacy = {"mlrb.status": "submitted", "mlrb.valid": "False", "mlrb.invalid_reason": "no submission: nothing"}
    assert classify(mlflow_run("FINISHED", legacy, now), None, now)[:2] == ("no_submission", "no submission: nothing")
    assert classify(mlflow_run("FINISHED", {**legacy, "mlrb.valid": "True"}, now), None, now) == ("ok", "", True)


@pytest.mark.fast
def test_unconfined_runs_and_runs_on_other_assets_are_never_pooled():
    from mlrb.report.render import key_columns, results_table
    from mlrb.report.runs import confinement

    confined = [row("ok", f"c{i}", valid=True, score=0.5) for i in range(2)]
    for r in confined:
        r.sandbox, r.confinement, r.assets = "bwrap", "confined", "aaaa"
    unconfined = row("ok", "u", valid=True, score=1.0)
    unconfined.sandbox, unconfined.confinement, unconfined.assets = "unconfined", "unconfined", "aaaa"
    other_assets = row("ok", "o", valid=True, score=0.9)
    other_assets.sandbox, other_assets.confinement, other_assets.assets = "docker", "confined", "bbbb"
    stats = aggregate.summarise([*confined, unconfined, other_assets])
    assert sorted((s.confinement, s.assets, s.runs, s.score_mean) for s in stats) == [
        ("confined", "aaaa", 2, 0.5), ("confined", "bbbb", 1, 0.9), ("unconfined", "aaaa", 1, 1.0),
    ]  # fmt: skip
    assert key_columns(stats) == ["task", "agent", "sandbox", "confinement", "assets"]
    table = results_table(stats)
    assert sorted(tuple(cells[2:5]) for cells in table.rows) == [
        ("bwrap", "confined", "aaaa"), ("docker", "confined", "bbbb"), ("unconfined", "unconfined", "aaaa"),
    ]  # fmt: skip
    # one kind alone still says when it is unconfined
    (alone,) = aggregate.summarise([unconfined])
    assert key_columns([alone]) == ["task", "agent", "confinement"]
    # runs recorded before the tag existed
    assert (
        confinement({"mlrb.sandbox": "local"}) == "unconfined" and confinement({"mlrb.sandbox": "docker"}) == "confined"
    )
    assert confinement({"mlrb.sandbox": "bwrap", "mlrb.confined": "true"}) == "confined"


@pytest.mark.fast
def test_rows_say_what_their_normalised_score_is_when_tasks_normalise_differently():
    from mlrb.report.render import results_table

    built_in = row("ok", "b", valid=True, score=0.6, normalised_score=20.0)
    mlab = row("ok", "m", valid=True, score=3.1, normalised_score=12.5)
    mlab.task, mlab.normalised_as = "house-price", "improvement"
    mlrc = row("ok", "r", valid=True, score=0.95, normalised_score=87.5)
    mlrc.task, mlrc.normalised_as = "mlrc-mini", "human_gap"
    table = results_table(aggregate.summarise([built_in, mlab, mlrc]))
    column = table.headers.index("normalised as")
    assert table.headers[column - 1] == "counted normalised"
    named = {cells[0]: cells[column] for cells in table.rows}
    assert named == {"t": "% of baseline-to-reference gap closed",
                     "house-price": "MLAgentBench improvement over baseline, %",
                     "mlrc-mini": "MLRC-Bench relative improvement to human, %"}  # fmt: skip
    # built-in tasks alone: the legend says what normalised means, no extra column
    assert "normalised as" not in results_table(aggregate.summarise([built_in])).headers


@pytest.mark.fast
def test_the_results_table_opens_with_short_column_notes_and_points_to_the_docs():
    """A summary's first table comes after a few short notes, one per column that needs one, and a
    pointer to the Reports page, which explains them; not a paragraph to read before the figures."""
    from mlrb.report.render import HOW_TO_READ, results_table

    headers = results_table(aggregate.summarise([row("ok", "b", valid=True, score=0.6)])).headers
    notes = re.findall(r"\*([^*]+)\*[^:]*:([^*]+?)(?= \*|$)", HOW_TO_READ)
    assert {name for name, _ in notes} <= set(headers) | {"normalised as"}
    assert {"runs (attempts)", "counted score", "counted normalised", "valid score"} <= {name for name, _ in notes}
    sentences = [s for s in re.split(r"(?<=\.) ", HOW_TO_READ) if s]
    assert len(HOW_TO_READ.split()) <= 90 and max(len(s.split()) for s in sentences) <= 20, sentences
    assert sentences[-1] == "The Reports page of the docs (docs/reports.md) explains each column."
