"""The report's anytime curves: how a run's score grew during the run, from the
anytime metrics that `python -m mlrb.rescore RUN_ID --all-steps` logs at each step
(mlrb/analysis/anytime.py).

Per run, the *best-so-far* score at x (a step, a wall time, a dollar amount) is the best
counted normalised score of its workspaces at steps that ended by x: a step without a valid
submission counts as doing nothing, as the report's means count a failed attempt, and
before its first step a run has done nothing (step 0). A run that ended before x keeps its
best. Per group of runs that the report pools (RunRow.group: task, agent, model, budget...)
and at each x, the curve is the mean over its runs (seeds) with a 95% t interval,
mean ± t(0.975, n - 1) · SD / √n (none for one run).

The fixed-budget table gives each group's best-so-far at 10%, 50% and 100% of its time
limit (the budget's `wall_time_s`; a step that ended past the limit, as the harness stopped
the agent, counts at the limit), and the time to the first valid submission: the median
over the runs, a run that never had one counted as never (so the median is "never" when
half the runs never had one).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlrb.analysis import anytime, stats
from mlrb.core.messages import duration
from mlrb.report.aggregate import GROUP_FIELDS, group_key_order
from mlrb.report.render import Table, key_columns, write_csv
from mlrb.report.runs import RunRow

FRACTIONS = (0.1, 0.5, 1.0)  # of the time limit, for the fixed-budget table
LEVEL = 0.95
# The curves' x axes: (name in the CSV, a Point's attribute, the plot's label, the scale to show it in)
AXES = (
    ("steps", "step", "steps", 1),
    ("wall_hours", "wall_s", "wall time (hours)", 1 / 3600),
    ("usd", "usd", "dollars spent (USD)", 1.0),
)


@dataclass(frozen=True)
class Point:
    """One step of a run: when it ended, what it had cost, and what its workspace counted as."""

    step: int
    wall_s: float | None
    usd: float | None
    valid: bool
    counted: float


@dataclass
class RunCurve:
    row: RunRow
    points: list[Point]  # by step, step 0 (the starting files) first

    def best_at(self, axis: str, x: float, limit: float | None = None) -> float | None:
        """The best counted score of the steps that ended by x on the axis (their value capped
        at `limit`); None when no step of the run is known to have (its time is unknown)."""
        reached = []
        for point in self.points:
            at = getattr(point, axis)
            if at is not None and (min(at, limit) if limit is not None else at) <= x:
                reached.append(point.counted)
        return max(reached) if reached else None

    def first_valid_s(self) -> float:
        """The wall time of its first valid step; infinity when it never had one."""
        return min((p.wall_s for p in self.points if p.valid and p.wall_s is not None), default=math.inf)


@dataclass
class GroupCurves:
    """The runs of one group (RunRow.group) that have anytime metrics."""

    runs: list[RunCurve]

    @property
    def first(self) -> RunRow:
        return self.runs[0].row

    @property
    def limit_s(self) -> float | None:
        return self.first.budget_wall_time_s

    def series(self, axis: str) -> list[tuple[float, int, float, float | None, float | None]]:
        """(x, runs, mean, low, high) at every x where a run's best-so-far may change."""
        xs = sorted({getattr(p, axis) for c in self.runs for p in c.points if getattr(p, axis) is not None})
        rows = []
        for x in xs:
            values = [v for v in (c.best_at(axis, x) for c in self.runs) if v is not None]
            rows.append((x, len(values), *band(values)))
        return rows

    def at_fraction(self, fraction: float) -> tuple[int, float | None, float | None, float | None]:
        """(runs, mean, low, high) of the best-so-far at this fraction of the time limit."""
        limit = self.limit_s
        if limit is None:
            return 0, None, None, None
        values = [v for v in (c.best_at("wall_s", fraction * limit, limit) for c in self.runs) if v is not None]
        return (len(values), *band(values)) if values else (0, None, None, None)

    def first_valid(self) -> tuple[float, int, int]:
        """(median time to the first valid submission, runs that had one, runs with known times)."""
        times = [c.first_valid_s() for c in self.runs if any(p.wall_s is not None for p in c.points)]
        if not times:
            return math.inf, 0, 0
        return statistics.median(times), sum(math.isfinite(t) for t in times), len(times)


def band(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high): the mean and its 95% t interval over the values; no interval for one."""
    mean = sum(values) / len(values)
    error = stats.sem(values)
    if error is None:
        return mean, None, None
    half = stats.t_quantile(1 - (1 - LEVEL) / 2, len(values) - 1) * error
    return mean, mean - half, mean + half


# ---- reading the runs ------------------------------------------------------------------------


def last_per_step(history: Sequence[Any]) -> dict[int, float]:
    """A metric's value at each step; a step logged twice (a run rescored again) keeps the later."""
    values: dict[int, float] = {}
    for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
        values[m.step] = m.value
    return values


def curve_of(row: RunRow, histories: dict[str, dict[int, float]]) -> RunCurve | None:
    """A run's points from its anytime metrics' histories; None when its steps have no counted
    score (its task has no do-nothing anchor)."""
    counted = histories.get(anytime.COUNTED, {})
    steps = sorted(histories.get(anytime.VALID, {}))
    if not steps or any(step not in counted for step in steps):
        return None
    wall, usd, valid = (histories.get(name, {}) for name in (anytime.WALL_S, anytime.USD, anytime.VALID))
    points = [Point(s, wall.get(s), usd.get(s), valid[s] > 0, counted[s]) for s in steps]
    return RunCurve(row, points)


def read(client: Any, rows: Sequence[RunRow]) -> tuple[list[GroupCurves], list[RunRow]]:
    """(the groups of the attempts with anytime metrics, the attempts whose steps have no counted score)."""
    from mlrb.core.retries import with_retries

    curves, uncounted = [], []
    for row in rows:
        if not row.is_attempt or anytime.VALID not in row.metrics:
            continue
        histories = {
            name: last_per_step(with_retries(client.get_metric_history, row.run_id, name))
            for name in anytime.METRICS
            if name in row.metrics
        }
        curve = curve_of(row, histories)
        if curve is None:
            uncounted.append(row)
        else:
            curves.append(curve)
    return group(curves), uncounted


def group(curves: Sequence[RunCurve]) -> list[GroupCurves]:
    groups: dict[tuple, list[RunCurve]] = {}
    for curve in curves:
        groups.setdefault(curve.row.group, []).append(curve)
    return sorted(
        (GroupCurves(sorted(g, key=lambda c: c.row.seed)) for g in groups.values()),
        key=lambda g: group_key_order(g.first),
    )


# ---- what the report shows -----------------------------------------------------------------


def interval(n: int, mean: float | None, low: float | None, high: float | None) -> str:
    if mean is None:
        return "-"
    if low is None or high is None:
        return f"{mean:.1f} (n={n})"
    return f"{mean:.1f} [{low:.1f}, {high:.1f}] (n={n})"


def first_valid_cell(groups: GroupCurves) -> str:
    median, had, known = groups.first_valid()
    if not known:
        return "- (wall times unknown)"
    return f"{duration(median) if math.isfinite(median) else 'never'} ({had} of {known} runs had one)"


def budgets_table(groups: Sequence[GroupCurves]) -> Table:
    rows = [g.first for g in groups]
    keys = key_columns(rows)  # type: ignore[arg-type]  # a RunRow has the GroupStats' key attributes
    headers = keys + [
        "runs",
        "time limit",
        *(f"at {f:.0%} of it" for f in FRACTIONS),
        "first valid submission (median)",
    ]
    table = []
    for g in groups:
        table.append(
            [str(getattr(g.first, k)) for k in keys]
            + [str(len(g.runs)), duration(g.limit_s)]
            + [interval(*g.at_fraction(f)) for f in FRACTIONS]
            + [first_valid_cell(g)]
        )
    return Table(headers, table)


INTRO = (
    "How the score grew during the runs, from the anytime metrics that `python -m mlrb.rescore RUN_ID "
    "--all-steps` logs at each step of a run. *Best so far*: the best counted normalised score of the run's "
    "workspace at the steps that ended by then (a step without a valid submission counts as doing nothing, and "
    "so does a run before its first step); mean [95% t interval] over the runs (seeds), at 10%, 50% and 100% of "
    "the time limit (a step that ended past the limit counts at it). *First valid submission*: the median over "
    "the runs of the wall time to their first step with a valid submission, a run that never had one counted as "
    "never. The curves against steps, wall hours and dollars: the plot `anytime.png` and `anytime_curves.csv`; "
    "this table: `anytime_budgets.csv`."
)


def report_sections(groups: Sequence[GroupCurves], uncounted: Sequence[RunRow]) -> list[tuple[str, str, Table | None]]:
    """The report's "Anytime curves" section, when any run has anytime metrics."""
    if not groups and not uncounted:
        return []
    intro = INTRO
    if uncounted:
        intro += (
            f" Left out: {len(uncounted)} runs whose steps have no counted score (their task has no do-nothing "
            f"anchor): {', '.join(sorted(r.name for r in uncounted))}."
        )
    return [("Anytime curves", intro, budgets_table(groups) if groups else None)]


# ---- files ------------------------------------------------------------------------------------


CURVE_FIELDS = [*GROUP_FIELDS, "axis", "x", "runs", "mean", "low", "high"]
BUDGET_FIELDS = [
    *GROUP_FIELDS,
    "time_limit_s",
    "runs",
    *(f"at_{f:.0%}_{part}".replace("%", "pct") for f in FRACTIONS for part in ("runs", "mean", "low", "high")),
    "first_valid_median_s",
    "runs_with_valid",
    "runs_with_times",
]


def keys_of(g: GroupCurves) -> dict[str, object]:
    return {name: getattr(g.first, name) for name in GROUP_FIELDS}


def write_csvs(groups: Sequence[GroupCurves], out: Path) -> list[Path]:
    """anytime_curves.csv (each group's curve on each axis, x in steps, hours or USD) and
    anytime_budgets.csv (the fixed-budget table at full precision); none without curves."""
    if not groups:
        return []
    curves = [
        {**keys_of(g), "axis": name, "x": x * scale, "runs": n, "mean": mean, "low": low, "high": high}
        for g in groups
        for name, attribute, _, scale in AXES
        for x, n, mean, low, high in g.series(attribute)
    ]
    budgets = []
    for g in groups:
        record: dict[str, object] = {**keys_of(g), "time_limit_s": g.limit_s, "runs": len(g.runs)}
        for f in FRACTIONS:
            prefix = f"at_{f:.0%}_".replace("%", "pct")
            record.update(zip([prefix + p for p in ("runs", "mean", "low", "high")], g.at_fraction(f), strict=True))
        median, had, known = g.first_valid()
        record.update({"first_valid_median_s": median, "runs_with_valid": had, "runs_with_times": known})
        budgets.append(record)
    return [
        write_csv(out / "anytime_curves.csv", CURVE_FIELDS, curves),
        write_csv(out / "anytime_budgets.csv", BUDGET_FIELDS, budgets),
    ]


def draw(groups: Sequence[GroupCurves], path: Path) -> dict[str, Path]:
    """caption -> PNG: a row per task (and scale), a panel per axis, a line per group with its band."""
    if not groups:
        return {}
    from mlrb.report import plots

    plt = plots.pyplot()  # matplotlib, with its Agg backend set before anything else of it is imported
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    tasks = sorted({(g.first.task, g.first.scale) for g in groups})
    show_budget, show_scale = (len({getattr(g.first, name) for g in groups}) > 1 for name in ("budget", "scale"))
    fig, axes = plt.subplots(len(tasks), len(AXES), figsize=(5.0 * len(AXES), 3.8 * len(tasks)), squeeze=False)
    for row_axes, task in zip(axes, tasks, strict=True):
        mine = [g for g in groups if (g.first.task, g.first.scale) == task]
        for ax, (_, attribute, label, scale) in zip(row_axes, AXES, strict=True):
            if attribute == "wall_s" and all(x * scale < 1 for g in mine for x, *_ in g.series(attribute)):
                label, scale = "wall time (minutes)", scale * 60  # a short run's hours are all zeros
            for g in mine:
                series = g.series(attribute)
                xs = [x * scale for x, *_ in series]
                line = ax.step(xs, [s[2] for s in series], where="post", label=plots.label(g.first, show_budget))
                if any(s[3] is not None for s in series):
                    lows = [s[3] if s[3] is not None else s[2] for s in series]
                    highs = [s[4] if s[4] is not None else s[2] for s in series]
                    ax.fill_between(xs, lows, highs, step="post", alpha=0.2, color=line[0].get_color())
            if mine[0].first.normalised_as == "gap":
                ax.axhline(0, color="grey", linestyle="--", linewidth=1, label="baseline (0)")
                ax.axhline(100, color="green", linestyle="--", linewidth=1, label="reference (100)")
            # at most five ticks, each as short as its value allows: labels that never run into each other
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=attribute == "step"))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.set_xlabel(label)
            ax.set_ylabel("best so far (counted normalised)")
            ax.set_title(plots.panel_title(task, show_scale))
            ax.legend(fontsize=8, loc="best")
    caption = "Anytime curves: best-so-far counted normalised score (mean, 95% interval over seeds)"
    return {caption: plots.save(fig, path)}
