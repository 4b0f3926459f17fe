"""The report's figures as PNG files. matplotlib is imported here only, with the
Agg backend (no display needed), so the rest of the report stays light.

Raw scores are on each task's own scale (accuracy, BLEU...), so every figure has
one panel per task, with the task's baseline and reference scores drawn in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from mlrb.core.messages import duration
from mlrb.report.aggregate import GroupStats, varying
from mlrb.report.runs import RunRow


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panels(plt, keys: Sequence[tuple], width: float = 5.0, height: float = 3.8):
    """A figure with one panel per (task, scale); returns (figure, {key: axes})."""
    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(keys) :]:
        ax.set_visible(False)
    return fig, dict(zip(keys, flat, strict=False))  # spare axes are hidden


def task_key(item) -> tuple:
    return (item.task, item.scale)


def panel_title(key: tuple, show_scale: bool) -> str:
    return f"{key[0]} ({key[1]})" if show_scale else key[0]


def anchors(ax, stats: Sequence[GroupStats]) -> None:
    """The task's baseline (0) and reference (100) as dashed lines."""
    baseline = next((s.baseline_score for s in stats if s.baseline_score is not None), None)
    reference = next((s.reference_score for s in stats if s.reference_score is not None), None)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="task baseline (normalised 0)")
    if reference is not None:
        ax.axhline(reference, color="green", linestyle="--", linewidth=1, label="task reference (normalised 100)")


def who(s) -> str:
    """The agent, with its model when it has one (two models of one agent are two lines)."""
    return f"{s.agent} ({s.model})" if s.model else s.agent


def label(s, show_budget: bool) -> str:
    return f"{who(s)} / {s.budget}" if show_budget else who(s)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)  # pyplot keeps every figure alive until closed
    return path


def score_by_task(stats: Sequence[GroupStats], path: Path) -> Path:
    """Bars: mean raw score of each agent (and budget) with SEM error bars, a panel per task."""
    plt = pyplot()
    keys = sorted({task_key(s) for s in stats})
    fig, axes = panels(plt, keys)
    show_budget, show_scale = varying(stats, "budget"), varying(stats, "scale")
    for key, ax in axes.items():
        group = [s for s in stats if task_key(s) == key]
        names = [label(s, show_budget) for s in group]
        heights = [s.score_mean if s.score_mean is not None else 0.0 for s in group]
        errors = [s.score_sem or 0.0 for s in group]
        bars = ax.bar(range(len(group)), heights, yerr=errors, capsize=4, color="#4c72b0")
        for bar, s, error in zip(bars, group, errors, strict=True):
            text = f"n={s.valid}/{s.attempts}" if s.score_mean is not None else "no valid run"
            # above the error bar, not across it
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height() + error),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
        anchors(ax, group)
        top = max([h + e for h, e in zip(heights, errors, strict=True)] + [s.reference_score or 0.0 for s in group])
        if top > 0:
            ax.set_ylim(top=top * 1.3)  # room for the legend above the bars and the reference line
        ax.set_xticks(range(len(group)), names, rotation=20, ha="right")
        ax.set_ylabel("score (valid submissions, mean ± SEM)")
        ax.set_title(panel_title(key, show_scale))
        ax.legend(fontsize=8, loc="best")
    return save(fig, path)


def score_vs_budget(stats: Sequence[GroupStats], path: Path) -> Path:
    """Lines: mean raw score against the budget's wall time, one line per agent, a panel per task."""
    plt = pyplot()
    keys = sorted({task_key(s) for s in stats})
    fig, axes = panels(plt, keys)
    show_scale = varying(stats, "scale")
    for key, ax in axes.items():
        group = [s for s in stats if task_key(s) == key and s.score_mean is not None and s.budget_wall_time_s]
        for agent in sorted({who(s) for s in group}):
            points = sorted((s for s in group if who(s) == agent), key=lambda s: s.budget_wall_time_s or 0)
            ax.errorbar(
                [(s.budget_wall_time_s or 0) / 3600 for s in points],
                [s.score_mean for s in points],
                yerr=[s.score_sem or 0.0 for s in points],
                marker="o",
                capsize=4,
                label=agent,
            )
        ticks = {(s.budget_wall_time_s or 0) / 3600: s.budget for s in group}
        anchors(ax, group)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(list(ticks), [f"{name}\n{duration(hours * 3600)}" for hours, name in ticks.items()])
        ax.margins(x=0.2)
        ax.set_xlabel("budget (wall time, log scale)")
        ax.set_ylabel("score (valid submissions, mean ± SEM)")
        ax.set_title(panel_title(key, show_scale))
        ax.legend(fontsize=8, loc="best")
    return save(fig, path)


def score_vs_cost(stats: Sequence[GroupStats], rows: Sequence[RunRow], path: Path, cost: str = "api") -> Path:
    """Points: each scored run's raw score against its cost in USD (COST: runs.COSTS), a panel per task."""
    plt = pyplot()
    keys = sorted({task_key(s) for s in stats})
    fig, axes = panels(plt, keys)
    show_budget, show_scale = varying(stats, "budget"), varying(stats, "scale")
    markers = "osD^vP*X"
    for key, ax in axes.items():
        scored = [r for r in rows if task_key(r) == key and r.scored and r.score is not None]
        series: dict[str, list[RunRow]] = {}
        for r in scored:
            series.setdefault(label(r, show_budget), []).append(r)
        for i, (name, points) in enumerate(sorted(series.items())):
            ax.scatter(
                [r.cost(cost) or 0.0 for r in points],
                [r.score for r in points],
                marker=markers[i % len(markers)],
                label=name,
                alpha=0.8,
            )
        anchors(ax, [s for s in stats if task_key(s) == key])
        most = max((r.cost(cost) or 0.0 for r in scored), default=0.0)
        right = most * 1.1 if most > 0 else 1.0  # a scripted agent costs nothing: show $0 to $1 then
        ax.set_xlim(-0.03 * right, right)
        ax.set_xlabel(f"{COST_AXES[cost]} of the run (USD)")
        ax.set_ylabel("score (valid submissions)")
        ax.set_title(panel_title(key, show_scale))
        ax.legend(fontsize=8, loc="best")
    return save(fig, path)


# What each kind of cost is, on an axis (runs.COSTS).
COST_AXES = {"api": "model API cost", "compute": "compute cost", "total": "API and compute cost"}


def draw_all(stats: Sequence[GroupStats], rows: Sequence[RunRow], out: Path, cost: str = "api") -> dict[str, Path]:
    """caption -> PNG, for the figures these runs support."""
    if not stats:
        return {}
    plots = {
        "Score per task and agent (mean ± SEM over valid submissions)": score_by_task(stats, out / "score_by_task.png")
    }
    swept = any(
        len({s.budget for s in stats if (s.task, s.scale, s.agent) == (t.task, t.scale, t.agent)}) > 1 for t in stats
    )
    if swept:
        plots["Score against budget"] = score_vs_budget(stats, out / "score_vs_budget.png")
    plots["Score against dollar cost (one point per scored run)"] = score_vs_cost(
        stats, rows, out / "score_vs_cost.png", cost
    )
    return plots
