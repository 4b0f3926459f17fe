"""How long the harness's walks of a workspace take at their file cap, the figure behind
mlrb/run_files/workspace.py's MAX_FILES ("a few seconds a walk").

    .venv/bin/python -m benchmarks.workspace_walk [--files N] [--repeats 3]

A workspace of N empty files (default twice MAX_FILES, so every walk reaches the cap and
counts the rest) beside a starter file, in a temporary folder. Timed, each over the rounds:
the snapshot (one after every step of a run), the step's snapshot that a run keeps, and the
patch against the starter. Printed: median and max seconds of each, and the machine. The
tests check what a walk does at the cap on a cap made small (tests/test_workspace_traps.py);
how fast it does it at the real cap is measured here, not timed by a test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.results import cpu_model
from mlrb.run_files import snapshots, workspace


def fill(folder: Path, count: int) -> None:
    """COUNT empty files, a thousand a folder, as a data set unpacked in the workspace leaves them."""
    for i in range(0, count, 1000):
        sub = folder / "data" / f"{i // 1000:04d}"
        sub.mkdir(parents=True)
        for j in range(min(1000, count - i)):
            (sub / f"{j:04d}.txt").touch()


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--files", type=int, default=2 * workspace.MAX_FILES, help="files in the workspace")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three walks")
    args = parser.parse_args()
    if args.files < 1 or args.repeats < 1:
        parser.error(f"--files and --repeats must be at least 1, got {args.files} and {args.repeats}")
    with tempfile.TemporaryDirectory(prefix="mlrb-walk-") as tmp:
        root = Path(tmp)
        starter = root / "starter"
        starter.mkdir()
        (starter / "train.py").write_text("train()\n")
        ws = root / "workspace"
        before = workspace.prepare(starter, ws)
        fill(ws, args.files)
        times: dict[str, list[float]] = {"snapshot": [], "step's snapshot": [], "patch": []}
        for round_ in range(args.repeats):
            started = time.monotonic()
            workspace.snapshot(ws, workspace.Notes("the snapshot"))
            times["snapshot"].append(time.monotonic() - started)
            started = time.monotonic()
            snapshots.StepSnapshots(root / f"snapshots-{round_}").take(1, ws, before)
            times["step's snapshot"].append(time.monotonic() - started)
            started = time.monotonic()
            workspace.diff(before, ws, workspace.Notes("the patch"))
            times["patch"].append(time.monotonic() - started)
    print(f"a workspace of {args.files:,} files (cap {workspace.MAX_FILES:,}), {args.repeats} rounds, on "
          f"{cpu_model() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}:")  # fmt: skip
    for name, seconds in times.items():
        print(f"  {name:16s} median {statistics.median(seconds):6.2f} s   max {max(seconds):6.2f} s")


if __name__ == "__main__":
    main()
