"""Review runs again with today's rules:

    python -m mlrb.review RUN_DIR [RUN_DIR ...]     # run folders (outputs/runs/<run>) or sweep folders

Each run's review.json is written anew in its folder, and one line per run is printed: its name,
its verdict (clean, suspicious, tampering), how many findings, the first of them. The verdict goes
to the run's tags (`mlrb.review`, `mlrb.review_findings`) and review.json to its artifacts, in its
record and, when it can be reached, the store it was recorded for. A folder that holds no ended
run is one line on stderr, exit status 2; with --fail-on VERDICT, exit status 1 when a run's verdict
is that or worse.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlrb.formats import run_folder
from mlrb.review.recording import record_review
from mlrb.review.review import CLEAN, review_folder
from mlrb.review.rules import SUSPICIOUS, TAMPERING

ORDER = (CLEAN, SUSPICIOUS, TAMPERING)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mlrb.review", description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", type=Path, help="run folders (outputs/runs/<run>) or sweep folders")
    p.add_argument("--no-store", action="store_true", help="write review.json only: no record lines, no store")
    p.add_argument("--fail-on", choices=ORDER[1:], default=None, help="exit 1 when a run's verdict is this or worse")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        runs = run_folder.runs_in(args.folders)
    except run_folder.NotARun as e:
        print(f"mlrb.review: error: {e}", file=sys.stderr)
        sys.exit(2)
    worst = CLEAN
    for run in runs:
        done = review_folder(run.path)
        where = "" if args.no_store else f" [{record_review(run.path, done)}]"
        print(done.line() + where, flush=True)
        worst = max(worst, done.verdict, key=ORDER.index)
    if args.fail_on and ORDER.index(worst) >= ORDER.index(args.fail_on):
        sys.exit(1)


if __name__ == "__main__":
    main()
