"""What a sweep says when it ends: one table of its runs, the statistics per
configuration, the failures by kind, and where to see it all in MLflow.

The figures are read back from the tracking store (the jobs ran in other
processes) and computed as `python -m mlrb.report` computes them, so the two
always agree. Each configuration's aggregates (one per report row: runs unlike in
task, scale, agent, model, budget, sandbox or assets never pool) are also logged as
its parent run's metrics, so sweeps compare side by side in the MLflow UI.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlrb.core.messages import duration
from mlrb.core.tags import Metric
from mlrb.report import aggregate, flagged, render
from mlrb.report.runs import Filters, RunRow, load

TASKS_MEAN = "tasks_mean"  # the parent's metric: the mean over a sweep's tasks (tasks_mean_lines)
FLAGGED_RUNS = "flagged_runs"  # the parent's metric: its runs that their review flagged (suspicious or tampering)


@dataclass
class SweepSummary:
    rows: list[RunRow]
    text: str
    metrics: dict[str, float]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned for a terminal."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def runs_table(rows: Sequence[RunRow]) -> str:
    """Each run's raw score (valid submissions only) and what it counts as in means."""
    headers = [
        "run",
        "task",
        "agent",
        "budget",
        "seed",
        "status",
        "score",
        "normalised",
        "counted",
        "counted normalised",
    ]
    body = [
        [
            r.name,
            r.task,
            r.agent,
            r.budget,
            r.seed,
            render.KIND_LABELS[r.kind],
            render.number(r.score) or "-",
            render.number(r.normalised, ".1f") or "-",
            render.number(r.counted_score) or "-",
            render.number(r.counted_normalised, ".1f") or "-",
        ]
        for r in sorted(rows, key=lambda r: r.name)
    ]
    return text_table(headers, body)


def review_lines(rows: Sequence[RunRow], sweep_id: str) -> list[str]:
    """What the runs' reviews flagged, and the runs not reviewed or whose review failed ([]: every run clean)."""
    found = flagged.counts(rows)
    lines = [f"{found}; python -m mlrb.report --sweep {sweep_id} lists them"] if found else []
    return lines + flagged.review_notes(rows)


def group_metrics(stats: aggregate.GroupStats) -> dict[str, float]:
    """One configuration's aggregates over its attempts (not-counted runs excluded, as in reports):
    counted scores over every attempt, the raw score over the valid submissions."""
    values = {
        "n": stats.attempts,
        "n_valid": stats.valid,
        "counted_score_mean": stats.counted_mean,
        "counted_score_sem": stats.counted_sem,
        "counted_normalised_score_mean": stats.counted_normalised_mean,
        "counted_normalised_score_sem": stats.counted_normalised_sem,  # the runs' and the anchors' together
        "counted_normalised_score_anchor_sem": stats.counted_normalised_anchor_sem,
        "score_mean": stats.score_mean,
        "score_sem": stats.score_sem,
        "success_rate": stats.success_rate,
        "valid_rate": stats.valid_rate,
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def metric_prefix(stats: aggregate.GroupStats, varying: Sequence[str]) -> str:
    """What sets a configuration apart from the sweep's others, as a metric key prefix the
    MLflow UI shows in full ("budget-smoke/", "agent-claude/model-claude-x/"); "" when the
    sweep has one configuration. MLflow keys allow letters, digits, _ - . / and spaces."""
    values = [re.sub(r"[^\w.\- ]", "_", str(getattr(stats, name)) or "none") for name in varying]
    return "".join(f"{name}-{value}/" for name, value in zip(varying, values, strict=True))


def parent_metrics(rows: Sequence[RunRow]) -> dict[str, float]:
    """The sweep's aggregates, one set per configuration (as the report's rows: never pooled
    across unlike runs), each key prefixed by what sets its configuration apart; and the cost
    of the whole sweep (a total, not an average: it pools)."""
    stats = aggregate.summarise(rows)
    varying = aggregate.varying_fields(stats)
    metrics: dict[str, float] = {}
    for group in stats:
        prefix = metric_prefix(group, varying)
        metrics.update({prefix + key: value for key, value in group_metrics(group).items()})
    metrics[FLAGGED_RUNS] = float(sum(flagged.is_flagged(r) for r in rows))
    means = tasks_means(stats)
    for rest, (mean, _) in means.items():  # a dataset's mean, per agent where several ran
        metrics[(rest.replace(" ", ".").replace("=", "_") + "." if len(means) > 1 else "") + TASKS_MEAN] = mean
    for each, total in (
        (Metric.COST_USD, Metric.COST_USD_TOTAL),
        (Metric.GPU_HOURS, Metric.GPU_HOURS_TOTAL),
        (Metric.CPU_HOURS, Metric.CPU_HOURS_TOTAL),
        (Metric.COMPUTE_USD, Metric.COMPUTE_USD_TOTAL),
    ):
        figures = aggregate.present(r.metric(each) for r in rows)
        if figures:
            metrics[total] = float(sum(figures))
    return metrics


def tasks_means(stats: Sequence[aggregate.GroupStats]) -> dict[str, tuple[float, list[tuple[str, float]]]]:
    """A sweep over several tasks (a dataset of Harbor tasks): per configuration but its task, the mean
    over its tasks of each task's counted score (a failure as doing nothing), or where a task has none
    counted, of its valid scores; with each task's. Empty for a sweep of one task."""
    if len({group.task for group in stats}) < 2:
        return {}
    by_rest: dict[str, list[tuple[str, float]]] = {}
    for group in stats:
        value = group.counted_mean if group.counted_mean is not None else group.score_mean
        if value is not None:
            rest = " ".join(
                f"{name}={getattr(group, name)}"
                for name in ("agent", "model", "budget", "sandbox")
                if getattr(group, name)
            )
            by_rest.setdefault(rest, []).append((group.task, value))
    return {rest: (sum(v for _, v in tasks) / len(tasks), tasks) for rest, tasks in by_rest.items()}


def tasks_mean_lines(stats: Sequence[aggregate.GroupStats]) -> list[str]:
    means = tasks_means(stats)
    if not means:
        return []
    lines = ["Mean over the tasks (each task's counted score, else its valid score):"]
    for rest, (mean, tasks) in means.items():
        each = ", ".join(f"{task} {value:.4g}" for task, value in tasks)
        lines.append(f"  {rest}: {mean:.4g} over {len(tasks)} tasks ({each})")
    return lines + [""]


def open_command(tracking_uri: str, experiment_id: str, parent_run_id: str) -> str:
    """The exact command (or address) that shows the parent run in the MLflow UI. The address
    names the UI's model-training pages: MLflow 3.17's UI ignores an experiment's kind tag and
    shows the GenAI pages (traces, not runs) unless the address or its sidebar switch says otherwise."""
    page = f"#/experiments/{experiment_id}/runs/{parent_run_id}?workflowType=machine_learning"
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')}/{page}"
    ui = f"{sys.executable} -m mlflow ui --backend-store-uri {tracking_uri}"
    return f"{ui}   # then open http://127.0.0.1:5000/{page}"


def summarise(
    client: Any,
    experiment_id: str,
    experiment: str,
    sweep_id: str,
    parent_name: str,
    parent_run_id: str,
    tracking_uri: str,
    elapsed_s: float | None = None,
    others: dict[str, str] | None = None,
) -> SweepSummary:
    """The sweep's runs, in its parent's experiment (EXPERIMENT_ID, EXPERIMENT) and in OTHERS
    (id -> name: a sweep over tasks records each task's runs in its own experiment)."""
    experiments = {experiment_id: experiment, **(others or {})}
    rows = load(client, experiments, Filters(sweep_ids=[sweep_id])).rows
    stats = aggregate.summarise(rows)
    causes = aggregate.why_not_scored(rows)
    counts = {kind: sum(r.kind == kind for r in rows) for kind in render.KIND_LABELS}
    took = f" in {duration(elapsed_s)}" if elapsed_s is not None else ""
    outcome = ", ".join(f"{n} {render.KIND_LABELS[k]}" for k, n in counts.items() if n)
    parts = [f"[sweep {sweep_id}] done{took}: {len(rows)} runs ({outcome or 'none recorded'})"]
    parts += review_lines(rows, sweep_id) + [""]
    if rows:
        parts += [runs_table(rows), ""]
        results = render.results_table(stats)
        parts += [
            "Per configuration (counted: over every attempt, a failure as doing nothing; the docs' Reports "
            "page explains each column):",
            text_table(results.headers, results.rows),
            "",
        ]
    parts += tasks_mean_lines(stats)
    if causes:
        failures = render.causes_table(causes, stats)
        parts += ["Runs without a valid score, by kind:", text_table(failures.headers, failures.rows), ""]
    parts += [
        f"MLflow: experiment '{experiment}', parent run '{parent_name}' ({parent_run_id})",
        f"  {open_command(tracking_uri, experiment_id, parent_run_id)}",
    ]
    if len(experiments) > 1:
        names = ", ".join(f"'{name}'" for name in sorted(set(experiments.values()) - {experiment}))
        parts.append(f"  its runs are in experiment '{experiment}' and in {names}")
    return SweepSummary(rows=rows, text="\n".join(parts), metrics=parent_metrics(rows) if rows else {})
