"""How an attempt counts in means.

An attempt that does not end in a valid submission scored nothing, and submitting
nothing must not beat honest work that falls short: it counts as the task's
*do-nothing* anchor (the starting point submitted unchanged, scored at asset build),
on the raw and the normalised scale. A valid score worse than doing nothing counts as
doing nothing too. Runs keep their raw `score` / `normalised_score`; the counted ones
are `counted_score` / `counted_normalised_score`, and the `mlrb.counted_as` tag says
which it was (`score`, `do_nothing`, or `none`) with `mlrb.counted_reason` saying why.

A task without a do-nothing score (none measured or stated, or doing nothing was an
invalid submission at asset build) has no counted score at all: counting its failures
as the baseline would let failing tie or beat the baseline, and leaving them out would
count the successes only. The same holds when the do-nothing anchor does not score
below the baseline: failing would then beat the baseline.

Pure arithmetic: imported by the run, the report and the sweep summary alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from mlrb.core.tags import Metric, Tag

SCORE, DO_NOTHING, NONE = "score", "do_nothing", "none"  # the values of the `mlrb.counted_as` tag
SUCCESS_IMPROVEMENT = 0.10  # MLAgentBench: success = more than 10% better than the baseline
# Why a run at a plumbing scale (a task's `plumbing`: assets built in seconds) counts as nothing.
PLUMBING = "a plumbing scale: its runs check that the harness works and measure nothing"


def normalise(
    score: float,
    baseline: float | None,
    reference: float | None,
    higher_is_better: bool = True,
    normalisation: str = "gap",
) -> float | None:
    """ "gap": 0 = baseline, 100 = reference (MLRC-Bench); "improvement": percent better than
    the baseline (MLAgentBench); "reward": a gap whose baseline is doing nothing (a Harbor task's
    reward: 0 nothing, 100 its own solution). None when the anchors do not define the scale."""
    if normalisation in ("gap", "reward"):
        if baseline is None or reference is None or reference == baseline:
            return None
        return 100.0 * (score - baseline) / (reference - baseline)
    if normalisation == "improvement" and baseline:
        direction = 1.0 if higher_is_better else -1.0
        return 100.0 * direction * (score - baseline) / abs(baseline)
    return None


def worse(a: float, b: float, higher_is_better: bool) -> bool:
    """Whether score `a` is worse than `b` in the task's direction."""
    return a < b if higher_is_better else a > b


def floor_problem(
    do_nothing: float | None, baseline: float | None, higher_is_better: bool, normalisation: str = "gap"
) -> str:
    """Why the do-nothing anchor cannot be the floor, or "". On a "reward" scale the baseline is
    doing nothing itself: a failure counted as doing nothing earns nothing over it."""
    if do_nothing is None:
        return "the task has no do-nothing score (none measured or stated, or doing nothing was invalid)"
    if normalisation == "reward":
        return ""
    if baseline is not None and not worse(do_nothing, baseline, higher_is_better):
        return f"doing nothing ({do_nothing:.4g}) does not score below the baseline ({baseline:.4g})"
    return ""


@dataclass(frozen=True)
class Counted:
    """What an attempt counts as in means: `counted_as` is SCORE, DO_NOTHING or NONE."""

    counted_as: str
    reason: str
    score: float | None = None
    normalised: float | None = None

    def metrics(self) -> dict[str, float]:
        values = {Metric.COUNTED_SCORE: self.score, Metric.COUNTED_NORMALISED_SCORE: self.normalised}
        return {key: value for key, value in values.items() if value is not None}


def count(
    valid: bool,
    score: float | None,
    calibration: dict[str, float | None],
    higher_is_better: bool = True,
    normalisation: str = "gap",
) -> Counted:
    """How one attempt counts, from its validity and raw score and the task's anchors
    (`do_nothing_score`, `baseline_score`, `reference_score`)."""
    do_nothing, baseline = calibration.get(Metric.DO_NOTHING_SCORE), calibration.get(Metric.BASELINE_SCORE)
    problem = floor_problem(do_nothing, baseline, higher_is_better, normalisation)
    if problem:
        return Counted(NONE, problem)
    assert do_nothing is not None  # (floor_problem said so)
    if not valid or score is None:
        counted_as, reason, counted = DO_NOTHING, "no valid submission", do_nothing
    elif worse(score, do_nothing, higher_is_better):
        counted_as, counted = DO_NOTHING, do_nothing
        reason = f"its score ({score:.4g}) is worse than doing nothing ({do_nothing:.4g})"
    else:
        counted_as, reason, counted = SCORE, "", score
    reference = calibration.get(Metric.REFERENCE_SCORE)
    return Counted(
        counted_as, reason, counted, normalise(counted, baseline, reference, higher_is_better, normalisation)
    )


class Scored(Protocol):
    """What counting reads of a score report (mlrb.scoring.report.ScoreReport)."""

    valid: bool
    score: float | None


def run_metrics(
    report: Scored, calibration: dict[str, float | None], higher_is_better: bool = True, normalisation: str = "gap"
) -> dict[str, float]:
    """Score, its normalised form, MLAgentBench's success flag, and how the attempt counts in
    means (`count`): a run's metrics. Normalised: "gap", 0 = baseline, 100 = reference; "improvement"
    (MLAgentBench), percent better than the baseline."""
    baseline, reference = calibration.get(Metric.BASELINE_SCORE), calibration.get(Metric.REFERENCE_SCORE)
    metrics: dict[str, float] = {Metric.VALID: float(report.valid)}
    for anchor in Metric.ANCHORS:
        value = calibration.get(anchor)
        if value is not None:
            metrics[anchor] = value
    # The measured anchors' SEM over their seeds: the report carries it into its intervals.
    for anchor, score, name in (
        ("baseline", Metric.BASELINE_SCORE, Metric.BASELINE_SCORE_SEM),
        ("reference", Metric.REFERENCE_SCORE, Metric.REFERENCE_SCORE_SEM),
    ):
        sem = calibration.get(f"{anchor}_sem")
        if sem is not None and calibration.get(score) is not None:
            metrics[name] = sem
    metrics.update(count(report.valid, report.score, calibration, higher_is_better, normalisation).metrics())
    if not report.valid or report.score is None:
        return metrics
    metrics[Metric.SCORE] = report.score
    normalised = normalise(report.score, baseline, reference, higher_is_better, normalisation)
    if normalised is not None:
        metrics[Metric.NORMALISED_SCORE] = normalised
    if baseline:
        direction = 1.0 if higher_is_better else -1.0
        improvement = direction * (report.score - baseline) / abs(baseline)
        metrics[Metric.IMPROVEMENT] = improvement
        metrics[Metric.SUCCESS] = float(improvement > SUCCESS_IMPROVEMENT)
    return metrics


def counted_tags(
    report: Scored,
    calibration: dict[str, float | None],
    higher_is_better: bool = True,
    plumbing: bool = False,
    normalisation: str = "gap",
) -> dict:
    """How the attempt counts in means, and why (the `mlrb.counted_as` and `mlrb.counted_reason` tags)."""
    if plumbing:
        return {Tag.COUNTED_AS: NONE, Tag.COUNTED_REASON: PLUMBING}
    counted = count(report.valid, report.score, calibration, higher_is_better, normalisation)
    return {Tag.COUNTED_AS: counted.counted_as, Tag.COUNTED_REASON: counted.reason}
