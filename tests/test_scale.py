"""Scores on a sound scale (issue 34): the normalisation anchors honour the task's
direction, a failed attempt counts as doing nothing, and unlike runs are never pooled."""

from __future__ import annotations

import json

import pytest
from conftest import task_from_config, tiny_llm_merging

from mlrb.tasks.base import anchor_problem


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
    assert task.calibration(tmp_path)["reference_score"] is None  # higher is better: 2.0 does not beat 3.0
    task.cfg.higher_is_better = False
    assert task.calibration(tmp_path)["reference_score"] == 2.0


# ---- a failed attempt counts as doing nothing ------------------------------------------

ANCHORS = {"do_nothing_score": 0.30, "baseline_score": 0.55, "reference_score": 0.95}
DO_NOTHING_NORMALISED = 100 * (0.30 - 0.55) / (0.95 - 0.55)  # -62.5


def test_a_failed_attempt_counts_as_the_do_nothing_anchor_on_both_scales():
    from mlrb.run import counted_tags, summarise
    from mlrb.scoring.report import ScoreReport

    failed = ScoreReport.invalid("no submission: submission/ is empty")
    metrics = summarise(failed, ANCHORS)
    assert "score" not in metrics and "normalised_score" not in metrics  # the raw score: none
    assert metrics["counted_score"] == 0.30 and metrics["do_nothing_score"] == 0.30
    assert metrics["counted_normalised_score"] == pytest.approx(DO_NOTHING_NORMALISED)
    assert counted_tags(failed, ANCHORS) == {
        "mlrb.counted_as": "do_nothing",
        "mlrb.counted_reason": "no valid submission",
    }

    weak = ScoreReport(valid=True, reason="", score=0.40)  # below the baseline, above doing nothing
    metrics = summarise(weak, ANCHORS)
    assert metrics["score"] == metrics["counted_score"] == 0.40
    assert metrics["normalised_score"] == metrics["counted_normalised_score"] == pytest.approx(-37.5)
    assert counted_tags(weak, ANCHORS)["mlrb.counted_as"] == "score"


def test_a_valid_score_worse_than_doing_nothing_counts_as_doing_nothing():
    from mlrb.run import counted_tags, summarise
    from mlrb.scoring.report import ScoreReport

    awful = ScoreReport(valid=True, reason="", score=0.10)
    metrics = summarise(awful, ANCHORS)
    assert metrics["score"] == 0.10 and metrics["normalised_score"] == pytest.approx(-112.5)  # raw: as it scored
    assert metrics["counted_score"] == 0.30 and metrics["counted_normalised_score"] == pytest.approx(
        DO_NOTHING_NORMALISED
    )
    tags = counted_tags(awful, ANCHORS)
    assert tags["mlrb.counted_as"] == "do_nothing" and "worse than doing nothing" in tags["mlrb.counted_reason"]


def test_counting_follows_the_tasks_direction():
    from mlrb.counting import count

    loss = {"do_nothing_score": 6.0, "baseline_score": 4.0, "reference_score": 2.0}  # lower is better
    assert count(True, 5.0, loss, higher_is_better=False).score == 5.0  # worse than the baseline, better than nothing
    assert count(True, 7.0, loss, higher_is_better=False).score == 6.0  # worse than doing nothing
    failed = count(False, None, loss, higher_is_better=False)
    assert (failed.counted_as, failed.score, failed.normalised) == ("do_nothing", 6.0, pytest.approx(-100.0))
    improvement = count(False, None, loss, higher_is_better=False, normalisation="improvement")
    assert improvement.normalised == pytest.approx(-50.0)  # MLAgentBench: 50% worse than the baseline


def test_without_a_sound_do_nothing_anchor_nothing_is_counted():
    from mlrb.counting import count

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
    assert tiny_llm_merging().calibration(tmp_path) == ANCHORS
    task = task_from_config("llm_merging", do_nothing_score=0.25)
    assert task.calibration(tmp_path)["do_nothing_score"] == 0.25
