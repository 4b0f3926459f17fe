"""Review runs again with today's rules:

    python -m mlrb.review RUN_DIR [RUN_DIR ...]     # run folders (outputs/runs/<run>) or sweep folders
    python -m mlrb.review --store [--sweep ID ...]  # the store's runs, from what it keeps of them

Each run's review.json is written anew in its folder, and one line per run is printed: its name,
its verdict (clean, suspicious, tampering), how many findings, the first of them. The verdict goes
to the run's tags (`mlrb.review`, `mlrb.review_findings`) and review.json to its artifacts, in its
record and, when it can be reached, the store it was recorded for. A folder that holds no ended
run is one line on stderr, exit status 2; with --fail-on VERDICT, exit status 1 when a run's verdict
is that or worse. With --judge MODEL, a model reads each run's record as a judge too (its findings
added, never removing one). With --store, the runs are those of the tracking store that pass the filters (as
`python -m mlrb.report` chooses them), reviewed from the artifacts and traces the store keeps, for
runs whose folders are gone; their verdicts go back to the store.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlrb.core.config import ConfigError, ReviewConfig, check_review
from mlrb.formats import run_folder
from mlrb.report.cli import ReportError, add_run_arguments, filters_of, read
from mlrb.report.runs import RUNNING
from mlrb.review.recording import judged_by, record_review
from mlrb.review.review import CLEAN, Review, review_folder
from mlrb.review.rules import SUSPICIOUS, TAMPERING

ORDER = (CLEAN, SUSPICIOUS, TAMPERING)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlrb.review", description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="*", type=Path, help="run folders (outputs/runs/<run>) or sweep folders")
    p.add_argument("--no-store", action="store_true", help="write review.json only: no record lines, no store")
    p.add_argument("--fail-on", choices=ORDER[1:], default=None, help="exit 1 when a run's verdict is this or worse")
    p.add_argument(
        "--store",
        action="store_true",
        help="review the tracking store's runs that pass the filters below, from what the store keeps "
        "of them (for runs whose folders are gone), instead of run folders",
    )
    p.add_argument(
        "--judge",
        metavar="MODEL",
        default=None,
        help="a model that reads each run's record as a judge too, after the rules (review.judge: e.g. "
        "claude-sonnet-5); its key from the provider's variable, its cost apart from the agent's",
    )
    p.add_argument(
        "--judge-max-usd",
        metavar="USD",
        type=float,
        default=ReviewConfig.judge_max_usd,
        help="the judge's own budget per run, in US dollars (default: %(default)s)",
    )
    p.add_argument(
        "--judge-base-url",
        metavar="URL",
        default=None,
        help="where the judge's provider is served (default: $ANTHROPIC_BASE_URL / $OPENAI_BASE_URL, "
        "else the provider's API)",
    )
    add_run_arguments(p)
    return p


def judge_config(args: argparse.Namespace) -> ReviewConfig | None:
    """The judge the command line names, checked as a run's config is (ConfigError: one line); None without one."""
    if args.judge is None:
        return None
    cfg = ReviewConfig(judge=args.judge, judge_max_usd=args.judge_max_usd, judge_base_url=args.judge_base_url)
    check_review(cfg)
    return cfg


def reviewed_folders(args: argparse.Namespace) -> list[Review]:
    runs = run_folder.runs_in(args.folders)
    judge = judged_by(judge_config(args))
    done = []
    for run in runs:
        review = review_folder(run.path, judge)
        where = "" if args.no_store else f" [{record_review(run.path, review)}]"
        print(review.line() + where, flush=True)
        done.append(review)
    return done


def reviewed_in_store(args: argparse.Namespace) -> list[Review]:
    """The store's ended runs that pass the filters, each reviewed from the store and tagged there."""
    from mlrb.review.stored import review_stored

    filters = filters_of(args)
    client, selection, shown_uri = read(args, filters)
    runs = [row for row in selection.rows if row.kind != RUNNING]
    if not runs:
        raise ReportError(f"no ended runs match (filters: {filters.describe()}) in {shown_uri}")
    done = []
    for row in runs:
        review = review_stored(client, client.get_run(row.run_id))
        print(f"{review.line()} [tagged in its store (run {row.run_id})]", flush=True)
        done.append(review)
    return done


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    if bool(args.folders) == args.store:
        p.error("name run or sweep folders, or --store for the tracking store's runs (not both)")
    chosen = [f for f in ("experiment", "task", "agent", "budget", "scale", "sweep") if getattr(args, f)]
    if chosen and not args.store:
        p.error(f"--{chosen[0]} chooses the store's runs: add --store, or name run folders without it")
    if args.judge and args.store:
        p.error("--judge reads run folders (the record the judge quotes from): name them instead of --store")
    if args.no_store and args.store:
        p.error("--no-store is for run folders: --store writes the verdicts to the store")
    try:
        done = reviewed_in_store(args) if args.store else reviewed_folders(args)
    except (run_folder.NotARun, ReportError, ConfigError) as e:
        print(f"mlrb.review: error: {e}", file=sys.stderr)
        sys.exit(2)
    worst = max((d.verdict for d in done), key=ORDER.index, default=CLEAN)
    if args.fail_on and ORDER.index(worst) >= ORDER.index(args.fail_on):
        sys.exit(1)


if __name__ == "__main__":
    main()
