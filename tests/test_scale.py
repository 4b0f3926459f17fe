"""Scores on a sound scale (issue 34): the normalisation anchors honour the task's
direction, a failed attempt counts as doing nothing, and unlike runs are never pooled."""

from __future__ import annotations

import json

from conftest import tiny_llm_merging

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
