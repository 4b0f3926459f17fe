"""Per task x scale x agent x model x budget x sandbox x assets statistics, as the papers
report them; runs that differ in any of these are never pooled (RunRow.group).

- counted score, raw and normalised (MLRC-Bench's share of the baseline-to-reference
  gap, 0..100): mean +- SEM over every attempt, each as its run counted it
  (mlrb/analysis/counting.py): an attempt without a valid submission, or scoring worse than
  doing nothing, as the task's do-nothing anchor. A group with an attempt that has
  no counted score (a task without a do-nothing anchor, a run recorded before runs
  recorded one) has no counted mean: leaving such attempts out would count successes only.
  The normalised mean's SEM also carries the anchors' own (they are means over seeds,
  measured at asset build): every run of a group shares them, so more runs do not shrink it;
- raw score: mean +- SEM over the valid submissions (an invalid one has no score);
- success rate (MLAgentBench: more than 10% over the baseline) and valid-submission
  rate: over every attempt, as MLE-bench's medal and valid-submission rates are;
- cost (the model API's dollars, the compute's at the config's prices, their sum), GPU- and
  CPU-hours, tokens, wall time: means over the attempts that recorded them.

Runs that are not attempts (infrastructure errors, killed, running, crashed) are
counted and listed but never enter a mean or a rate: a broken scorer is not an
agent scoring 0. An invalid submission is: it is the agent's doing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mlrb.analysis.stats import sem
from mlrb.core.tags import Metric
from mlrb.report.runs import CAUSES, CONFINED, CRASHED, NOT_COUNTED, RUNNING, RunRow


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


@dataclass
class GroupStats:
    task: str
    scale: str
    agent: str
    budget: str
    runs: int
    attempts: int
    valid: int
    score_mean: float | None  # raw, over the valid submissions
    score_sem: float | None
    counted_mean: float | None  # over every attempt, as counted; None unless every attempt has a counted score
    counted_sem: float | None
    counted_normalised_mean: float | None
    counted_normalised_sem: float | None  # the runs' and the anchors' (below) together
    counted_normalised_anchor_sem: float | None  # the anchors' share alone (None: not measured over seeds)
    uncounted: int  # attempts without a counted score
    success_rate: float | None
    success_n: int
    valid_rate: float | None
    cost_usd_mean: float | None  # the model API's dollars
    compute_usd_mean: float | None  # the hardware's, at the config's prices (runs that priced it)
    total_usd_mean: float | None  # the two together
    gpu_hours_mean: float | None
    cpu_hours_mean: float | None
    input_tokens_mean: float | None
    output_tokens_mean: float | None
    wall_time_s_mean: float | None
    baseline_score: float | None
    reference_score: float | None
    budget_wall_time_s: float | None
    outcomes: dict[str, int] = field(default_factory=dict)  # kind -> runs
    scores: list[float] = field(default_factory=list)  # raw scores of the valid submissions
    confinement: str = CONFINED
    assets: str = ""
    normalised_as: str = "gap"  # a task's runs share it (see RunRow.normalised_as)
    model: str = ""
    sandbox: str = "?"
    # The rules its runs' task states but nothing enforces (their score cannot vouch for them),
    # and how many of its runs were recorded before runs recorded them.
    unenforced_rules: tuple[str, ...] = ()
    rules_unknown: int = 0
    # Runs at a plumbing scale (RunRow.plumbing): no mean of theirs is shown.
    plumbing: bool = False


def group_key_order(row_or_stats) -> tuple:
    wall = row_or_stats.budget_wall_time_s
    return (
        row_or_stats.task,
        row_or_stats.scale,
        row_or_stats.agent,
        row_or_stats.model,
        wall if wall is not None else math.inf,
        row_or_stats.budget,
        row_or_stats.sandbox,
        row_or_stats.confinement,
        row_or_stats.assets,
    )


def over_every_attempt(values: list[float | None]) -> tuple[float | None, float | None]:
    """(mean, SEM) of values that every attempt has; (None, None) when any lacks one."""
    if not values or any(v is None or math.isnan(v) for v in values):
        return None, None
    counted = [v for v in values if v is not None]
    return mean(counted), sem(counted)


def anchor_sem(
    raw_mean: float | None, baseline: float | None, reference: float | None, rows: list[RunRow]
) -> float | None:
    """The SEM that the anchors' own (`baseline_score_sem`, `reference_score_sem`: seed means)
    give a mean normalised score of 100 (raw_mean - b) / (r - b), to first order; None unless
    the runs recorded both anchors and an SEM for at least one."""
    b, r = baseline, reference
    sem_b = mean(present(x.metric(Metric.BASELINE_SCORE_SEM) for x in rows))
    sem_r = mean(present(x.metric(Metric.REFERENCE_SCORE_SEM) for x in rows))
    if raw_mean is None or b is None or r is None or r == b or (sem_b is None and sem_r is None):
        return None
    d_b = 100 * (raw_mean - r) / (r - b) ** 2  # d(normalised)/d(baseline)
    d_r = -100 * (raw_mean - b) / (r - b) ** 2  # d(normalised)/d(reference)
    return math.hypot(d_b * (sem_b or 0.0), d_r * (sem_r or 0.0))


def summarise_group(rows: list[RunRow]) -> GroupStats:
    attempts = [r for r in rows if r.is_attempt]
    scored = [r for r in attempts if r.scored]
    # A plumbing scale's runs check the harness: their scores mean nothing, so no mean shows one.
    scores = [] if rows[0].plumbing else present(r.score for r in scored)
    counted_mean, counted_sem = over_every_attempt([r.counted_score for r in attempts])
    normalised_mean, normalised_sem = over_every_attempt([r.counted_normalised for r in attempts])
    baseline = mean(present(r.metric(Metric.BASELINE_SCORE) for r in rows))
    reference = mean(present(r.metric(Metric.REFERENCE_SCORE) for r in rows))
    anchors_sem = anchor_sem(counted_mean, baseline, reference, rows) if rows[0].normalised_as == "gap" else None
    if normalised_sem is not None and anchors_sem is not None:
        normalised_sem = math.hypot(normalised_sem, anchors_sem)
    successes = present(r.success for r in attempts)
    first = rows[0]
    return GroupStats(
        task=first.task,
        scale=first.scale,
        agent=first.agent,
        budget=first.budget,
        runs=len(rows),
        attempts=len(attempts),
        valid=len(scored),
        score_mean=mean(scores),
        score_sem=sem(scores),
        counted_mean=counted_mean,
        counted_sem=counted_sem,
        counted_normalised_mean=normalised_mean,
        counted_normalised_sem=normalised_sem,
        counted_normalised_anchor_sem=anchors_sem,
        uncounted=sum(r.counted_score is None for r in attempts),
        success_rate=mean(successes),
        success_n=len(successes),
        valid_rate=len(scored) / len(attempts) if attempts else None,
        cost_usd_mean=mean(present(r.cost("api") for r in attempts)),
        compute_usd_mean=mean(present(r.cost("compute") for r in attempts)),
        total_usd_mean=mean(present(r.cost("total") for r in attempts)),
        gpu_hours_mean=mean(present(r.metric(Metric.GPU_HOURS) for r in attempts)),
        cpu_hours_mean=mean(present(r.metric(Metric.CPU_HOURS) for r in attempts)),
        input_tokens_mean=mean(present(r.metric(Metric.INPUT_TOKENS) for r in attempts)),
        output_tokens_mean=mean(present(r.metric(Metric.OUTPUT_TOKENS) for r in attempts)),
        wall_time_s_mean=mean(present(r.metric(Metric.WALL_TIME_S) for r in attempts)),
        baseline_score=baseline,
        reference_score=reference,
        budget_wall_time_s=next((r.budget_wall_time_s for r in rows if r.budget_wall_time_s is not None), None),
        outcomes=dict(Counter(r.kind for r in rows)),
        scores=scores,
        confinement=first.confinement,
        assets=first.assets,
        normalised_as=first.normalised_as,
        model=first.model,
        sandbox=first.sandbox,
        unenforced_rules=tuple(sorted({i for r in rows for i in r.unenforced_rules or ()})),
        rules_unknown=sum(r.unenforced_rules is None for r in rows),
        plumbing=first.plumbing,
    )


def cost_mean(s: GroupStats, kind: str) -> float | None:
    """The group's mean dollars per attempt of one kind (runs.COSTS: api, compute, total)."""
    return {"api": s.cost_usd_mean, "compute": s.compute_usd_mean, "total": s.total_usd_mean}[kind]


def summarise(rows: Iterable[RunRow]) -> list[GroupStats]:
    groups: dict[tuple, list[RunRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return sorted((summarise_group(g) for g in groups.values()), key=group_key_order)


@dataclass
class Cause:
    """Runs of one group that did not score, for one reason."""

    task: str
    scale: str
    agent: str
    budget: str
    kind: str
    detail: str
    runs: list[str]  # run names (seed included) for finding them in MLflow
    confinement: str = CONFINED
    assets: str = ""
    model: str = ""
    sandbox: str = "?"

    @property
    def count(self) -> int:
        return len(self.runs)


def why_not_scored(rows: Iterable[RunRow]) -> list[Cause]:
    """Every run without a valid score, grouped by group, cause and reason."""
    found: dict[tuple, Cause] = {}
    for row in rows:
        if row.scored:
            continue
        # Running and crashed runs differ in their age only: one line each per group.
        detail = "" if row.kind in (RUNNING, CRASHED) else row.detail
        key = (*row.group, row.kind, detail)
        if key not in found:
            found[key] = Cause(
                row.task,
                row.scale,
                row.agent,
                row.budget,
                row.kind,
                detail,
                [],
                row.confinement,
                row.assets,
                row.model,
                row.sandbox,
            )
        found[key].runs.append(row.name)
    order = {kind: i for i, kind in enumerate(CAUSES)}
    return sorted(
        found.values(),
        key=lambda c: (
            c.task,
            c.scale,
            c.agent,
            c.model,
            c.budget,
            c.sandbox,
            c.confinement,
            c.assets,
            order[c.kind],
            -c.count,
        ),
    )


def not_counted(rows: Iterable[RunRow]) -> list[RunRow]:
    """Runs kept out of every mean and rate, one by one."""
    order = {kind: i for i, kind in enumerate(NOT_COUNTED)}
    return sorted((r for r in rows if r.kind in NOT_COUNTED), key=lambda r: (order[r.kind], r.task, r.name))


def varying(stats: Sequence[GroupStats], attribute: str) -> bool:
    return len({getattr(s, attribute) for s in stats}) > 1


# What tells groups apart (RunRow.group), as GroupStats attributes.
GROUP_FIELDS = ("task", "scale", "agent", "model", "budget", "sandbox", "confinement", "assets")


def varying_fields(stats: Sequence[GroupStats]) -> list[str]:
    """The group fields whose values differ between these groups."""
    return [name for name in GROUP_FIELDS if varying(stats, name)]
