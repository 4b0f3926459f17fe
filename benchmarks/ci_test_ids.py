"""Which tests CI runs at two commits, and what changed between them: the check that a change to
how the suite is split or selected drops no test from CI.

    .venv/bin/python -m benchmarks.ci_test_ids BEFORE [AFTER]   # AFTER: HEAD

Each commit is cloned into a temporary folder and its tests collected as its `.ci/run` selects
them: every `python -m pytest` line of `.ci/run`, run with `--collect-only` and a `-k` that
deselects nothing (an older commit's build-ahead ran on collection unless -k was given). Prints the tests only BEFORE ran, those
only AFTER runs, and the counts; exits 1 when a test of BEFORE is missing from AFTER (a renamed
test shows as one missing and one new: say so in the change that renames it).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"


def pytest_lines(ci_script: str) -> list[list[str]]:
    """The arguments of each `python -m pytest` command in a .ci/run script."""
    found = []
    for line in ci_script.splitlines():
        match = re.search(r"python -m pytest(.*?)(\|\||$)", line.split("#", 1)[0])
        if match:
            found.append(shlex.split(match.group(1)))
    return found


def ci_test_ids(commit: str) -> set[str]:
    """The test ids `.ci/run` of COMMIT runs."""
    with tempfile.TemporaryDirectory(prefix="mlrb-ci-ids-") as scratch:
        clone = Path(scratch) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
        ids: set[str] = set()
        for args in pytest_lines((clone / ".ci" / "run").read_text()):
            args = [*args, "-k", "not mlrb_ci_ids_no_such_test"]  # selects the same tests, builds nothing
            command = [str(PYTHON), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *args]
            done = subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise SystemExit(
                    f"{commit}: collecting {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
            ids |= {line.strip() for line in done.stdout.splitlines() if "::" in line}
        return ids


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="the commit before the change")
    parser.add_argument("after", nargs="?", default="HEAD", help="the commit after it (default HEAD)")
    args = parser.parse_args()
    before, after = ci_test_ids(args.before), ci_test_ids(args.after)
    gone, new = sorted(before - after), sorted(after - before)
    for test in gone:
        print(f"only before: {test}")
    for test in new:
        print(f"only after:  {test}")
    print(f"{args.before}: {len(before)} tests in CI; {args.after}: {len(after)}; "
          f"{len(gone)} only before, {len(new)} only after")  # fmt: skip
    sys.exit(1 if gone else 0)


if __name__ == "__main__":
    main()
