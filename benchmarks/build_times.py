"""First-time asset builds of the tiny tasks: how long a new user waits before a first run.

    .venv/bin/python -m benchmarks.build_times [--tasks a,b] [--out benchmarks/build_times.json] [--cache-dir DIR]

Builds each task's default tiny assets (seed as in its YAML) one after another into a
fresh, empty cache (a temporary folder, removed afterwards), as a first `python -m mlrb
task=<key>` would, and prints each build's wall time and the total, against issue 34's
target for all seven: 20 minutes on 2 cores (issue 16's 15, before each anchor became the
mean of `assets.anchor_seeds` runs). Run it on an otherwise idle machine: the
anchors' training runs use one thread each, but the figures still move with the load.
`--cache-dir DIR` builds into DIR instead and keeps the assets there (the tests' cache,
say, ~/.cache/mlrb-tests, so that one wait serves both); a task whose assets DIR holds
already is refused, since that build would not be a first one.
With `--out`, the figures are written there with where and how they were measured, and
benchmarks/RESULTS.md is written again when that is benchmarks/build_times.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.calibration import TASKS, load_task
from benchmarks.results import Section, commands, load, table, where

TARGET_S = 20 * 60


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (the anchors' runs, forked by
    the warm interpreter, are counted once it has reaped them and ended itself, within the build)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def build_seconds(task, cache_dir: Path) -> tuple[float, float, str]:
    """A first build's wall time, the CPU time it used (every core's, its processes') and how it
    calibrated (`calibrated`)."""
    from mlrb.harness.assets import ensure_assets

    started, cpu = time.monotonic(), cpu_seconds()
    assets = ensure_assets(task, cache_dir)
    return time.monotonic() - started, cpu_seconds() - cpu, calibrated(assets)


def calibrated(assets: Path) -> str:
    """How a build got its anchors, which sets much of its time: `shipped` (seed 0 of each anchor
    run here scored as mlrb's shipped calibration did, which it then took), `every seed` (each
    anchor run at every seed: another CPU's kernels, or assets mlrb ships no calibration for), or
    `no seeds` (anchors no seed reaches, such as llm_merging's merges)."""
    calibration = json.loads((assets / "hidden" / "calibration.json").read_text())
    if "shipped" in calibration:
        return "shipped"
    return "every seed" if "anchor_seeds" in calibration else "no seeds"


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task keys (default: all seven)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="build into this folder and keep the assets")
    args = parser.parse_args()
    keys = [k.strip() for k in args.tasks.split(",") if k.strip()]
    unknown = [k for k in keys if k not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]!r}; valid: {', '.join(TASKS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    measured = results_page.provenance(sources=SECTION.sources)  # as it starts: the load average is the start's
    seconds, cpu, calibrations = {}, {}, {}
    tasks = {key: load_task(key) for key in keys}  # each at its default tiny assets
    if args.cache_dir:
        from mlrb.harness.assets import asset_dir

        built = [key for key in keys if asset_dir(tasks[key], args.cache_dir).exists()]
        if built:
            parser.error(f"{args.cache_dir} holds the assets of {', '.join(built)} already: not a first build")
    with tempfile.TemporaryDirectory(prefix="mlrb-build-times-") as temporary:
        cache = args.cache_dir or Path(temporary)
        for key in keys:
            wall, used, calibrations[key] = build_seconds(tasks[key], cache)
            seconds[key], cpu[key] = round(wall, 1), round(used, 1)
            print(f"{key:22s} {seconds[key]:7.1f} s {cpu[key]:8.1f} CPU s  anchors: {calibrations[key]}", flush=True)
    total, total_cpu = round(sum(seconds.values()), 1), round(sum(cpu.values()), 1)
    print(
        f"{'total':22s} {total:7.1f} s {total_cpu:8.1f} CPU s ({total / 60:.1f} min, {total_cpu / 60:.1f} CPU min; "
        f"target for all seven: {TARGET_S // 60} min)"
    )
    if args.out:
        figures = {
            "seconds": seconds,
            "total_s": total,
            "cpu_seconds": cpu,
            "total_cpu_s": total_cpu,
            "calibration": calibrations,
            "cpus": os.cpu_count(),
            "measured": measured,
        }
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"written to {results_page.update(args.out)}", file=sys.stderr)


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def build_times_section(bench_dir: Path) -> str:
    data = load(bench_dir, "build_times.json")
    seconds, total, calibration = data["seconds"], data["total_s"], data.get("calibration", {})
    rows = [[f"`{key}`", f"{s:.1f} s", calibration.get(key, "not recorded")] for key, s in seconds.items()]
    rows.append(["total", f"{total:.1f} s ({total / 60:.1f} min; target for all seven: 20 min, issue 34)", ""])
    return "\n\n".join([
        "How long a new user waits before a first run: `benchmarks/build_times.py` builds each task's "
        "default tiny assets (the seed in its YAML) one after another into a fresh, empty cache, as a first "
        "`python -m mlrb task=<key>` would, and records each build's wall time and the total. An asset build "
        "runs its anchors' commands side by side, one per core, each on one thread (a plain `python SCRIPT` "
        "forked from a warm interpreter that has done the starter's imports, mlrb/task_kit/warm_python.py), and "
        "scores each as it ends, on one thread too. Builds are cached under "
        "`~/.cache/mlrb`, so a user pays this once per task. The figures move with the machine's load "
        "(a busy machine stretches them several times over): measure on an idle machine. *anchors* says how "
        "each build calibrated: *shipped* where its anchors' seed 0 scored as the calibration mlrb ships "
        "(`mlrb/data/calibration.json`), which it then took; *every seed* where it ran each anchor at every "
        "seed, as on a CPU whose kernels score seed 0 otherwise, which takes longer; *no seeds* where no seed "
        "reaches the anchors.",
        "Measured again on an idle machine with:",
        commands("-m benchmarks.build_times --out benchmarks/build_times.json"),
        f"Output: `benchmarks/build_times.json`. {where(data.get('measured'))}",
        table(["task", "first build", "anchors"], rows),
    ])  # fmt: skip


SECTION = Section(
    "First asset builds",
    order=80,
    reads=("build_times.json",),
    render=build_times_section,
    page="suite",
    sources=("mlrb/tasks", "mlrb/harness/assets.py", "mlrb/scoring", "requirements.lock"),
)


if __name__ == "__main__":
    main()
