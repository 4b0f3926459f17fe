"""The report as files: Markdown, CSV and a self-contained HTML page.

Tables are built once as rows of text cells, then written as Markdown or HTML;
the CSV files keep full precision (blank where a value is undefined).
"""

from __future__ import annotations

import base64
import csv
import functools
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlrb.core.messages import duration
from mlrb.core.status import Status
from mlrb.core.tags import Metric
from mlrb.report.aggregate import Cause, GroupStats, varying
from mlrb.report.runs import CONFINED, CRASHED, NOT_COUNTED, RUNNING, RunRow

KIND_LABELS = {
    Status.OK.value: "ok",
    Status.INVALID.value: "invalid submission",
    Status.NO_SUBMISSION.value: "no submission",
    Status.BUDGET_EXHAUSTED.value: "budget exhausted",
    Status.AGENT_ERROR.value: "agent error",
    Status.INFRA_ERROR.value: "infrastructure error",
    Status.KILLED.value: "killed",
    RUNNING: "still running",
    CRASHED: "crashed (left running)",
}

# Short notes on the columns; the Reports page of the docs (docs/reports.md) explains them in full.
HOW_TO_READ = (
    "*runs (attempts)*: attempts are the runs the agent is to blame for; the others enter no mean (below). "
    "*counted score*: mean ± SEM over attempts, a failure counting as doing nothing. "
    "*counted normalised*: the same with 0 = baseline and 100 = reference. "
    "*normalised as*, where tasks differ: what the normalised score is. *success*: more than 10% over the baseline. "
    "*valid score*: mean ± SEM over valid submissions alone. "
    "Cost, tokens and wall time: means over attempts. "
    "The Reports page of the docs (docs/reports.md) explains each column."
)


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        return "\n".join([line(self.headers), line(["---"] * len(self.headers)), *map(line, self.rows)])

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{linked(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def linked(cell: str) -> str:
    """A cell as HTML: an address alone (a run's page in the MLflow UI) as a link, any other text escaped."""
    text = html.escape(cell)
    return f'<a href="{text}">{text}</a>' if re.fullmatch(r"https?://\S+", cell) else text


# ---- numbers as people read them ------------------------------------------------------


def number(value: float | None, spec: str = ".4g") -> str:
    return "" if value is None else format(value, spec)


def mean_sem(mean: float | None, sem: float | None, n: int, spec: str = ".4g", sem_spec: str = ".2g") -> str:
    if mean is None:
        return "-"
    if sem is None:
        return f"{format(mean, spec)} (n={n})"
    return f"{format(mean, spec)} ± {format(sem, sem_spec)} (n={n})"


def rate(value: float | None, n: int) -> str:
    if value is None:
        return "-"
    return f"{100 * value:.0f}% ({round(value * n)}/{n})"


def dollars(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:.4f}" if 0 < value < 0.01 else f"${value:.2f}"


def tokens(stats: GroupStats) -> str:
    if stats.input_tokens_mean is None and stats.output_tokens_mean is None:
        return "-"
    return f"{stats.input_tokens_mean or 0:,.0f} / {stats.output_tokens_mean or 0:,.0f}"


# ---- tables -----------------------------------------------------------------------------


def key_columns(stats: Sequence[GroupStats]) -> list[str]:
    """task and agent always; model when an agent has one; scale, budget, sandbox and assets
    only when they vary; confinement when it varies or any run was unconfined (such rows must say so)."""
    columns = ["task"]
    if varying(stats, "scale"):
        columns.append("scale")
    columns.append("agent")
    if any(s.model for s in stats):
        columns.append("model")
    if varying(stats, "budget"):
        columns.append("budget")
    if varying(stats, "sandbox"):
        columns.append("sandbox")
    if varying(stats, "confinement") or any(s.confinement != CONFINED for s in stats):
        columns.append("confinement")
    if varying(stats, "assets"):
        columns.append("assets")
    return columns


# What a normalised score is, by the benchmark's own name (Task.normalised_as).
NORMALISED_AS = {
    "gap": "% of baseline-to-reference gap closed",
    "improvement": "MLAgentBench improvement over baseline, %",
    "human_gap": "MLRC-Bench relative improvement to human, %",
    "reward": "% of the task's reward (0 doing nothing, 100 its own solution)",
}


def counted(mean: float | None, sem: float | None, s: GroupStats, spec: str = ".4g", sem_spec: str = ".2g") -> str:
    """A counted mean over every attempt, or why there is none."""
    if mean is None and s.uncounted:
        return f"- ({s.uncounted} of {s.attempts} uncounted)"
    return mean_sem(mean, sem, s.attempts, spec, sem_spec)


def results_table(stats: Sequence[GroupStats]) -> Table:
    keys = key_columns(stats)
    named = any(s.normalised_as != "gap" for s in stats)  # else every row reads as the legend says
    # where some run priced its compute: the API's dollars, the compute's and their sum, else the API's alone
    priced = any(s.compute_usd_mean is not None for s in stats)
    cost_headers = ["API $", "compute $", "total $"] if priced else ["cost"]
    headers = keys + [
        "runs (attempts)",
        "counted score",
        "counted normalised",
        *(["normalised as"] if named else []),
        "success",
        "valid",
        "valid score",
        *cost_headers,
        "tokens in / out",
        "wall time",
        "not counted",
    ]
    rows = []
    for s in stats:
        excluded = ", ".join(f"{n} {KIND_LABELS[k]}" for k, n in sorted(s.outcomes.items()) if k in NOT_COUNTED)
        keys_cells = [getattr(s, k) for k in keys]
        if s.unenforced_rules:  # its score cannot vouch for these rules (the section below)
            keys_cells[0] += f" {UNENFORCED_MARK}"
        rows.append(
            keys_cells
            + [
                f"{s.runs} ({s.attempts})",
                counted(s.counted_mean, s.counted_sem, s),
                counted(s.counted_normalised_mean, s.counted_normalised_sem, s, ".1f", ".1f"),
                *([NORMALISED_AS.get(s.normalised_as, s.normalised_as)] if named else []),
                rate(s.success_rate, s.success_n),
                rate(s.valid_rate, s.attempts),
                mean_sem(s.score_mean, s.score_sem, s.valid),
                dollars(s.cost_usd_mean),
                *([dollars(s.compute_usd_mean), dollars(s.total_usd_mean)] if priced else []),
                tokens(s),
                duration(s.wall_time_s_mean),
                excluded or "-",
            ]
        )
    return Table(headers, rows)


UNENFORCED_MARK = "†"
UNENFORCED_INTRO = (
    f"A row marked {UNENFORCED_MARK} is of a task that states rules to the agent which no check enforces (or "
    "has a known shortcut): its scores cannot vouch that the agent kept them. Each task's page lists them in "
    "its table of rules; the reasons are today's packaged task configs'."
)


@functools.cache
def rule_reasons(task: str, scale: str) -> dict[str, str]:
    """id -> why, from the packaged task's config ({} for a task that is not packaged, a folder task)."""
    from mlrb.core.config import packaged_task

    try:
        return dict(packaged_task(task)["scales"][scale].get("unenforced_rules") or {})
    except Exception:  # not a packaged task (a folder task), or no such scale any more
        return {}


def unenforced_table(stats: Sequence[GroupStats]) -> Table | None:
    """Per task and scale, the rules its runs recorded as not enforced, and why; None when no run
    recorded any and every run recorded the tag."""
    rules: dict[tuple[str, str], set[str]] = {}
    unknown: dict[tuple[str, str], int] = {}
    for s in stats:
        rules.setdefault((s.task, s.scale), set()).update(s.unenforced_rules)
        unknown[(s.task, s.scale)] = unknown.get((s.task, s.scale), 0) + s.rules_unknown
    rows = []
    for (task, scale), ids in sorted(rules.items()):
        reasons = rule_reasons(task, scale) if ids else {}
        rows += [[task, scale, rule, reasons.get(rule, "-")] for rule in sorted(ids)]
        if unknown[(task, scale)]:  # recorded before runs said: not flagged, and not vouched for either
            rows.append(
                [
                    task,
                    scale,
                    "unknown",
                    f"{unknown[(task, scale)]} runs were recorded before runs "
                    "recorded their task's unenforced rules: not flagged, see the task's page",
                ]
            )
    return Table(["task", "scale", "rule not enforced", "why"], rows) if rows else None


def causes_table(causes: Sequence[Cause], stats: Sequence[GroupStats]) -> Table:
    keys = key_columns(stats)
    headers = keys + ["cause", "runs", "reason", "which"]
    rows = [
        [getattr(c, k) for k in keys] + [KIND_LABELS[c.kind], str(c.count), c.detail or "-", ", ".join(sorted(c.runs))]
        for c in causes
    ]
    return Table(headers, rows)


def excluded_table(rows: Sequence[RunRow]) -> Table:
    return Table(
        ["run", "budget", "state", "MLflow status", "detail", "run id"],
        [[r.name, r.budget, KIND_LABELS[r.kind], r.mlflow_status, r.detail, r.run_id] for r in rows],
    )


# ---- files --------------------------------------------------------------------------------


SUMMARY_FIELDS = [
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "sandbox",
    "confinement",
    "assets",
    "budget_wall_time_s",
    "runs",
    "attempts",
    "valid",
    "counted_mean",
    "counted_sem",
    "counted_normalised_mean",
    "counted_normalised_sem",
    "counted_normalised_anchor_sem",
    "uncounted",
    "score_mean",
    "score_sem",
    "normalised_as",
    "success_rate",
    "success_n",
    "valid_rate",
    "cost_usd_mean",
    "compute_usd_mean",
    "total_usd_mean",
    "gpu_hours_mean",
    "cpu_hours_mean",
    "input_tokens_mean",
    "output_tokens_mean",
    "wall_time_s_mean",
    "baseline_score",
    "reference_score",
    *KIND_LABELS,
]

RUN_FIELDS = [
    "run_id",
    "name",
    "experiment",
    "task",
    "scale",
    "agent",
    "model",
    "budget",
    "seed",
    "sweep_id",
    "sandbox",
    "confinement",
    "assets",
    "mlflow_status",
    "kind",
    "counted",
    "detail",
    "score",
    "normalised_score",
    "counted_score",
    "counted_normalised_score",
    "normalised_as",
    "unenforced_rules",
    "success",
    "do_nothing_score",
    "baseline_score",
    "reference_score",
    "cost_usd",
    "compute_usd",
    "gpu_hours",
    "cpu_hours",
    "input_tokens",
    "output_tokens",
    "wall_time_s",
]


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(path: Path, fields: list[str], records: list[dict[str, object]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for record in records:
            writer.writerow({k: cell(record.get(k)) for k in fields})
    return path


def summary_records(stats: Sequence[GroupStats]) -> list[dict[str, object]]:
    records = []
    for s in stats:
        record = {k: getattr(s, k) for k in SUMMARY_FIELDS if hasattr(s, k)}
        record.update({kind: s.outcomes.get(kind, 0) for kind in KIND_LABELS})
        records.append(record)
    return records


def run_records(rows: Sequence[RunRow]) -> list[dict[str, object]]:
    """One line per run, with the values the summary counted (score only when valid)."""
    return [
        {
            "run_id": r.run_id,
            "name": r.name,
            "experiment": r.experiment,
            "task": r.task,
            "scale": r.scale,
            "agent": r.agent,
            "model": r.model,
            "budget": r.budget,
            "seed": r.seed,
            "sweep_id": r.sweep_id,
            "sandbox": r.sandbox,
            "confinement": r.confinement,
            "assets": r.assets,
            "mlflow_status": r.mlflow_status,
            "kind": r.kind,
            "counted": r.is_attempt,
            "detail": r.detail,
            "score": r.score,
            "normalised_score": r.normalised,
            "counted_score": r.counted_score,
            "counted_normalised_score": r.counted_normalised,
            "normalised_as": r.normalised_as,
            "unenforced_rules": "unknown" if r.unenforced_rules is None else ",".join(r.unenforced_rules),
            "success": r.success,
            **{
                name: r.metric(name)
                for name in (
                    *Metric.ANCHORS,
                    Metric.COST_USD,
                    Metric.COMPUTE_USD,
                    Metric.GPU_HOURS,
                    Metric.CPU_HOURS,
                    Metric.INPUT_TOKENS,
                    Metric.OUTPUT_TOKENS,
                    Metric.WALL_TIME_S,
                )
            },
        }
        for r in rows
    ]


def cause_records(causes: Sequence[Cause]) -> list[dict[str, object]]:
    return [
        {
            "task": c.task,
            "scale": c.scale,
            "agent": c.agent,
            "model": c.model,
            "budget": c.budget,
            "cause": c.kind,
            "runs": c.count,
            "reason": c.detail,
            "which": " ".join(sorted(c.runs)),
        }
        for c in causes
    ]


def emphasis(escaped: str) -> str:
    """The Markdown *emphasis* of the intros, as HTML."""
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", escaped)


@dataclass
class Report:
    """Everything the files say; built by the cli from the store."""

    title: str
    context: str  # store and filters, one line
    stats: list[GroupStats]
    causes: list[Cause]
    excluded: list[RunRow]
    rows: list[RunRow]
    plots: dict[str, Path]  # caption -> PNG file
    # (heading, intro, table) of the paired comparisons (report/compare.py's report_sections), when 2+ agents ran
    comparisons: list[tuple] = field(default_factory=list)
    # (heading, intro, table) of the anytime curves (report/anytime.py's report_sections), when runs have them
    anytime: list[tuple] = field(default_factory=list)
    # (heading, intro, table) of "Cost against score" and "Where agents fail" (report/costs.py, report/failures.py)
    costs: list[tuple] = field(default_factory=list)
    failures: list[tuple] = field(default_factory=list)
    # (file name, fields, records) of the CSV files those sections write beside the others
    csvs: list[tuple] = field(default_factory=list)
    # (heading, intro, table) of the results with flagged runs counted as failures, and of "Flagged runs"
    # (report/flagged.py): the review's verdicts, right after the results they change
    as_failures: list[tuple] = field(default_factory=list)
    flagged: list[tuple] = field(default_factory=list)

    def sections(self) -> list[tuple]:
        """(heading, intro, table or None) in reading order."""
        sections: list[tuple] = [("Results", HOW_TO_READ, results_table(self.stats))]
        sections += self.as_failures
        sections += self.flagged
        unenforced = unenforced_table(self.stats)
        if unenforced is not None:
            sections.append((f"{UNENFORCED_MARK} Rules not enforced", UNENFORCED_INTRO, unenforced))
        sections += self.comparisons
        sections += self.anytime
        sections += self.costs
        if self.causes:
            sections.append(
                (
                    "Why runs did not score",
                    "Every run without a valid score, by cause and reason.",
                    causes_table(self.causes, self.stats),
                )
            )
        else:
            sections.append(("Why runs did not score", "Every run scored.", None))
        sections += self.failures
        plumbing = sorted({f"{s.task} (scale {s.scale})" for s in self.stats if s.plumbing})
        if plumbing:
            sections.append(
                (
                    "Plumbing runs",
                    f"Runs at a plumbing scale check that the harness works and measure "
                    f"nothing: {', '.join(plumbing)}. No mean is shown for them and mlrb.compare refuses "
                    "them; run at task.scale=tiny or full for results.",
                    None,
                )
            )
        if self.excluded:
            sections.append(
                (
                    "Runs not counted",
                    "Not the agent's doing: kept out of every mean and rate.",
                    excluded_table(self.excluded),
                )
            )
        return sections

    def markdown(self, with_plots: bool = True) -> str:
        parts = [f"# {self.title}", "", self.context, ""]
        for heading, intro, table in self.sections():
            parts += [f"## {heading}", "", intro, ""]
            if table is not None:
                parts += [table.markdown(), ""]
        if with_plots and self.plots:
            parts += ["## Plots", ""]
            parts += [f"![{caption}]({path.name})\n" for caption, path in self.plots.items()]
        return "\n".join(parts).rstrip() + "\n"

    def html(self) -> str:
        body = [f"<h1>{html.escape(self.title)}</h1>", f"<p>{html.escape(self.context)}</p>"]
        for heading, intro, table in self.sections():
            body += [f"<h2>{html.escape(heading)}</h2>", f"<p>{emphasis(html.escape(intro))}</p>"]
            if table is not None:
                body.append(table.html())
        if self.plots:
            body.append("<h2>Plots</h2>")
            for caption, path in self.plots.items():
                data = base64.b64encode(path.read_bytes()).decode()
                body.append(
                    f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
        style = (
            "body{font-family:system-ui,sans-serif;margin:2em;max-width:90em}"
            "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;"
            "text-align:left;vertical-align:top}th{background:#f3f3f3}img{max-width:100%}"
        )
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
        )

    def write(self, out: Path, with_html: bool) -> list[Path]:
        """Write the files into `out`; return them (plots included)."""
        out.mkdir(parents=True, exist_ok=True)
        written = [
            write_csv(out / "summary.csv", SUMMARY_FIELDS, summary_records(self.stats)),
            write_csv(out / "runs.csv", RUN_FIELDS, run_records(self.rows)),
            write_csv(
                out / "not_scored.csv",
                ["task", "scale", "agent", "model", "budget", "cause", "runs", "reason", "which"],
                cause_records(self.causes),
            ),
        ]
        written += [write_csv(out / name, fields, records) for name, fields, records in self.csvs]
        (out / "summary.md").write_text(self.markdown())
        written.append(out / "summary.md")
        if with_html:
            (out / "report.html").write_text(self.html())
            written.append(out / "report.html")
        return written + list(self.plots.values())
