"""Scores on a sound scale (issue 34): the normalisation anchors honour the task's
direction, a failed attempt counts as doing nothing, and unlike runs are never pooled."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import task_from_config, tiny_llm_merging
from mlrb.tasks.anchors import anchor_problem

pytestmark = pytest.mark.fast


def test_a_reference_worse_than_the_baseline_in_the_tasks_direction_is_a_problem():
    # Accuracy: higher is better; the reference must score more.
    assert anchor_problem(0.5, 0.9) == ""
    assert "does not beat the baseline" in anchor_problem(0.5, 0.4)
    assert "does not beat the baseline" in anchor_problem(0.5, 0.5)
    # A loss: lower is better; the reference must score less.
    assert anchor_problem(3.0, 2.0, higher_is_better=False) == ""
    assert "does not beat the baseline" in anchor_problem(3.0, 4.0, higher_is_better=False)
    assert "does not beat the baseline" in anchor_problem(3.0, 3.0, higher_is_better=False)
    assert anchor_problem(None, 1.0) == "" and anchor_problem(1.0, None, higher_is_better=False) == ""


def test_a_lower_is_better_task_keeps_a_reference_below_its_baseline(tmp_path):
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "calibration.json").write_text(json.dumps({"baseline_score": 3.0, "reference_score": 2.0}))
    task = tiny_llm_merging()
    assert task.anchors.read(tmp_path)["reference_score"] is None  # higher is better: 2.0 does not beat 3.0
    lower_is_better = dataclasses.replace(task.anchors, higher_is_better=False)  # as a loss task's anchors are
    assert lower_is_better.read(tmp_path)["reference_score"] == 2.0


# ---- a failed attempt counts as doing nothing ------------------------------------------

ANCHORS = {"do_nothing_score": 0.30, "baseline_score": 0.55, "reference_score": 0.95}
DO_NOTHING_NORMALISED = 100 * (0.30 - 0.55) / (0.95 - 0.55)  # -62.5


def test_a_failed_attempt_counts_as_the_do_nothing_anchor_on_both_scales():
    from mlrb.analysis.counting import counted_tags, run_metrics
    from mlrb.scoring.report import ScoreReport

    failed = ScoreReport.invalid("no submission: submission/ is empty")
    metrics = run_metrics(failed, ANCHORS)
    assert "score" not in metrics and "normalised_score" not in metrics  # the raw score: none
    assert metrics["counted_score"] == 0.30 and metrics["do_nothing_score"] == 0.30
    assert metrics["counted_normalised_score"] == pytest.approx(DO_NOTHING_NORMALISED)
    assert counted_tags(failed, ANCHORS) == {
        "mlrb.counted_as": "do_nothing",
        "mlrb.counted_reason": "no valid submission",
    }

    weak = ScoreReport(valid=True, reason="", score=0.40)  # below the baseline, above doing nothing
    metrics = run_metrics(weak, ANCHORS)
    assert metrics["score"] == metrics["counted_score"] == 0.40
    assert metrics["normalised_score"] == metrics["counted_normalised_score"] == pytest.approx(-37.5)
    assert counted_tags(weak, ANCHORS)["mlrb.counted_as"] == "score"


def test_a_valid_score_worse_than_doing_nothing_counts_as_doing_nothing():
    from mlrb.analysis.counting import counted_tags, run_metrics
    from mlrb.scoring.report import ScoreReport

    awful = ScoreReport(valid=True, reason="", score=0.10)
    metrics = run_metrics(awful, ANCHORS)
    assert metrics["score"] == 0.10 and metrics["normalised_score"] == pytest.approx(-112.5)  # raw: as it scored
    assert metrics["counted_score"] == 0.30 and metrics["counted_normalised_score"] == pytest.approx(
        DO_NOTHING_NORMALISED
    )
    tags = counted_tags(awful, ANCHORS)
    assert tags["mlrb.counted_as"] == "do_nothing" and "worse than doing nothing" in tags["mlrb.counted_reason"]


def test_on_a_reward_scale_doing_nothing_is_the_baseline_and_a_failure_counts_as_nothing():
    """A Harbor task's reward: 0 doing nothing, 1 its own solution. Its baseline is doing nothing, so a
    failure counted at the floor earns nothing over it: counted, where a gap scale whose do-nothing ties
    its baseline counts no failure (failing would tie the baseline)."""
    from mlrb.analysis.counting import counted_tags, run_metrics
    from mlrb.scoring.report import ScoreReport

    reward = {"do_nothing_score": 0.0, "baseline_score": 0.0, "reference_score": 1.0}
    failed, half = ScoreReport.invalid("the verifier wrote no reward"), ScoreReport(valid=True, reason="", score=0.5)
    assert run_metrics(failed, reward, normalisation="reward")["counted_normalised_score"] == 0.0
    assert counted_tags(failed, reward, normalisation="reward")["mlrb.counted_as"] == "do_nothing"
    assert run_metrics(half, reward, normalisation="reward")["counted_normalised_score"] == 50.0
    assert "counted_score" not in run_metrics(failed, reward)  # as a gap: no failure counted
    assert counted_tags(failed, reward)["mlrb.counted_as"] == "none"


def test_counting_follows_the_tasks_direction():
    from mlrb.analysis.counting import count

    loss = {"do_nothing_score": 6.0, "baseline_score": 4.0, "reference_score": 2.0}  # lower is better
    assert count(True, 5.0, loss, higher_is_better=False).score == 5.0  # worse than the baseline, better than nothing
    assert count(True, 7.0, loss, higher_is_better=False).score == 6.0  # worse than doing nothing
    failed = count(False, None, loss, higher_is_better=False)
    assert (failed.counted_as, failed.score, failed.normalised) == ("do_nothing", 6.0, pytest.approx(-100.0))
    improvement = count(False, None, loss, higher_is_better=False, normalisation="improvement")
    assert improvement.normalised == pytest.approx(-50.0)  # MLAgentBench: 50% worse than the baseline


def test_without_a_sound_do_nothing_anchor_nothing_is_counted():
    from mlrb.analysis.counting import count

    # No do-nothing score (a folder task without a stated one; doing nothing was invalid):
    # neither the baseline nor leaving failures out would be honest.
    for valid, score in ((False, None), (True, 0.9)):
        counted = count(valid, score, {"baseline_score": 0.55, "reference_score": 0.95})
        assert (counted.counted_as, counted.score, counted.metrics()) == ("none", None, {})
        assert "no do-nothing score" in counted.reason
    # Doing nothing that does not score below the baseline: failing would beat the baseline.
    broken = count(False, None, {**ANCHORS, "do_nothing_score": 0.60})
    assert broken.counted_as == "none" and "does not score below the baseline" in broken.reason


def test_a_stated_do_nothing_score_wins_over_the_measured_one(tmp_path):
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "calibration.json").write_text(json.dumps(ANCHORS))
    assert tiny_llm_merging().anchors.read(tmp_path) == ANCHORS
    task = task_from_config("llm_merging", do_nothing_score=0.25)
    assert task.anchors.read(tmp_path)["do_nothing_score"] == 0.25


# ---- nothing beats the baseline by failing -------------------------------------------


def attempt(kind: str, name: str, report, **fields):
    """A report row for an attempt whose run recorded what counting.run_metrics gives for `report`."""
    from mlrb.analysis.counting import run_metrics
    from mlrb.report.runs import RunRow

    values = {"task": "t", "agent": "baseline", "budget": "smoke", "model": "", **fields}
    return RunRow(run_id=name, name=name, experiment="e", scale="tiny", seed="0", sweep_id="", mlflow_status="FINISHED",
                  kind=kind, detail="", valid=report.valid, metrics=run_metrics(report, ANCHORS), sandbox="bwrap",
                  confinement="confined", assets="aaaa", **values)  # fmt: skip


def test_an_agent_that_submits_nothing_never_ranks_above_one_that_submits_weak_work():
    from mlrb.report import aggregate, render
    from mlrb.scoring.report import ScoreReport

    nothing = ScoreReport.invalid("no submission: the agent left nothing at 'submission' in its workspace")
    weak = ScoreReport(valid=True, reason="", score=0.35)  # below the baseline (0.55), above doing nothing (0.30)
    awful = ScoreReport(valid=True, reason="", score=0.05)  # worse than doing nothing
    rows = [attempt("no_submission", f"quitter/{seed}", nothing, agent="quitter") for seed in range(3)]
    rows += [attempt("ok", f"honest/{seed}", weak, agent="honest") for seed in range(3)]
    rows += [attempt("ok", f"clumsy/{seed}", awful, agent="clumsy") for seed in range(3)]
    stats = {s.agent: s for s in aggregate.summarise(rows)}
    quitter, honest, clumsy = stats["quitter"], stats["honest"], stats["clumsy"]

    # Failing counts as doing nothing, exactly: never above it, and below the baseline (0).
    assert quitter.counted_mean == pytest.approx(ANCHORS["do_nothing_score"]) and quitter.valid == 0
    assert (
        quitter.counted_normalised_mean == pytest.approx(DO_NOTHING_NORMALISED) and quitter.counted_normalised_mean < 0
    )
    # Honest work that falls short of the baseline ranks above failing ...
    assert honest.counted_normalised_mean == pytest.approx(-50.0)
    assert honest.counted_normalised_mean > quitter.counted_normalised_mean
    # ... and work worse than doing nothing ties with it, never below.
    assert clumsy.counted_normalised_mean == quitter.counted_normalised_mean and clumsy.valid == 3
    assert clumsy.score_mean == pytest.approx(0.05)  # its raw score is still there, over its valid submissions

    # The report's table shows the counted means, and how many attempts were valid.
    table = render.results_table(list(stats.values()))
    cells = {row[table.headers.index("agent")]: row for row in table.rows}
    assert cells["quitter"][table.headers.index("counted normalised")] == "-62.5 ± 0.0 (n=3)"
    assert cells["quitter"][table.headers.index("valid")] == "0% (0/3)"
    assert cells["honest"][table.headers.index("counted normalised")] == "-50.0 ± 0.0 (n=3)"


def test_a_group_with_a_failure_averages_it_in_as_doing_nothing():
    from mlrb.report import aggregate
    from mlrb.scoring.report import ScoreReport

    good = ScoreReport(valid=True, reason="", score=0.75)  # normalised 50
    failed = ScoreReport.invalid("the submission cannot be loaded")
    (stats,) = aggregate.summarise([attempt("ok", "a", good), attempt("invalid", "b", failed)])
    assert stats.counted_mean == pytest.approx((0.75 + 0.30) / 2)
    assert stats.counted_normalised_mean == pytest.approx((50.0 + DO_NOTHING_NORMALISED) / 2)
    assert stats.score_mean == 0.75 and stats.valid == 1 and stats.valid_rate == 0.5


# ---- no pooling across unlike runs ----------------------------------------------------


def test_two_models_of_one_agent_are_two_rows():
    from mlrb.report import aggregate, render
    from mlrb.scoring.report import ScoreReport

    rows = [attempt("ok", f"{model}/{seed}", ScoreReport(valid=True, reason="", score=score), agent="llm", model=model)
            for model, score in (("gpt-x", 0.75), ("claude-y", 0.95)) for seed in range(2)]  # fmt: skip
    stats = aggregate.summarise(rows)
    assert sorted((s.model, s.attempts, s.counted_normalised_mean) for s in stats) == [
        ("claude-y", 2, pytest.approx(100.0)), ("gpt-x", 2, pytest.approx(50.0)),
    ]  # fmt: skip
    table = render.results_table(stats)
    assert table.headers[:3] == ["task", "agent", "model"]
    assert sorted(row[2] for row in table.rows) == ["claude-y", "gpt-x"]


def test_a_sweep_of_two_budgets_logs_one_aggregate_per_budget_on_its_parent():
    from mlrb.scoring.report import ScoreReport
    from mlrb.sweep_summary import parent_metrics

    good, failed = ScoreReport(valid=True, reason="", score=0.95), ScoreReport.invalid("no submission")
    rows = [attempt("ok", "1h/1", good, budget="1h"), attempt("ok", "1h/2", good, budget="1h"),
            attempt("no_submission", "smoke/1", failed, budget="smoke"),
            attempt("ok", "smoke/2", good, budget="smoke")]  # fmt: skip
    for r in rows:
        r.metrics["cost_usd"] = 1.0
    metrics = parent_metrics(rows)
    assert metrics["budget-1h/counted_normalised_score_mean"] == pytest.approx(100.0)
    assert metrics["budget-smoke/counted_normalised_score_mean"] == pytest.approx((100.0 + DO_NOTHING_NORMALISED) / 2)
    assert (metrics["budget-1h/n"], metrics["budget-smoke/n"], metrics["budget-smoke/n_valid"]) == (2, 2, 1)
    # nothing pooled over both budgets; the sweep's cost is a total, which does pool
    assert not any(key.startswith("counted") or key in ("n", "score_mean") for key in metrics)
    assert metrics["cost_usd_total"] == 4.0

    # A sweep of one configuration keeps plain names.
    one = parent_metrics(rows[:2])
    assert one["n"] == 2 and one["counted_normalised_score_mean"] == pytest.approx(100.0) and one["score_mean"] == 0.95
