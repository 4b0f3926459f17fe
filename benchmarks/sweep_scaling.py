"""How well sweeps scale, and what the harness costs per job.

    .venv/bin/python -m benchmarks.sweep_scaling [--jobs 12] [--slots 2] [--agent-seconds 10]
        [--out benchmarks/sweep_scaling.json]

Runs a trivial task (the default task with an agent that sleeps, then hands in an
empty submission: every stage of the harness runs, the scorer included, in its own
process or fresh container, but there is no model to evaluate) and prints:

- the wall time of one job through the local launcher, and of a sweep of `--jobs`
  such jobs with `--slots` at once, against the ideal (jobs x one job / slots): the
  scaling efficiency (target: at least 90%; the sweep's fixed cost, composing every
  job and opening the parent run, is paid once in either, so it can pass 100%), and
  the same with that fixed cost taken out (one plain run as the single-job time);
- per-job harness overhead for the bwrap, unconfined and docker sandboxes: from launching
  `python -m mlrb` to the agent's first action, and from its last action to the
  score being recorded in MLflow.

Everything is written into a temporary folder; the task's assets come from the
usual cache (built on first use). The figures go to `--out` (default
benchmarks/sweep_scaling.json) with where and how they were measured, and then
benchmarks/RESULTS.md is written again (when `--out` is its file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.results import Section, commands, load, table, where

REPO = Path(__file__).resolve().parent.parent


def mlrb(args: list[str], cwd: Path) -> float:
    """Run `python -m mlrb ARGS`; return its wall time (raise with its output if it fails)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mlrb", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"`python -m mlrb {' '.join(args)}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return time.monotonic() - started


def runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [r for r in client.search_runs(experiments) if r.data.tags.get("mlrb.role") != "sweep"]


def overheads(run, launched_at: float | None = None) -> tuple[float, float]:
    """(launch or run start -> first agent action, last agent action -> score recorded), seconds."""
    events = [json.loads(line) for line in open(Path(run.data.tags["mlrb.run_dir"]) / "trajectory.jsonl")]
    actions = [e["time"] for e in events if e["event"] in ("tool_call", "tool_result")]
    start = launched_at if launched_at is not None else run.info.start_time / 1000
    return actions[0] - start, run.info.end_time / 1000 - actions[-1]


def docker_problem() -> str:
    try:
        import docker

        client = docker.from_env()
        client.ping()
        client.images.get("mlrb-sandbox:latest")
    except Exception as e:  # no engine, no image, no permission: say which
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return ""


def single_run_overhead(root: Path, common: list[str], sandbox: str) -> tuple[float, float, float]:
    folder = root / f"single-{sandbox}"
    folder.mkdir()
    launched_at = time.time()
    wall = mlrb(
        [f"sandbox={sandbox}", f"tracking.dir={folder / 'mlruns'}", f"hydra.run.dir={folder / 'run'}", *common], folder
    )
    (run,) = runs(folder / "mlruns")
    return (wall, *overheads(run, launched_at))


def figures(args: argparse.Namespace, measured: dict, one: float, many: float, single: dict, job_times: list) -> dict:
    """sweep_scaling.json: the sweep's figures (seconds, efficiencies in percent) and, per sandbox,
    one plain run's wall time and harness overhead (or why it was not measured)."""
    plain = single["bwrap"][0]
    fixed = one - plain  # paid once by a sweep, not by a plain run
    ideal = args.jobs * one / args.slots
    sandboxes = {}
    for sandbox, result in single.items():
        if isinstance(result, str):
            sandboxes[sandbox] = {"not_measured": f"no usable Docker engine or image ({result})"}
            continue
        wall, before, after = result
        sandboxes[sandbox] = {"wall_s": round(wall, 2), "to_first_action_s": round(before, 2),
                              "after_last_action_s": round(after, 2)}  # fmt: skip
    return {
        "measured": measured,
        "jobs": args.jobs,
        "slots": args.slots,
        "agent_seconds": args.agent_seconds,
        "one_job_s": round(one, 2),
        "sweep_s": round(many, 2),
        "ideal_s": round(ideal, 2),
        "efficiency_pct": round(100 * ideal / many, 1),
        "fixed_cost_s": round(fixed, 2),
        "plain_run_sandbox": "bwrap",
        "plain_run_s": round(plain, 2),
        "efficiency_without_fixed_cost_pct": round(100 * (args.jobs * plain / args.slots) / (many - fixed), 1),
        "median_job_s": round(statistics.median(job_times), 2),
        "sandboxes": sandboxes,
    }


def write(out: Path, result: dict) -> None:
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {results_page.update(out)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--agent-seconds", type=float, default=10.0, help="how long each job's agent works (sleeps)")
    parser.add_argument("--cache-dir", default=None, help="task asset cache (default: the harness's)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "sweep_scaling.json",
                        help="write the figures here (JSON) and benchmarks/RESULTS.md from it")  # fmt: skip
    args = parser.parse_args()
    measured = results_page.provenance(sources=SECTION.sources)  # as it starts: the load average is the start's

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    common = [f"task.scales.tiny.baseline_command='sleep {args.agent_seconds:g} && mkdir submission'"]
    if args.cache_dir:
        common.append(f"paths.cache_dir={Path(args.cache_dir).resolve()}")

    with tempfile.TemporaryDirectory(prefix="mlrb-bench-") as tmp:
        root = Path(tmp)
        mlrb(["--cfg", "job"], root)  # warm the OS file cache (imports) before timing anything
        mlrb([f"tracking.dir={root / 'warmup'}", f"hydra.run.dir={root / 'warmup-run'}", *common], root)  # assets built

        def sweep(name: str, seeds: list[int], slots: int) -> float:
            folder = root / name
            folder.mkdir()
            return mlrb(
                ["-m", f"seed={','.join(map(str, seeds))}", f"hydra.launcher.slots={slots}",
                 f"tracking.dir={folder / 'mlruns'}", f"hydra.sweep.dir={folder / 'sweep'}", *common], folder,
            )  # fmt: skip

        one = sweep("one-job", [0], 1)
        many = sweep("sweep", list(range(1, args.jobs + 1)), args.slots)
        ideal = args.jobs * one / args.slots
        sweep_runs = runs(root / "sweep" / "mlruns")
        assert len(sweep_runs) == args.jobs and all(r.info.status == "FINISHED" for r in sweep_runs)
        job_times = [(r.info.end_time - r.info.start_time) / 1000 for r in sweep_runs]
        single = {}  # sandbox -> (wall, launch -> first action, last action -> score) of one plain run
        for sandbox in ("bwrap", "unconfined", "docker"):
            problem = docker_problem() if sandbox == "docker" else ""
            single[sandbox] = problem or single_run_overhead(root, common, sandbox)
        # A sweep pays once for composing every job and opening its parent run; a plain run
        # does not. Taking that fixed cost out of both sides leaves the scaling of the jobs.
        fixed = one - single["bwrap"][0]
        ideal_jobs = args.jobs * single["bwrap"][0] / args.slots

        print(f"Sweep of {args.jobs} jobs (agent sleeps {args.agent_seconds:g} s), local launcher, {args.slots} slots, "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        print(f"  one job through the launcher:   {one:7.1f} s")
        print(f"  sweep of {args.jobs:<3d} jobs:             {many:7.1f} s")
        print(f"  ideal ({args.jobs} x one job / {args.slots}):    {ideal:7.1f} s")
        print(f"  scaling efficiency:             {100 * ideal / many:7.1f} %   (target >= 90 %)")
        print(f"  sweep's fixed cost (one-job sweep - one plain run): {fixed:5.1f} s")
        print(f"  efficiency without it:         {100 * ideal_jobs / (many - fixed):7.1f} %   "
              f"({args.jobs} x {single['bwrap'][0]:.1f} s / {args.slots} against {many - fixed:.1f} s)")  # fmt: skip
        print(f"  median MLflow run time per job: {statistics.median(job_times):7.1f} s")

        print("Per-job harness overhead (one run, `python -m mlrb` launched to score recorded):")
        print(f"  {'sandbox':10s} {'total':>8s} {'launch -> first action':>24s} {'last action -> score recorded':>31s}")
        for sandbox, timings in single.items():
            if isinstance(timings, str):
                print(f"  {sandbox:10s} not measured: no usable Docker engine or image ({timings})")
                continue
            wall, before, after = timings
            print(f"  {sandbox:10s} {wall:7.1f}s {before:23.1f}s {after:30.1f}s")
        write(args.out, figures(args, measured, one, many, single, job_times))


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def sweep_scaling_section(bench_dir: Path) -> str:
    data = load(bench_dir, "sweep_scaling.json")
    jobs, slots = data["jobs"], data["slots"]

    def seconds(value: float | None) -> str:
        return "not recorded" if value is None else f"{value:.1f} s"

    def percent(value: float | None) -> str:
        return "not recorded" if value is None else f"{value:.0f}%"

    scaling = [
        ["one job through the launcher (a one-job sweep)", seconds(data["one_job_s"])],
        [f"sweep of {jobs} jobs, {slots} slots", seconds(data["sweep_s"])],
        [f"ideal ({jobs} x one job / {slots})", seconds(data["ideal_s"])],
        ["scaling efficiency: ideal / sweep (target >= 90%)", percent(data["efficiency_pct"])],
        [f"sweep's fixed cost: one-job sweep - one plain run (`sandbox={data['plain_run_sandbox']}`)",
         seconds(data["fixed_cost_s"])],
        ["efficiency with the fixed cost taken out of both sides", percent(data["efficiency_without_fixed_cost_pct"])],
        ["median MLflow run time per job", seconds(data["median_job_s"])],
    ]  # fmt: skip
    overhead = []
    for sandbox, figures in data["sandboxes"].items():
        if "not_measured" in figures:
            overhead.append([f"`{sandbox}`", f"not measured: {figures['not_measured']}", "", ""])
            continue
        overhead.append([f"`{sandbox}`", seconds(figures["wall_s"]), seconds(figures["to_first_action_s"]),
                         seconds(figures["after_last_action_s"])])  # fmt: skip
    return "\n\n".join([
        "`benchmarks/sweep_scaling.py` runs a trivial task (the default task with an agent that sleeps "
        f"{data['agent_seconds']:g} s, then hands in an empty submission: every stage of the harness runs, the "
        "scorer included, in its own process or fresh container, but there is no model to evaluate). It times "
        "one job through the local launcher and a sweep of many such jobs with a few at once, against the ideal "
        "(jobs x one job / slots). A sweep pays once for composing every job and opening its parent run, so the "
        "efficiency can pass 100%; taken out of both sides (one plain run as the single-job time), what is left "
        "is the scaling of the jobs. Then, per sandbox, one plain run's harness overhead: from launching "
        "`python -m mlrb` to the agent's first action, and from its last action to the score recorded in MLflow.",
        commands("-m benchmarks.sweep_scaling   # --jobs 12 --slots 2 --agent-seconds 10 by default"),
        f"Output: `benchmarks/sweep_scaling.json`. {where(data.get('measured'))}",
        table(["", "figure"], scaling),
        table(["sandbox", "one run, total", "launch -> first action", "last action -> score recorded"], overhead),
    ])  # fmt: skip


SECTION = Section(
    "Sweep scaling",
    order=50,
    page="suite",
    reads=("sweep_scaling.json",),
    render=sweep_scaling_section,
    sources=("mlrb", "launchers", "requirements.lock"),
)


if __name__ == "__main__":
    main()
