"""The report's "Cost against score": per task, each results row (an agent, its model,
budget...) as a point, its mean dollars per run against its mean counted normalised score
(aggregate.py: over every attempt, a failure counting as doing nothing), with the Pareto front
marked: a point is on the front when no other point of its panel costs no more and scores no
less while doing better in one (points that tie exactly are both on it). Overall: each agent
(model, budget...) over every task of the report, the mean over tasks of both figures (each task
weighs the same); one that did not run every task is left out of it, and said so.

Which dollars (`--cost`, runs.COSTS): the model API's (api, the default), the compute's at the
config's prices (compute), or both together (total). Where some run priced its compute, the table
shows all three. A run that recorded no cost of the kind (the baseline, a scripted agent, a run whose
compute was not priced) costs $0: it is a point too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlrb.report.aggregate import GROUP_FIELDS, GroupStats, cost_mean, mean, varying
from mlrb.report.render import Table, dollars, key_columns
from mlrb.report.runs import COST_NAMES, COSTS

OVERALL = "overall"


@dataclass
class Point:
    panel: str  # the task (with its scale when scales vary), or OVERALL
    label: str  # who: the agent, its model, and what else varies between the rows
    keys: dict[str, str]  # the results row's key columns (task, agent, model...)
    cost: float  # mean dollars per run
    cost_recorded: bool  # False: no run recorded a cost (taken as $0)
    score: float | None  # mean counted normalised score; None when its attempts have none
    sem: float | None
    attempts: int
    on_front: bool = False
    by_kind: dict[str, float | None] | None = None  # mean dollars per run of each kind (runs.COSTS); None: unrecorded


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (cost, score), whether no other point dominates it: costs no more, scores no
    less, and is better in one. Equal points do not dominate each other."""
    return [
        not any(c2 <= c and s2 >= s and (c2 < c or s2 > s) for j, (c2, s2) in enumerate(points) if j != i)
        for i, (c, s) in enumerate(points)
    ]


def mark_front(points: list[Point]) -> None:
    """Mark each panel's front among its points that have a score."""
    for panel in {p.panel for p in points}:
        scored = [p for p in points if p.panel == panel and p.score is not None]
        for point, on in zip(scored, pareto_front([(p.cost, p.score or 0.0) for p in scored]), strict=True):
            point.on_front = on


# What a point is across tasks: the results' group fields but the task's own (task, scale, assets).
WHO = ("agent", "model", "budget", "sandbox", "confinement")


def labeller(stats: Sequence[GroupStats]):
    """A row -> its point's label: the agent, its model, and what else varies (assets: within a task)."""
    shown = [k for k in ("budget", "sandbox", "confinement") if varying(stats, k)]
    tasks: dict[tuple, set[str]] = {}
    for s in stats:
        tasks.setdefault((s.task, s.scale), set()).add(s.assets)
    assets_vary = any(len(a) > 1 for a in tasks.values())

    def label(s: GroupStats) -> str:
        parts = [f"{s.agent} ({s.model})" if s.model else s.agent, *(str(getattr(s, k)) for k in shown)]
        return " / ".join(parts + ([f"assets {s.assets}"] if assets_vary else []))

    return label


def points_of(stats: Sequence[GroupStats], cost: str = "api") -> tuple[list[Point], list[str]]:
    """(every point, per task and overall; what was left out of the overall and why), each at its
    mean dollars of kind COST (runs.COSTS)."""
    label, show_scale = labeller(stats), varying(stats, "scale")
    points = []
    for s in stats:
        panel = f"{s.task} ({s.scale})" if show_scale else s.task
        chosen = cost_mean(s, cost)
        points.append(
            Point(
                panel,
                label(s),
                {k: str(getattr(s, k)) for k in GROUP_FIELDS},
                chosen or 0.0,
                chosen is not None,
                s.counted_normalised_mean,
                s.counted_normalised_sem,
                s.attempts,
                by_kind={kind: cost_mean(s, kind) for kind in COSTS},
            )
        )
    panels = sorted({p.panel for p in points})
    left_out: list[str] = []
    if len(panels) > 1:
        by_who: dict[tuple, list[tuple[GroupStats, Point]]] = {}
        for s, p in zip(stats, points, strict=True):
            by_who.setdefault(tuple(getattr(s, k) for k in WHO), []).append((s, p))
        for members in by_who.values():
            mine = [p for _, p in members]
            name = f"{members[0][0].agent} ({members[0][0].model})" if members[0][0].model else members[0][0].agent
            name = " / ".join([name, *(str(getattr(members[0][0], k)) for k in WHO[2:] if varying(stats, k))])
            scored = {p.panel for p in mine if p.score is not None}
            if len(scored) < len(panels) or len(mine) != len(panels):
                why = (
                    "several rows on one task"
                    if len(mine) > len({p.panel for p in mine})
                    else f"a counted score on {len(scored)} of {len(panels)} tasks"
                )
                left_out.append(f"{name} ({why})")
                continue
            keys = {**mine[0].keys, "task": OVERALL, "scale": "", "assets": ""}
            by_kind = {
                kind: mean([(p.by_kind or {}).get(kind) or 0.0 for p in mine])
                if any((p.by_kind or {}).get(kind) is not None for p in mine)
                else None
                for kind in COSTS
            }
            points.append(
                Point(
                    OVERALL,
                    name,
                    keys,
                    mean([p.cost for p in mine]) or 0.0,
                    any(p.cost_recorded for p in mine),
                    mean([p.score or 0.0 for p in mine]),
                    None,
                    sum(p.attempts for p in mine),
                    by_kind=by_kind,
                )
            )
    mark_front(points)
    return points, left_out


# What each kind of cost is, in the section's words (runs.COSTS).
WHAT = {
    "api": "model API dollars",
    "compute": "compute dollars (the hardware held, at the config's prices)",
    "total": "dollars, model API and compute together",
}
INTRO = (
    "Mean {what} per run against the mean counted normalised score (0 = baseline, 100 = reference; a failed "
    "attempt counts as doing nothing), per task, and overall as the mean over tasks (each weighs the same). "
    "*Pareto front*: no other row of its task costs no more and scores no less while doing better in one; "
    "a run that recorded no cost counts as $0. `cost_score.csv` has the same; the plot, cost_score_pareto.png."
)


def compute_priced(points: Sequence[Point]) -> bool:
    """Whether some run priced its compute: then every kind of cost is shown."""
    return any((p.by_kind or {}).get("compute") is not None for p in points)


def table(stats: Sequence[GroupStats], points: Sequence[Point], cost: str = "api") -> Table:
    keys = key_columns(stats)
    every_kind = compute_priced(points)
    columns = (
        [f"{COST_NAMES[kind]} per run" for kind in COSTS]
        if every_kind
        else ["$ per run" if cost == "api" else f"{COST_NAMES[cost]} per run"]
    )
    headers = keys + ["attempts", *columns, "counted normalised", "Pareto front"]
    body = []
    for p in points:
        if every_kind:
            figures = [dollars((p.by_kind or {}).get(kind) or 0.0) for kind in COSTS]
        else:
            figures = [dollars(p.cost) + ("" if p.cost_recorded else " (none recorded)")]
        if p.score is None:
            score = "-"
        elif p.sem is None:
            score = f"{p.score:.1f}"
        else:
            score = f"{p.score:.1f} ± {p.sem:.1f}"
        body.append([p.keys[k] for k in keys] + [str(p.attempts), *figures, score, "yes" if p.on_front else ""])
    return Table(headers, body)


def report_sections(stats: Sequence[GroupStats], cost: str = "api") -> list[tuple[str, str, Table | None]]:
    points, left_out = points_of(stats, cost)
    intro = INTRO.format(what=WHAT[cost])
    if compute_priced(points):
        intro += f" The front is drawn on the {COST_NAMES[cost]} (python -m mlrb.report --cost api|compute|total)."
    intro += f" Not in the overall: {'; '.join(left_out)}." if left_out else ""
    return [("Cost against score", intro, table(stats, points, cost))]


FIELDS = [
    "panel",
    "label",
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "sandbox",
    "confinement",
    "assets",
    "attempts",
    "cost",
    "cost_usd_mean",
    "compute_usd_mean",
    "total_usd_mean",
    "cost_recorded",
    "counted_normalised_mean",
    "counted_normalised_sem",
    "pareto_front",
]


def records(stats: Sequence[GroupStats], cost: str = "api") -> list[dict[str, object]]:
    """The points; `cost` names the kind the front is drawn on, `cost_recorded` is of that kind."""
    points, _ = points_of(stats, cost)
    return [
        {
            "panel": p.panel,
            "label": p.label,
            **p.keys,
            "attempts": p.attempts,
            "cost": cost,
            **{f"{kind}_usd_mean" if kind != "api" else "cost_usd_mean": (p.by_kind or {}).get(kind) for kind in COSTS},
            "cost_recorded": p.cost_recorded,
            "counted_normalised_mean": p.score,
            "counted_normalised_sem": p.sem,
            "pareto_front": p.on_front,
        }
        for p in points
    ]


def csv_files(stats: Sequence[GroupStats], cost: str = "api") -> list[tuple[str, list[str], list[dict[str, object]]]]:
    return [("cost_score.csv", FIELDS, records(stats, cost))]


# ---- the plot -----------------------------------------------------------------------------------

PLOT = "cost_score_pareto.png"
CAPTION = "Cost against score: mean {what} per run and mean counted normalised score (filled: on the Pareto front)"


def draw(stats: Sequence[GroupStats], out: Path, cost: str = "api") -> dict[str, Path]:
    """caption -> PNG: a panel per task (and one overall), each row a point; the front's points
    filled and joined, the others hollow. {} when no row has a counted score."""
    from mlrb.report.plots import panels, pyplot, save

    points, _ = points_of(stats, cost)
    scored = [p for p in points if p.score is not None]
    if not scored:
        return {}
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    names = sorted({p.panel for p in scored} - {OVERALL}) + (
        [OVERALL] if any(p.panel == OVERALL for p in scored) else []
    )
    fig, axes = panels(plt, [(name,) for name in names])
    colours = {name: f"C{i % 10}" for i, name in enumerate(sorted({p.label for p in scored}))}
    for (name,), ax in axes.items():
        mine = [p for p in scored if p.panel == name]
        front = sorted((p for p in mine if p.on_front), key=lambda p: (p.cost, -(p.score or 0.0)))
        if len(front) > 1:  # a front of one point draws no line: the legend names only what is drawn
            ax.step(
                [p.cost for p in front],
                [p.score for p in front],
                where="post",
                color="black",
                linewidth=1,
                alpha=0.6,
                label="Pareto front",
            )
        for p in mine:
            colour = colours[p.label]
            ax.errorbar(
                [p.cost],
                [p.score],
                yerr=[p.sem or 0.0],
                fmt="o",
                markersize=8,
                capsize=3,
                color=colour,
                markerfacecolor=colour if p.on_front else "white",
                label=p.label or "(all)",
            )
        most = max(p.cost for p in mine)
        right = most * 1.15 if most > 0 else 1.0  # a scripted agent costs nothing: show $0 to $1 then
        ax.set_xlim(-0.05 * right, right)
        # at most five ticks, each as short as its value allows: labels that never run into each other
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.axhline(0, color="grey", linestyle="--", linewidth=1, label="baseline (0)")
        ax.axhline(100, color="green", linestyle="--", linewidth=1, label="reference (100)")
        ax.set_xlabel(f"mean {COST_NAMES[cost].removesuffix(' $')} cost per run (USD)")
        ax.set_ylabel("counted normalised score (mean ± SEM)")
        ax.set_title(f"{name} (mean over tasks)" if name == OVERALL else name)
        ax.legend(fontsize=8, loc="best")
    return {CAPTION.format(what=COST_NAMES[cost]): save(fig, out / PLOT)}
