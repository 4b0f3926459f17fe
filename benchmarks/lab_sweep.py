"""A lab's sweep: the paper's 7 tasks x 3 agents x 5 seeds of plumbing-scale runs, launched through
submitit on this machine and on the one-node SLURM cluster, each recorded into a tracking server on
PostgreSQL; what launching costs per job, and the load on the recording server.

    MLRB_TEST_POSTGRES=postgresql://USER:PW@127.0.0.1:5432/postgres \\
        .venv/bin/python -m benchmarks.lab_sweep [--seeds 5] [--launchers local,slurm] [--slots 2]
        [--out benchmarks/lab_sweep.json]

The agents: `baseline`, and `claude` and `gpt4o` against the project's scripted model server
(tests/fake_llm_server.py), which hands in at once; the runs are the tasks' plumbing scale (assets
built in seconds, nothing measured), so what is timed is the harness and its launch. The tracking
server is `python -m mlrb.tracking serve` on a database of its own (dropped at the end); the SLURM
cluster is launchers/slurm/setup_single_node.sh's (two CPUs: two jobs at once, as the local
launcher's two slots).

Per launcher it prints: the sweep's wall time; each job's own span (its run's record, from its
`opened` line to its `status` line); how long the slots sat without a run while jobs were still
to start, per job handed over; a plain run's own start and end (from `python -m mlrb` to its
`opened` line, and from its `status` line to its exit), the median of --repeats runs; and the
launch overhead per job beyond that (target: under 1 s); the tracking server's and PostgreSQL's
CPU over the sweep. A job has the node's cores shared by the slots (two slots on two cores: one
each, as the SLURM jobs ask), and a run's start is mostly Python work on two processes (the
harness, and the recording process importing MLflow), so the plain run that gives a job's own
start runs on that share (its CPU affinity); the overhead beyond a plain run with every core is
printed beside it.
`--seeds 5` is the lab's 105 jobs; fewer seeds keep the shape on a small machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import results as results_page
from benchmarks.results import table
from benchmarks.store_load import MODEL_SERVER, CpuMeter, offline_env, python, tracking_server

REPO = Path(__file__).resolve().parent.parent
TASKS = ("llm_efficiency", "baby_lm", "mini_pile", "llm_merging", "edge_llm_compression", "edge_llm_training",
         "math_reasoning")  # fmt: skip
AGENTS = ("baseline", "claude", "gpt4o")
TARGET_S = 1.0  # launch overhead per job, beyond the job's own start


@contextlib.contextmanager
def model_server(work: Path, turns: int) -> Iterator[dict[str, str]]:
    """The scripted model server, handing in at once on every turn: the environment that points the
    model agents at it."""
    (work / "turns.json").write_text(json.dumps([[["submit", {"summary": "plumbing"}]]] * turns))
    server = subprocess.Popen([sys.executable, str(MODEL_SERVER), str(work / "turns.json")], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        address = f"http://127.0.0.1:{server.stdout.readline().strip()}"
        yield {"ANTHROPIC_API_KEY": "sk-ant-lab-sweep", "ANTHROPIC_BASE_URL": address,
               "OPENAI_API_KEY": "sk-lab-sweep", "OPENAI_BASE_URL": f"{address}/v1"}  # fmt: skip
    finally:
        server.kill()
        server.wait()


def spans(folder: Path) -> list[tuple[float, float]]:
    """Each run's (opened, ended) times under FOLDER, from its record's first `opened` and last `status` lines."""
    found = []
    for path in sorted(folder.glob("*/record.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        opened = [line["t"] for line in lines if line["kind"] == "opened"]
        ended = [line["t"] for line in lines if line["kind"] == "status"]
        if opened and ended:
            found.append((opened[0], ended[-1]))
    return found


def idle_slot_time(runs: list[tuple[float, float]], slots: int) -> tuple[float, int]:
    """(slot-seconds without a run, hand-overs) from the first run's start to the last run's start:
    while jobs were still to start, every slot could have been running one."""
    begin, end = min(s for s, _ in runs), max(s for s, _ in runs)
    busy = sum(max(0.0, min(e, end) - max(s, begin)) for s, e in runs)
    return max(0.0, slots * (end - begin) - busy), max(1, len(runs) - slots)


def slurm_scheduler_delays(sweep_folder: Path, slots: int) -> list[float] | None:
    """SLURM's own part of each handover in the sweep's job arrays, from slurmctld's log (its
    millisecond times): None when the log cannot be read."""
    import re

    arrays = {m.group(1) for d in (sweep_folder / ".submitit").glob("*_*") if (m := re.fullmatch(r"(\d+)_\d+", d.name))}
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    found = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", config, re.M)
    if not arrays or not found or not os.access(found.group(1), os.R_OK):
        return None
    return scheduler_delays(Path(found.group(1)).read_text(errors="replace").splitlines(), arrays, slots)


def scheduler_delays(log: list[str], arrays: set[str], slots: int) -> list[float]:
    """From slurmctld's LOG: for each allocation of a task of ARRAYS (the first SLOTS, made at
    submission, aside), the time since the latest end of one of their tasks before it."""
    import datetime
    import re

    starts, ends = [], []
    for line in log:
        event = re.match(
            r"\[(\S+)\] (?:sched\S*: (?:Allocate|_start_job: Started)|_job_complete:) JobId=(\d+)_\d+", line
        )
        if not event or event.group(2) not in arrays or ("_job_complete" in line and not line.endswith(" done")):
            continue
        when = datetime.datetime.fromisoformat(event.group(1)).timestamp()
        (ends if "_job_complete" in line else starts).append(when)
    delays = []
    for start in sorted(starts)[slots:]:
        before = [end for end in ends if end <= start]
        if before:
            delays.append(start - max(before))
    return delays


def slurm_part(folder: Path, slots: int, overhead: float, launcher: str) -> dict[str, float]:
    """On SLURM, the launch overhead split: its scheduler's delay per handover (the cluster's, from its
    log) and the rest (the job's launch: slurmd, submitit's job process, the harness's own)."""
    delays = slurm_scheduler_delays(folder, slots) if launcher == "slurm" else None
    if not delays:
        return {}
    scheduler = statistics.mean(delays)
    return {"slurm_scheduler_s_per_handover": round(scheduler, 2),
            "launch_overhead_beyond_the_scheduler_s": round(overhead - scheduler, 2)}  # fmt: skip


def own_start(work: Path, common: list[str], env: dict[str, str], cpus: set[int], repeats: int) -> dict[str, Any]:
    """A plain run's own start (launch -> its `opened` line) and end (`status` line -> exit) on CPUS, per
    agent (a model agent's start imports its SDK) the median of REPEATS runs (a start on this machine
    varies by a second from one run to the next); overall, the mean of the agents', as the sweep runs
    each agent's jobs alike."""
    agents = {}
    for agent in AGENTS:
        starts, ends = [], []
        for repeat in range(repeats):
            folder = work / f"plain-{len(cpus)}-{agent}-{repeat}"
            command = [sys.executable, "-m", "mlrb", "task=llm_merging", f"agent={agent}", f"seed={100 + repeat}",
                       f"hydra.run.dir={folder}", *common]  # fmt: skip
            launched = time.time()
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                                  preexec_fn=lambda: os.sched_setaffinity(0, cpus))  # fmt: skip
            exited = time.time()
            if done.returncode != 0:
                raise SystemExit(f"the plain run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            opened, ended = spans_of(folder)
            starts.append(opened - launched)
            ends.append(exited - ended)
        agents[agent] = {"start_s": round(statistics.median(starts), 2), "end_s": round(statistics.median(ends), 2)}
    return {"start_s": round(statistics.mean(a["start_s"] for a in agents.values()), 2),
            "end_s": round(statistics.mean(a["end_s"] for a in agents.values()), 2),
            "cpus": len(cpus), "repeats": repeats, "agents": agents}  # fmt: skip


def spans_of(folder: Path) -> tuple[float, float]:
    lines = [json.loads(line) for line in (folder / "record.jsonl").read_text().splitlines() if line.strip()]
    return ([line["t"] for line in lines if line["kind"] == "opened"][0],
            [line["t"] for line in lines if line["kind"] == "status"][-1])  # fmt: skip


def sweep(meter: CpuMeter, work: Path, launcher: str, args: argparse.Namespace, common: list[str],
          env: dict[str, str], own: dict[str, float], own_all: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    """One sweep through LAUNCHER, timed."""
    import psutil  # type: ignore[import-untyped]

    folder = work / f"sweep-{launcher}"
    overrides = ["-m", f"task={','.join(TASKS[: args.tasks])}", f"agent={','.join(AGENTS)}",
                 f"seed={','.join(str(s) for s in range(1, args.seeds + 1))}", f"hydra.sweep.dir={folder}", *common]  # fmt: skip
    if launcher == "slurm":
        overrides += ["launcher=slurm", "task.scales.tiny.hardware.cpus=1"]  # two jobs at once on the 2-CPU node
    else:
        overrides += [f"hydra.launcher.slots={args.slots}"]
    started = time.time()
    with meter.measure() as load:
        process = psutil.Popen([sys.executable, "-m", "mlrb", *overrides], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        launcher_cpu = 0.0
        while process.poll() is None:  # the sweep's own process: its launcher and its recording server
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                launcher_cpu = times.user + times.system
            time.sleep(0.5)
        output = process.stdout.read() if process.stdout else ""
    exited = time.time()
    if process.returncode != 0:
        raise SystemExit(f"the {launcher} sweep failed:\n{output[-4000:]}")
    runs = spans(folder)
    jobs = len(runs)
    idle, handovers = idle_slot_time(runs, args.slots)
    gap = idle / handovers
    first = min(s for s, _ in runs)
    last = max(e for _, e in runs)
    return {
        "jobs": jobs,
        "wall_s": round(exited - started, 1),
        "median_job_s": round(statistics.median(e - s for s, e in runs), 2),
        "to_first_run_s": round(first - started, 2),
        "after_last_run_s": round(exited - last, 2),
        "idle_slot_s_per_handover": round(gap, 2),
        "launch_overhead_per_job_s": round(gap - own["start_s"] - own["end_s"], 2),
        # against a plain run that had every core to itself: what the job's share of the node adds too
        "beyond_a_run_on_all_cpus_s": round(gap - own_all["start_s"] - own_all["end_s"], 2),
        "launcher_cpu_s": round(launcher_cpu, 1),
        **slurm_part(folder, args.slots, gap - own["start_s"] - own["end_s"], launcher),
        "server_cpu_s": load["server_cpu_s"],
        "postgres_cpu_s": load["postgres_cpu_s"],
        "server_cores": round((load["server_cpu_s"] + load["postgres_cpu_s"]) / load["wall_s"], 3),
        "output_tail": output.strip().splitlines()[-1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds per task and agent (5: the lab's 105 jobs)")
    parser.add_argument("--tasks", type=int, default=len(TASKS), help=f"how many of the {len(TASKS)} tasks")
    parser.add_argument("--launchers", default="local,slurm", help="local, slurm or both (comma-separated)")
    parser.add_argument("--slots", type=int, default=2, help="jobs at once (the SLURM node has 2 CPUs)")
    parser.add_argument("--repeats", type=int, default=3, help="plain runs timed for a run's own start (median)")
    parser.add_argument("--note", default=None)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "lab_sweep.json",
                        help="write the figures here (JSON) and benchmarks/RESULTS.md from it")  # fmt: skip
    args = parser.parse_args()
    launchers = args.launchers.split(",")
    if not set(launchers) <= {"local", "slurm"}:
        raise SystemExit(f"--launchers {args.launchers}: give local, slurm or local,slurm")
    measured = results_page.provenance(sources=("mlrb", "launchers", "requirements.lock"), note=args.note)
    jobs = args.tasks * len(AGENTS) * args.seeds

    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlrb-lab-sweep-")))
        uri, server, database = stack.enter_context(tracking_server(work, None))
        models = stack.enter_context(model_server(work, 4 * jobs + 10))
        env = offline_env(**models)
        meter = CpuMeter(server.pid, database)
        common = ["task.scale=plumbing", "tracking=server", f"tracking.uri={uri}"]
        for task in TASKS[: args.tasks]:  # each task's plumbing assets, built before anything is timed
            python(["-m", "mlrb", f"task={task}", "agent=baseline", f"hydra.run.dir={work / 'warm' / task}", *common],
                   work, env)  # fmt: skip
        # A job's own start is a plain run's on the CPUs a job has: the node's shared by the slots.
        cores = sorted(os.sched_getaffinity(0))
        own = own_start(work, common, env, set(cores[: max(1, len(cores) // args.slots)]), args.repeats)
        own_all = own_start(work, common, env, set(cores), args.repeats)
        print(f"{jobs} jobs ({args.tasks} tasks x {len(AGENTS)} agents x {args.seeds} seeds), plumbing scale, "
              f"{args.slots} at once, {len(cores)} CPUs; a plain run's own start {own['start_s']:.1f} s and end "
              f"{own['end_s']:.1f} s on a job's share, {own['cpus']} CPU(s) ({own_all['start_s']:.1f} s and "
              f"{own_all['end_s']:.1f} s on all {len(cores)})", flush=True)  # fmt: skip
        figures = {}
        for launcher in launchers:
            figures[launcher] = sweep(meter, work, launcher, args, common, env, own, own_all)
            show(launcher, figures[launcher])
        shutil.rmtree(work / "warm", ignore_errors=True)
    result = {"measured": measured, "tasks": args.tasks, "agents": len(AGENTS), "seeds": args.seeds, "jobs": jobs,
              "slots": args.slots, "plain_run": own, "plain_run_all_cpus": own_all, "launchers": figures}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {results_page.update(args.out)}", file=sys.stderr)


def show(launcher: str, f: dict[str, Any]) -> None:
    print(f"\n{launcher}: {f['jobs']} jobs in {f['wall_s']:.0f} s (a job's run {f['median_job_s']:.1f} s median)")
    print(f"  launch to the first run: {f['to_first_run_s']:.1f} s; the last run's end to the sweep's: "
          f"{f['after_last_run_s']:.1f} s")  # fmt: skip
    print(f"  slots without a run while jobs waited: {f['idle_slot_s_per_handover']:.2f} s per job handed over")
    print(f"  launch overhead per job beyond its own start: {f['launch_overhead_per_job_s']:.2f} s "
          f"(target < {TARGET_S:g} s; {f['beyond_a_run_on_all_cpus_s']:.2f} s beyond a run with every core)")  # fmt: skip
    if "slurm_scheduler_s_per_handover" in f:
        print(f"  of which SLURM's scheduler, from a job's end to the next one's allocation: "
              f"{f['slurm_scheduler_s_per_handover']:.2f} s; the rest: {f['launch_overhead_beyond_the_scheduler_s']:.2f} s")  # fmt: skip
    print(f"  the sweep's own process: {f['launcher_cpu_s']:.1f} CPU s; tracking server {f['server_cpu_s']:.1f} "
          f"CPU s + PostgreSQL {f['postgres_cpu_s']:.1f} CPU s ({f['server_cores']:.2f} cores)")  # fmt: skip
    sys.stdout.flush()


def sweep_part(data: dict) -> str:
    """The sweep's part of the store's section (benchmarks/store_load.py's)."""
    shape = f"{data['tasks']} tasks x {data['agents']} agents x {data['seeds']} seeds"
    # two tables, so each fits the page's column
    runs, costs = [], []
    for launcher, f in data["launchers"].items():
        name = f"`{launcher}`"
        runs.append([name, f"{f['jobs']} jobs in {f['wall_s']:.0f} s", f"{f['median_job_s']:.1f} s",
                     f"{f['idle_slot_s_per_handover']:.2f} s",
                     f"{f['server_cpu_s'] + f['postgres_cpu_s']:.0f} CPU s ({f['server_cores']:.2f} cores)"])  # fmt: skip
        costs.append([name, f"{f['launch_overhead_per_job_s']:.2f} s",
                      f"{f['slurm_scheduler_s_per_handover']:.2f} s" if "slurm_scheduler_s_per_handover" in f else "-",
                      f"{f['beyond_a_run_on_all_cpus_s']:.2f} s" if "beyond_a_run_on_all_cpus_s" in f else "-"])  # fmt: skip
    plain = data["plain_run"]
    return "\n\n".join([
        f"`benchmarks/lab_sweep.py` launches a sweep of the lab's shape ({shape}: {data['jobs']} plumbing-scale "
        f"runs, {data['slots']} at once) through each launcher into a tracking server on PostgreSQL. A slot without "
        "a run while jobs still wait is the launch's cost; a plain run's own start and end on a job's share of "
        f"the cores ({plain['start_s']:.1f} s and {plain['end_s']:.1f} s here, on {plain.get('cpus', 'all')} "
        f"CPU(s), the mean of the three agents') are taken off it. The target: under {TARGET_S:g} s a job. On "
        "SLURM, part of it is the cluster's scheduler: from a job's end to the next job's allocation, read from "
        "slurmctld's log. The last column takes off a plain run's start and end with every core instead. "
        "`--seeds 5` launches the lab's 105 jobs; fewer seeds keep its shape on a small machine.",
        table(["launcher", "sweep", "a job's run (median)", "slot idle per job", "tracking server and PostgreSQL"],
              runs),  # fmt: skip
        table(["launcher", "launch overhead per job", "of which SLURM's scheduler", "beyond a run with every core"],
              costs),  # fmt: skip
    ])  # fmt: skip


if __name__ == "__main__":
    main()
