"""What the harness itself costs per run, next to the imports it cannot do without.

    .venv/bin/python -m benchmarks.overhead [--repeats 5] [--cache-dir DIR] [--only noop|default]
        [--before DIR | --before-python PYTHON] [--out benchmarks/overhead.json]

Two runs, each timed beside its floor, in rounds (floor, run, floor, run...) so
that both see the same load on the machine:

- a no-op run: `python -m mlrb agent=claude` against a scripted stand-in for the
  Anthropic API on loopback (tests/fake_llm_server.py) whose first reply submits;
  its floor is `python -c "import hydra, anthropic, mlflow"` (also timed with the
  module of MLflow's SQLite store added, which `import mlflow` does not load);
- the default run: `python -m mlrb` (llm_merging, baseline agent); its floor is
  the imports of its harness process (`import hydra, mlflow`) plus those of its
  scorer process (`import torch, transformers, lm_eval...`), each a process of its own.

`--before DIR` also times the runs with the harness's `mlrb` taken from DIR, an earlier
checkout; the default run's scorer runs in a sandbox with the venv's own `mlrb`, which
PYTHONPATH does not reach, so to time an earlier version's default run install it in a
copy of the venv and give that venv's Python:

    git worktree add /tmp/before COMMIT
    cp -a .venv /tmp/before-venv
    /tmp/before-venv/bin/python -m pip install --no-deps --no-build-isolation -e /tmp/before
    .venv/bin/python -m benchmarks.overhead --only default --before-python /tmp/before-venv/bin/python

Assets are cached first (a warm-up run of each kind builds them if missing, creates
the kind's MLflow store, as a user's ./mlruns already exists, and fills the OS file
cache). Everything is written under a temporary folder.

Printed: wall time (median, min, max over the rounds); peak memory, the ru_maxrss
that os.wait4 returns for the child: the largest resident set reached by any single
process of its tree (the child itself, or a descendant that was waited for), not the
sum of the tree. Processes inside a bwrap sandbox's PID namespace are not seen (bwrap's
own init reaps them: a 490 MiB process under `bwrap --unshare-pid` reported 13 MiB when
checked by hand), so for the default run (bwrap) it is the peak of the harness's process
or of its MLflow recording process, whichever is larger;
the scorer floor's figure shows what the scorer alone reaches. Beside it, the peak of the
tree's resident sets summed (every process of the run at once: the harness, MLflow's
recording process, the sandbox's processes), read from /proc every 20 ms, so a peak
shorter than that can be missed. Then the ratio of run to
floor and the difference in memory, per round (median); and the time of each stage of
the run from its `stage_time_s.<stage>` metrics (mlrb/core/timeline.py; `compose` counts from
the process's start), with `other` the rest of the wall time (set-up between stages,
the run's last writes, Hydra's end and the process's end). Last, the CPU seconds each of
the run's processes spent, by what it is (the harness, MLflow's recording process, the
scorer, the sandbox), read from /proc with the memory: where a run's CPU goes, which is
what a run costs the test suite and a sweep that keeps every core busy.

The figures go to `--out` (default benchmarks/overhead.json) as one entry per run timed,
`noop` and `default`, each with where and how it was measured; an entry the run did not
time is kept. Then benchmarks/RESULTS.md is written again (when `--out` is its file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.results import Section, commands, load, signed, spread, table, where
from tests.fake_llm_server import FakeLlmServer, reply, tool

REPO = Path(__file__).resolve().parent.parent
STAGES = ("compose", "assets", "sandbox_start", "agent", "collect", "scoring", "recording")
CLAUDE_FLOOR = "import hydra, anthropic, mlflow"
# The same with the module MLflow's SQLite store needs and `import mlflow` leaves out
# (SQLAlchemy, Alembic, MLflow's table models): how much of the gap the store alone is.
STORE_FLOOR = CLAUDE_FLOOR + ", mlflow.store.tracking.sqlalchemy_store"
HARNESS_FLOOR = "import hydra, mlflow"
SCORER_FLOOR = "import torch, transformers, lm_eval.evaluator, lm_eval.tasks, lm_eval.models.huggingface"
SAMPLE_S = 0.02  # how often the process tree is read
# Which process of a run does what, by its command line (the first that matches); the rest of
# the tree (bwrap, the sandbox's exec server, the agent's commands) is "sandbox".
# What a process is, by a marker in its command line (the recording process's module before the
# package's folders too, so that --before can time an earlier checkout).
ROLES = (("recording", "mlrb.store.recording_process"), ("recording", "mlrb.recording_process"),
         ("scorer", "mlrb.scoring.worker"), ("harness", "-m mlrb"))  # fmt: skip
CPU_ROLES = ("harness", "recording", "scorer", "sandbox")  # as the tables show them
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_tree(root: int, cpu: dict[tuple[int, int], tuple[str, float]]) -> float:
    """The resident sets of a process and all its descendants, summed (MiB), read from /proc
    (0 for processes that are gone); descendants inside a sandbox's PID namespace count too.
    Notes in `cpu` each process's CPU seconds so far (user and system), under (pid, start
    time), with the role its command line had when first seen."""
    total_kib, pending = 0, [root]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                total_kib += next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            key = (pid, int(fields[19]))
            if key in cpu:
                role = cpu[key][0]
            else:
                with open(f"/proc/{pid}/cmdline") as cmdline:
                    command = cmdline.read().replace("\0", " ")
                role = next((name for name, marker in ROLES if marker in command), "sandbox")
            cpu[key] = (role, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending += [int(child) for child in children.read().split()]
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
    return total_kib / 1024


def measure(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float, dict[str, float]]:
    """(wall seconds, peak MiB, sampled peak of the tree's sum in MiB, CPU seconds per role) of
    one process tree; raise with its output if it fails. The tree is read every SAMPLE_S, so a
    peak shorter than that can be missed, and so can a process that lives less than that (and
    the CPU a process spends after its last reading: at most SAMPLE_S of it)."""
    with tempfile.TemporaryFile() as output:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT)
        sums = [0.0]
        seen: dict[tuple[int, int], tuple[str, float]] = {}
        done = threading.Event()

        def sample() -> None:
            while not done.wait(SAMPLE_S):
                sums.append(read_tree(proc.pid, seen))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            output.seek(0)
            raise SystemExit(f"`{' '.join(argv)}` failed ({proc.returncode}):\n{output.read().decode()[-4000:]}")
    cpu: dict[str, float] = defaultdict(float)
    for role, seconds in seen.values():
        cpu[role] += seconds
    return wall, usage.ru_maxrss / 1024, max(sums), dict(cpu)  # ru_maxrss: KiB on Linux


def stage_times(store: Path) -> dict[str, float]:
    """The stage times of the store's latest run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments, order_by=["attribute.start_time DESC"], max_results=1)
    return {s: run.data.metrics[f"stage_time_s.{s}"] for s in STAGES if f"stage_time_s.{s}" in run.data.metrics}


def summary(values: list[float], unit: str, digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} {unit} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def stats(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def stage_medians(wall: list[float], times: list[dict[str, float]]) -> dict[str, float]:
    """Median seconds of each stage, `other` (the wall time less the stages) and the wall time."""
    medians = {s: statistics.median(t.get(s, 0.0) for t in times) for s in STAGES}
    medians["other"] = statistics.median(w - sum(t.values()) for w, t in zip(wall, times, strict=True))
    medians["wall"] = statistics.median(wall)
    return medians


def cpu_medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Median CPU seconds of each role over the rounds, and of the whole tree."""
    medians = {role: statistics.median(r.get(role, 0.0) for r in rounds) for role in CPU_ROLES}
    medians["all"] = statistics.median(sum(r.values()) for r in rounds)
    return medians


def checkout_commit(folder: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def before_version(before: str | None, before_python: str | None) -> dict | None:
    """The earlier version timed beside this one: how it was given, and its checkout's commit."""
    if before:
        return {"option": "--before", "path": before, "commit": checkout_commit(Path(before))}
    if before_python:
        # run from / : from here, `-c` would find this checkout's mlrb first
        found = subprocess.run([before_python, "-c", "import mlrb, pathlib; print(pathlib.Path(mlrb.__file__).parent)"],
                               capture_output=True, text=True, cwd="/")  # fmt: skip
        package = Path(found.stdout.strip()).resolve()
        top = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--show-toplevel"], capture_output=True, text=True
        )
        # only a checkout installed in place (-e) tells its commit; a copy in site-packages does not
        commit = (
            checkout_commit(package) if found.returncode == 0 and Path(top.stdout.strip()) / "mlrb" == package else None
        )
        return {"option": "--before-python", "path": before_python, "commit": commit}
    return None


def entries(kinds: list[str], versions: list[str], wall: dict[str, list[float]], peak: dict[str, list[float]],
            tree: dict[str, list[float]], stages: dict[str, list[dict[str, float]]],
            cpu: dict[str, list[dict[str, float]]], repeats: int, measured: dict,
            before: dict | None) -> dict[str, dict]:  # fmt: skip
    """overhead.json's entries for the runs timed: {"noop": ..., "default": ...}. Figures are
    {"median", "min", "max"} over the rounds; `versions` are the result keys' suffixes ("", " before")."""

    def row(key: str) -> dict:
        return {"wall_s": stats(wall[key]), "peak_mib": stats(peak[key]), "tree_mib": stats(tree[key])}

    def above(key: str, floor: str, figures: dict[str, list[float]]) -> dict[str, float]:
        return stats([n - f for n, f in zip(figures[key], figures[floor], strict=True)])

    name = {"": "run", " before": "run_before"}
    out: dict[str, dict] = {}
    for kind in kinds:
        entry: dict = {"measured": measured, "repeats": repeats, "before": before, "rows": {}, "per_round": {}}
        if kind == "noop":
            entry["rows"] = {"floor": row("floor"), "store_floor": row("store_floor")}
            entry["per_round"]["store_floor"] = {
                "ratio": stats([s / f for s, f in zip(wall["store_floor"], wall["floor"], strict=True)]),
                "peak_above_floor_mib": above("store_floor", "floor", peak),
            }
        else:
            entry["rows"] = {"harness_floor": row("hfloor"), "scorer_floor": row("sfloor")}
        for v in versions:
            key = kind + v
            entry["rows"][name[v]] = row(key)
            if kind == "noop":
                entry["per_round"][name[v]] = {
                    "ratio": stats([n / f for n, f in zip(wall[key], wall["floor"], strict=True)]),
                    "peak_above_floor_mib": above(key, "floor", peak),
                    "tree_above_floor_mib": above(key, "floor", tree),
                }
            else:
                beyond = [d - h - s for d, h, s in zip(wall[key], wall["hfloor"], wall["sfloor"], strict=True)]
                entry["per_round"][name[v]] = {"beyond_imports_s": stats(beyond)}
        entry["stages_s"] = {name[v]: stage_medians(wall[kind + v], stages[kind + v]) for v in versions}
        entry["cpu_s"] = {name[v]: {r: round(c, 2) for r, c in cpu_medians(cpu[kind + v]).items()} for v in versions}
        out[kind] = entry
    return out


def write_entries(out: Path, new: dict[str, dict]) -> None:
    """Add or replace the timed runs' entries in `out`, keep the others, and write RESULTS.md again."""
    kept = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**kept, **new}, indent=2) + "\n")
    print(f"written to {results_page.update(out)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds (each: every floor and every run once)")
    parser.add_argument("--cache-dir", default=None, help="task asset cache (default: the harness's)")
    parser.add_argument("--only", choices=("noop", "default"), default=None, help="time only this run and its floor")
    parser.add_argument(
        "--before",
        metavar="DIR",
        default=None,
        help="also time both runs, in the same rounds, with the harness's mlrb package "
        "taken from DIR (put first on PYTHONPATH), e.g. a checkout of an earlier commit; "
        "the default run's scorer does not take it (see --before-python)",
    )
    parser.add_argument("--before-python", metavar="PYTHON", default=None,
                        help="also time both runs, in the same rounds, with this interpreter: a venv in which an "
                             "earlier checkout is installed, so that the default run's scorer (in its sandbox, "
                             "from the venv) runs that checkout too")  # fmt: skip
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "overhead.json",
                        help="write the figures here (JSON; the entries of runs not timed are kept) and "
                             "benchmarks/RESULTS.md from it")  # fmt: skip
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.before and args.before_python:
        parser.error("--before and --before-python are two ways to time one earlier version: give one")

    measured = results_page.provenance(sources=SECTION.sources)  # as the rounds start: the load average is the start's
    before = before_version(args.before, args.before_python)
    python = sys.executable
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "ANTHROPIC_API_KEY": "sk-ant-benchmark"}
    env.pop("MLFLOW_TRACKING_URI", None)
    common = [f"paths.cache_dir={Path(args.cache_dir).resolve()}"] if args.cache_dir else []
    load = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="mlrb-overhead-") as tmp, FakeLlmServer([]) as server:
        root = Path(tmp)
        env["ANTHROPIC_BASE_URL"] = server.anthropic_url

        def mlrb(kind: str, run: str, interpreter: str, *overrides: str) -> list[str]:
            """A run recording into its kind's store (made by its warm-up run: as a user's ./mlruns,
            the store exists; creating one takes seconds, once)."""
            return [interpreter, "-m", "mlrb", *overrides, f"tracking.dir={root / kind / 'mlruns'}",
                    f"hydra.run.dir={root / kind / run}", *common]  # fmt: skip

        # suffix of the result keys -> the harness's interpreter and environment
        versions = {"": (python, env)}
        if args.before:
            versions[" before"] = (python, {**env, "PYTHONPATH": str(Path(args.before).resolve())})
        if args.before_python:
            versions[" before"] = (args.before_python, env)
        print("warming up (assets built if missing, stores created)...", flush=True)
        kinds = [args.only] if args.only else ["noop", "default"]
        for v, (v_python, v_env) in versions.items():
            server.script.append(reply(tool("submit", summary="nothing to do")))
            if "noop" in kinds:
                measure(mlrb("noop" + v, "warmup", v_python, "agent=claude"), root, v_env)
            if "default" in kinds:
                measure(mlrb("default" + v, "warmup", v_python), root, v_env)
        results: dict[str, list[tuple[float, float, float, dict[str, float]]]] = defaultdict(list)
        stages: dict[str, list[dict[str, float]]] = defaultdict(list)
        for i in range(args.repeats):
            print(f"round {i + 1}/{args.repeats}", flush=True)
            for v, (v_python, v_env) in versions.items() if "noop" in kinds else ():
                if not v:
                    results["floor"].append(measure([python, "-c", CLAUDE_FLOOR], root, env))
                    results["store_floor"].append(measure([python, "-c", STORE_FLOOR], root, env))
                server.script.append(reply(tool("submit", summary="nothing to do")))
                results["noop" + v].append(measure(mlrb("noop" + v, f"run-{i}", v_python, "agent=claude"), root, v_env))
                stages["noop" + v].append(stage_times(root / ("noop" + v) / "mlruns"))
            if "default" in kinds:
                results["hfloor"].append(measure([python, "-c", HARNESS_FLOOR], root, env))
                results["sfloor"].append(measure([python, "-c", SCORER_FLOOR], root, env))
            # Each version goes first every other round, so that neither always follows the floors.
            ordered = list(versions.items())[:: -1 if i % 2 else 1]
            for v, (v_python, v_env) in ordered if "default" in kinds else ():
                results["default" + v].append(measure(mlrb("default" + v, f"run-{i}", v_python), root, v_env))
                stages["default" + v].append(stage_times(root / ("default" + v) / "mlruns"))

    wall = {k: [w for w, _, _, _ in v] for k, v in results.items()}
    peak = {k: [m for _, m, _, _ in v] for k, v in results.items()}
    tree = {k: [t for _, _, t, _ in v] for k, v in results.items()}
    cpu = {k: [c for _, _, _, c in v] for k, v in results.items()}
    print(f"\nPer-run overhead: {args.repeats} rounds, {os.cpu_count()} CPUs, load average {load:.1f} at the start; "
          f"Python {sys.version.split()[0]}")  # fmt: skip
    print(f"  {'':44s} {'wall (median [min-max])':>26s} {'peak memory':>26s} {'tree, summed (sampled)':>26s}")
    rows = [("floor", f"floor: python -c '{CLAUDE_FLOOR}'"),
            ("store_floor", "floor and MLflow's SQL store module")]  # fmt: skip
    rows += [("noop" + v, f"no-op run{v}: agent=claude, submits at once") for v in versions]
    rows += [("hfloor", f"harness floor: python -c '{HARNESS_FLOOR}'"),
             ("sfloor", "scorer floor: python -c 'import torch, transformers, lm_eval...'")]  # fmt: skip
    rows += [("default" + v, f"default run{v}: python -m mlrb (baseline)") for v in versions]
    for key, label in rows:
        if key not in results:
            continue
        print(f"  {label[:44]:44s} {summary(wall[key], 's'):>26s} {summary(peak[key], 'MiB', 0):>26s} "
              f"{summary(tree[key], 'MiB', 0):>26s}")  # fmt: skip

    for v in versions:
        if "noop" in kinds:
            ratios = [n / f for n, f in zip(wall["noop" + v], wall["floor"], strict=True)]
            extra_mib = [n - f for n, f in zip(peak["noop" + v], peak["floor"], strict=True)]
            extra_tree = [n - f for n, f in zip(tree["noop" + v], tree["floor"], strict=True)]
            print(f"  no-op{v} / its floor, per round: {summary(ratios, 'x')} (target <= 1.2 x); "
                  f"peak above the floor's: {summary(extra_mib, 'MiB', 0)} (target <= 50 MiB); "
                  f"its processes summed, above the floor's: {summary(extra_tree, 'MiB', 0)}")  # fmt: skip
            if not v:
                store = [s / f for s, f in zip(wall["store_floor"], wall["floor"], strict=True)]
                store_mib = [s - f for s, f in zip(peak["store_floor"], peak["floor"], strict=True)]
                print(f"  of which the SQL store's module alone, per round: {summary(store, 'x')} the floor, "
                      f"{summary(store_mib, 'MiB', 0)} above its peak")  # fmt: skip
        if "default" not in kinds:
            continue
        beyond = [d - h - s for d, h, s in zip(wall["default" + v], wall["hfloor"], wall["sfloor"], strict=True)]
        print(f"  default run{v} beyond its processes' imports (run - harness floor - scorer floor): "
              f"{summary(beyond, 's')}")  # fmt: skip

    print("\nStages (median seconds; mlrb/core/timeline.py says what each holds; other = wall - their sum):")
    print("  " + f"{'':15s}" + "".join(f"{s:>14s}" for s in STAGES + ("other", "wall")))
    for key in [k + v for k in kinds for v in versions]:
        cells = stage_medians(wall[key], stages[key]).values()
        print("  " + f"{key:15s}" + "".join(f"{c:14.2f}" for c in cells))
    print("\nCPU seconds per process of the run (median; read from /proc every 20 ms; the sandbox's are bwrap, "
          "its exec server and the agent's commands):")  # fmt: skip
    print("  " + f"{'':15s}" + "".join(f"{r:>12s}" for r in CPU_ROLES + ("all",)))
    for key in [k + v for k in kinds for v in versions]:
        cells = cpu_medians(cpu[key]).values()
        print("  " + f"{key:15s}" + "".join(f"{c:12.2f}" for c in cells))
    write_entries(args.out, entries(kinds, list(versions), wall, peak, tree, stages, cpu, args.repeats, measured,
                                    before))  # fmt: skip


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def overhead_section(bench_dir: Path) -> str:
    data = load(bench_dir, "overhead.json")
    parts = [
        "`benchmarks/overhead.py` times two runs beside their import floors, in rounds (floor, run, floor, "
        "run...) so that both see the same load. The no-op run is `agent=claude` against a scripted stand-in "
        "for the Anthropic API on loopback that submits at once; its floor is "
        '`python -c "import hydra, anthropic, mlflow"`. The default run is `python -m mlrb` (llm_merging, the '
        "baseline agent); its floor is the imports of its harness process (`import hydra, mlflow`) plus those "
        "of its scorer process (`import torch, transformers, lm_eval...`), each a process of its own. Assets and "
        "the MLflow store exist before timing starts. `--before DIR` (an earlier checkout's `mlrb` on "
        "PYTHONPATH) or `--before-python PYTHON` (a venv in which an earlier checkout is installed, which the "
        "default run's scorer then runs too; the script's docstring says how) also times the runs of an "
        "earlier version in the same rounds.",
        "Figures are median [min-max] over the rounds; a figure with no range was recorded as its median only. "
        "Peak memory is the `ru_maxrss` that `os.wait4` returns for the run's process: the largest resident set "
        "of any single process of its tree that was waited for, not their sum; processes inside a bwrap sandbox "
        "are not seen (bwrap's own init reaps them). Tree, summed, is the resident sets of every process of the "
        "run added up (the harness, MLflow's recording process, the sandboxes' processes), read from `/proc` "
        "every 20 ms: what the run holds at once. Ratios and differences to the floor are taken per round. "
        "Figures vary by a few tenths of a second between rounds and batches on a 2-core machine: compare "
        "within a batch, as the per-round figures do.",
        "Each run writes its own entry of `benchmarks/overhead.json` (`noop`, `default`), keeping the other's:",
        commands("-m benchmarks.overhead --only noop --repeats 7",
                 "-m benchmarks.overhead --only default --repeats 5 --before-python P   # P: a venv's Python, the earlier commit installed in it"),
    ]  # fmt: skip
    if "noop" in data:
        parts += noop_part(data["noop"])
    if "default" in data:
        parts += default_part(data["default"])
    return "\n\n".join(parts)


MEMORY_HEADER = ["peak memory (one process)", "tree, summed"]


def memory(row: dict) -> list[str]:
    return [spread(row.get("peak_mib"), " MiB", 0), spread(row.get("tree_mib"), " MiB", 0)]


def before_label(entry: dict) -> str:
    before = entry.get("before") or {}
    return f"before ({before['commit']})" if before.get("commit") else "before"


def noop_part(entry: dict) -> list[str]:
    rows, per_round = entry["rows"], entry["per_round"]
    lines = [["floor: `import hydra, anthropic, mlflow`", spread(rows["floor"]["wall_s"], " s"), "",
              *memory(rows["floor"])]]  # fmt: skip
    if rows.get("store_floor"):
        store = per_round["store_floor"]
        lines.append(["floor and the SQL store's module (`mlflow.store.tracking.sqlalchemy_store`)",
                      spread(rows["store_floor"]["wall_s"], " s"),
                      f"{spread(store['ratio'], ' x')}; peak {signed(store['peak_above_floor_mib'], ' MiB')}",
                      *memory(rows["store_floor"])])  # fmt: skip
    for key, label in (("run_before", f"no-op run, {before_label(entry)}"), ("run", "no-op run, now")):
        if not rows.get(key):
            continue
        figures = per_round[key]
        lines.append([label, spread(rows[key]["wall_s"], " s"),
                      f"{spread(figures['ratio'], ' x')} (target <= 1.2 x); peak "
                      f"{signed(figures['peak_above_floor_mib'], ' MiB')} (target <= +50 MiB); summed "
                      f"{signed(figures['tree_above_floor_mib'], ' MiB')}", *memory(rows[key])])  # fmt: skip
    return [
        "### The no-op run",
        f"{entry['repeats']} rounds. {where(entry.get('measured'))}",
        table(["", "wall", "to its floor, per round", *MEMORY_HEADER], lines),
        stages_table(entry),
    ]


def default_part(entry: dict) -> list[str]:
    rows, per_round = entry["rows"], entry["per_round"]
    lines = [
        ["harness floor: `import hydra, mlflow`", spread(rows["harness_floor"]["wall_s"], " s"), "",
         *memory(rows["harness_floor"])],
        ["scorer floor: `import torch, transformers, lm_eval...`", spread(rows["scorer_floor"]["wall_s"], " s"), "",
         *memory(rows["scorer_floor"])],
    ]  # fmt: skip
    for key, label in (("run_before", f"default run, {before_label(entry)}"), ("run", "default run, now")):
        if not rows.get(key):
            continue
        beyond = per_round[key]["beyond_imports_s"]
        text = f"{spread(beyond, ' s')} beyond its imports"
        if key == "run" and per_round.get("run_before"):
            share = beyond["median"] / per_round["run_before"]["beyond_imports_s"]["median"]
            text += f": {100 * share:.0f}% of before (target <= 50%)"
        lines.append([label, spread(rows[key]["wall_s"], " s"), text, *memory(rows[key])])
    return [
        "### The default run",
        f"{entry['repeats']} rounds. {where(entry.get('measured'))}",
        "Beyond its imports: the run's wall time less both floors', per round. The scorer starts with the run "
        "and imports its libraries while the agent works, so a run holds the scorer's process (with torch, "
        "transformers and lm-eval imported) beside the agent's for as long as the agent works: that is most of "
        "the difference between the summed memory and the peak of one process.",
        table(["", "wall", "to its floors, per round", *MEMORY_HEADER], lines),
        stages_table(entry),
    ]  # fmt: skip


def stages_table(entry: dict) -> str:
    """Median seconds of each stage (`stage_time_s.<stage>` metrics), one row per version timed."""
    recorded = entry.get("stages_s")
    if not recorded:
        return "Stage times: not recorded."
    names = list(next(iter(recorded.values())))
    labels = {"run": "now", "run_before": before_label(entry)}
    # one row per stage, one column per version: a table as narrow as the page's column
    rows = [
        [f"`{n}`" if n not in ("other", "wall") else n, *(f"{times[n]:.2f}" for times in recorded.values())]
        for n in names
    ]
    intro = "Stage times, median seconds (`mlrb/core/timeline.py` says what each holds; other: the wall time less their sum):"
    return intro + "\n\n" + table(["stage", *(labels.get(k, k) for k in recorded)], rows) + cpu_table(entry, labels)


def cpu_table(entry: dict, labels: dict[str, str]) -> str:
    """Median CPU seconds of each of the run's processes, by what it is (older entries have none)."""
    recorded = entry.get("cpu_s")
    if not recorded:
        return ""
    names = list(next(iter(recorded.values())))
    rows = [[labels.get(key, key), *(f"{cpu[n]:.2f}" for n in names)] for key, cpu in recorded.items()]
    intro = ("CPU seconds each of the run's processes spent, median (read from `/proc` every 20 ms; sandbox: bwrap, "
             "its exec server and the agent's commands): what a run costs a machine whose cores are all busy.")  # fmt: skip
    return "\n\n" + intro + "\n\n" + table(["", *names], rows)


SECTION = Section(
    "Per-run overhead",
    order=40,
    page="suite",
    reads=("overhead.json",),
    render=overhead_section,
    sources=("mlrb", "requirements.lock"),
)


if __name__ == "__main__":
    main()
