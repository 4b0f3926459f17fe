"""Where the suite's CPU goes, function by function, across the Python processes it starts: a
sampling profile. Process accounting (benchmarks/process_cpu.py) says which kinds of process
cost; this says which functions in them do, the libraries' included.

    python -m benchmarks.suite_profile [--out DIR] [--top N] [-- PYTEST_ARGS ...]

runs `python -m pytest PYTEST_ARGS` (plain: the README's tiers) with benchmarks/sampler/ on
PYTHONPATH, so that every Python process it starts samples its own stack every 5 ms of its CPU
time (benchmarks/sampler/sitecustomize.py), then prints the CPU seconds sampled by kind of
process, the functions with the most CPU below them (imports, Hydra's composing, MLflow's
store...) and the ones with the most in themselves. The samples stay in DIR; `--read DIR`
prints them again. Processes in a sandbox cannot write theirs (the scorers', the agents'): their
CPU is in process accounting's figures only. Measure with nothing else running."""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SAMPLER = Path(__file__).resolve().parent / "sampler"
INTERVAL_S = 0.005  # the sampler's, per sample
SITE = re.compile(r".*/(site|dist)-packages/")
STDLIB = re.compile(r".*/lib/python3\.\d+/")


def profile_command(command: Sequence[str], out: Path, cwd: Path | None = None) -> int:
    """COMMAND run with the sampler on; each of its Python processes' samples land in OUT."""
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(SAMPLER), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "MLRB_PROFILE_DIR": str(out)}
    return subprocess.run(list(command), cwd=cwd, env=env).returncode


def frame_name(frame: str, root: Path) -> str:
    """A sampled frame as `file:function`, the file relative to the repository or a library's folder."""
    name = SITE.sub("", frame)
    name = STDLIB.sub("std:", name)
    return name.replace(f"{root}/", "")


def kind(argv: str, stack: Sequence[str]) -> str:
    if "recording_process" in argv or any("become_recording_process" in f for f in stack):
        return "recording processes"
    if any("xdist/remote.py" in f or "_pytest/main.py" in f for f in stack):
        return "pytest and its workers"
    if any(f.startswith("mlrb/cli.py:") for f in stack) or "mlrb/__main__" in argv:
        return "`python -m mlrb` commands and sweep jobs"
    return "other Python processes"


def read(out: Path, root: Path) -> tuple[collections.Counter, collections.Counter, collections.Counter]:
    """Samples by kind of process, by function below which they were (once per stack), and by the
    function they were in."""
    kinds: collections.Counter = collections.Counter()
    below: collections.Counter = collections.Counter()
    inside: collections.Counter = collections.Counter()
    for file in out.glob("*.txt"):
        lines = file.read_text().splitlines()
        if len(lines) < 2 or not lines[0].startswith("argv\t"):
            continue  # cut short as it was written
        argv = lines[0].split("\t", 1)[1]
        for line in lines[2:]:
            count, _, joined = line.partition("\t")
            stack = [frame_name(f, root) for f in joined.split(";")]
            kinds[kind(argv, stack)] += int(count)
            inside[stack[-1]] += int(count)
            for name in set(stack):
                below[name] += int(count)
    return kinds, below, inside


def report(out: Path, root: Path, top: int) -> None:
    kinds, below, inside = read(out, root)
    seconds = lambda n: n * INTERVAL_S  # noqa: E731
    print(f"{seconds(sum(kinds.values())):.1f} CPU s sampled in the Python processes outside the sandboxes")
    for name, n in kinds.most_common():
        print(f"  {seconds(n):8.1f}  {name}")
    hidden = ("<frozen", "<string>", "runpy", "pluggy/", "_pytest/", "xdist/", "execnet/")
    print(f"\nthe {top} functions with the most CPU below them (CPU s):")
    for name, n in [(k, v) for k, v in below.most_common() if not k.startswith(hidden)][:top]:
        print(f"  {seconds(n):8.1f}  {name}")
    print(f"\nthe {top} functions with the most CPU in themselves (CPU s):")
    for name, n in inside.most_common(top):
        print(f"  {seconds(n):8.1f}  {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="where the samples go (default: a new temporary folder)")
    parser.add_argument("--read", type=Path, help="print the samples in this folder; run nothing")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    if args.read:
        report(args.read, root, args.top)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="mlrb-profile-"))
    status = profile_command([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args.pytest_args], out, root)
    report(out, root, args.top)
    print(f"\nsamples in {out} (pytest's exit status: {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())
