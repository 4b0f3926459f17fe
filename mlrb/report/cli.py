"""`python -m mlrb.report`: read the tracking store, write the report, and log it
onto the sweep's parent run so `mlflow ui` shows it beside the runs.

Bad input (an unknown experiment, no matching runs, a store that is not there or
does not answer) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from mlrb.core.config import TrackingConfig
from mlrb.core.messages import first_line_of, mask_uris_in
from mlrb.core.tags import Tag
from mlrb.report.runs import COSTS, Filters, Selection, load

NOTE_MARKER = "<!-- written by python -m mlrb.report -->"


class ReportError(Exception):
    """A user-facing problem, reported as one line."""


class NoStore(ReportError):
    """No SQLite store where the runs were looked for."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mlrb.report",
        description="Paper-style tables and plots of mlrb's runs: per task x agent (x model, budget), mean ± SEM "
        "of the counted scores (a failed attempt counts as doing nothing) and of the valid submissions' raw scores, "
        "success and valid-submission rates, cost, tokens and wall time, why runs did not score, and which runs "
        "were not counted (infrastructure errors, killed, running, crashed).",
        epilog="Filters take one value or several (repeat the flag or separate with commas). Example: "
        "python -m mlrb.report --sweep 935e10cdca64 --html",
    )
    add_run_arguments(p)
    output = p.add_argument_group("what to write")
    output.add_argument("--out", default="reports", type=Path, help="output folder; default: reports")
    output.add_argument("--html", action="store_true", help="also write report.html, self-contained (plots inlined)")
    output.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    output.add_argument("--no-log", action="store_true", help="do not log the files onto the sweep's parent run")
    output.add_argument(
        "--cost",
        choices=COSTS,
        default="api",
        help="the dollars the cost-against-score plots and Pareto front use: the model API's (api), the "
        "compute's at the config's prices (compute), or both together (total); default: api",
    )
    return p


def add_run_arguments(p: argparse.ArgumentParser, agents: bool = True) -> None:
    """The filters and the store's whereabouts, shared with `python -m mlrb.compare` (which names
    its agents otherwise: `agents=False`)."""
    filters = p.add_argument_group("which runs")
    filters.add_argument(
        "--experiment", action="append", default=[], metavar="NAME", help="MLflow experiment(s); default: all"
    )
    filters.add_argument("--task", action="append", default=[], help="task(s), e.g. llm_merging")
    if agents:
        filters.add_argument("--agent", action="append", default=[], help="agent(s), e.g. baseline")
    filters.add_argument("--budget", action="append", default=[], help="budget(s), e.g. smoke")
    filters.add_argument("--scale", action="append", default=[], help="task scale(s): tiny, full")
    filters.add_argument(
        "--sweep", action="append", default=[], metavar="SWEEP_ID", help="sweep id(s) (tag mlrb.sweep_id)"
    )
    store = p.add_argument_group("where the runs are")
    store.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow tracking URI; default: $MLFLOW_TRACKING_URI, else the SQLite store in --tracking-dir",
    )
    store.add_argument(
        "--tracking-dir",
        default="mlruns",
        help="folder of the SQLite store (as the harness's tracking.dir); default: mlruns",
    )


def split(values: list[str]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def tracking_uri(args: argparse.Namespace) -> str:
    """As the harness: --tracking-uri, else $MLFLOW_TRACKING_URI, else SQLite in --tracking-dir.
    A missing SQLite file is an error here: a report must not create an empty store."""
    uri = TrackingConfig(uri=args.tracking_uri).named_uri()
    if not uri:
        db = Path(args.tracking_dir).expanduser().resolve() / "mlflow.db"
        if not db.is_file():
            raise NoStore(
                f"no tracking store at {db} (run from the folder you ran mlrb in, or pass "
                f"--tracking-dir or --tracking-uri)"
            )
        return f"sqlite:///{db}"
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        if not db.is_file():
            raise NoStore(f"no tracking store at {db}")
    return uri


def why(error: Exception) -> str:
    """The gist of a store error in a few words (MLflow's own messages run to paragraphs)."""
    from mlrb.store.tracking import unreachable_sign

    sign = unreachable_sign(error)
    if sign:
        return f"the server does not answer ({sign.lower()})"
    return first_line_of(mask_uris_in(str(error).strip()), 300) or type(error).__name__


def experiments(client: Any, names: list[str]) -> dict[str, str]:
    """id -> name of the experiments to read."""
    from mlrb.core.retries import with_retries

    known = with_retries(lambda: client.search_experiments(max_results=50000))
    by_name = {e.name: e.experiment_id for e in known}
    if not names:
        return {e.experiment_id: e.name for e in known}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ReportError(
            f"unknown experiment '{unknown[0]}'; experiments in the store: {', '.join(sorted(by_name)) or 'none'}"
        )
    return {by_name[n]: n for n in names}


def filters_of(args: argparse.Namespace) -> Filters:
    return Filters(
        experiments=split(args.experiment),
        tasks=split(args.task),
        agents=split(getattr(args, "agent", [])),
        budgets=split(args.budget),
        scales=split(args.scale),
        sweep_ids=split(args.sweep),
    )


def read(args: argparse.Namespace, filters: Filters) -> tuple[Any, Selection, str]:
    """(client, the runs that pass the filters, the store's URI as shown) of the store the
    arguments name; a store that is missing or does not answer is a ReportError."""
    from mlrb.store import tracking

    uri = tracking_uri(args)
    shown_uri = mask_uris_in(uri)
    try:
        client = tracking.reading_client(uri)
        chosen = experiments(client, filters.experiments)
        return client, load(client, chosen, filters), shown_uri
    except ReportError:
        raise
    except Exception as e:  # MlflowException, SQLAlchemy and connection errors all mean the same here
        raise ReportError(f"cannot read the tracking store {shown_uri}: {why(e)}") from None


def build(args: argparse.Namespace) -> int:
    from mlrb.report import aggregate, costs, curves, failures, flagged, paired, render, trajectories

    filters = filters_of(args)
    client, selection, shown_uri = read(args, filters)
    rows = selection.rows
    if not rows:
        raise ReportError(f"no runs match (filters: {filters.describe()}) in {shown_uri}")

    stats = aggregate.summarise(rows)
    sweep_ids = sorted({r.sweep_id for r in rows})
    sweep_id = sweep_ids[0] if len(sweep_ids) == 1 and sweep_ids[0] else None
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:  # the runs rescored step by step (python -m mlrb.rescore RUN_ID --all-steps)
        curve_groups, uncounted = curves.read(client, rows)
    except Exception as e:
        raise ReportError(f"cannot read the anytime metrics from {shown_uri}: {why(e)}") from None
    plots = {}
    if not args.no_plots:
        from mlrb.report.plots import draw_all

        plots = draw_all(stats, rows, out, args.cost)
        plots.update(curves.draw(curve_groups, out / "anytime.png"))
        plots.update(costs.draw(stats, out, args.cost))
    activities = trajectories.read_all(client, rows)  # each run's trajectory, read once
    findings = flagged.read_findings(client, rows)  # the flagged runs' review.json
    report = render.Report(
        title=f"mlrb report: sweep {sweep_id}" if sweep_id else "mlrb report",
        context=(
            f"Store {shown_uri}; experiments: {', '.join(sorted({r.experiment for r in rows}))}; "
            f"filters: {filters.describe()}; {len(rows)} runs; "
            f"written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
        ),
        stats=stats,
        causes=aggregate.why_not_scored(rows),
        excluded=aggregate.not_counted(rows),
        rows=rows,
        plots=plots,
        comparisons=paired.report_sections(rows),
        anytime=curves.report_sections(curve_groups, uncounted),
        costs=costs.report_sections(stats, args.cost),
        failures=failures.report_sections(stats, rows, activities),
        csvs=costs.csv_files(stats, args.cost) + failures.csv_files(stats, rows, activities),
        as_failures=flagged.as_failures_sections(rows),
        flagged=flagged.report_sections(rows, findings, shown_uri),
    )
    files = report.write(out, with_html=args.html) + curves.write_csvs(curve_groups, out)

    print(render.results_table(stats).markdown())
    for heading, _, table in report.as_failures:  # the headline both ways, where runs were flagged
        print(f"\n{heading}:\n{table.markdown()}")
    said = [f"{flagged.counts(rows)} (summary.md's Flagged runs lists them)"] if flagged.flagged(rows) else []
    for line in said + flagged.review_notes(rows):
        print(f"\n{line}")
    print(f"\n{len(rows)} runs in {len(stats)} groups; files in {out}/: {', '.join(f.name for f in files)}")
    parent = selection.sweep_parents.get(sweep_id) if sweep_id else None
    if parent is not None and not args.no_log:
        log_to_parent(client, parent, files, report)
        print(f"logged to the sweep's parent run {parent.info.run_id} (artifacts report/, and its description)")
    elif sweep_id is None and not args.no_log:
        print("not logged to MLflow: the runs are not all of one sweep (choose one with --sweep)")
    return 0


def log_to_parent(client: Any, parent: Any, files: list[Path], report: Any) -> None:
    """The files as artifacts under report/, and the tables as the run's description
    (MLflow shows a run's note as Markdown), unless someone wrote their own note there: each
    a line of the sweep's record first, when its folder is here, as a run's own facts are."""
    from mlrb.store import record, tracking

    folder = parent.data.tags.get(Tag.RUN_DIR)
    run_dir = Path(folder) if folder else None
    recorder = tracking.MlflowRunWriter(client, parent.info.run_id, parent.info.experiment_id)
    for path in files:
        record.append_after(
            run_dir, recorder, "artifact", file=str(path.resolve()), artifact_path="report", is_dir=False
        )
    note = parent.data.tags.get(Tag.NOTE, "")
    if not note or note.startswith(NOTE_MARKER):
        text = f"{NOTE_MARKER}\n{report.markdown(with_plots=False)}\nFiles, plots included: artifacts `report/`.\n"
        record.append_after(run_dir, recorder, "tags", tags={Tag.NOTE: text})


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        sys.exit(build(args))
    except ReportError as e:
        print(f"mlrb.report: error: {e}", file=sys.stderr)
        sys.exit(1)
