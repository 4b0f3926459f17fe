"""How long the test suite takes, per run and per tier: the figures the next change is compared with.

    .venv/bin/python -m benchmarks.suite_time default [--out benchmarks/suite_time.json]
    .venv/bin/python -m benchmarks.suite_time default-cold [--out benchmarks/suite_time.json]
    .venv/bin/python -m benchmarks.suite_time system [--out benchmarks/suite_time.json]
    .venv/bin/python -m benchmarks.suite_time fast [--out benchmarks/suite_time.json]
    .venv/bin/python -m benchmarks.suite_time ci-cold [--out benchmarks/suite_time.json] [--slower]

Plain `pytest` runs the fast and integration tiers; the system tier runs with `-m system`;
`.ci/run` runs both, one after the other. The kinds:

- `default`: the README's test command, `.venv/bin/python -m pytest`, from the repository's
  root, warm: the tests' asset cache (MLRB_TEST_CACHE, default ~/.cache/mlrb-tests) as an
  earlier run of the same code left it. Target 15 min.
- `default-cold`: the same, with that cache emptied first, as on a machine that never ran
  the tests or after a change to every task's code. Target 30 min.
- `system`: `-m system`, warm. No target of its own: it counts in CI's.
- `fast`: `-m fast`, the edit loop's tier, warm. Target 5 min.
- `ci-cold`: the whole of `.ci/run` as CI runs it. The script clones the repository's
  committed HEAD into a temporary folder (uncommitted changes are not measured; the commit
  is recorded), empties the tests' asset cache, gives uv (which install.sh installs with) a
  new empty package cache, as on a new machine, and runs `bash .ci/run` there, its output
  streamed here. It records the whole run's wall time, its exit status, and both pytest
  runs' figures. Target 75 min. `.ci/run` installs packages and starts services: run it
  where CI would (as root, on a machine it may change).

tests/conftest.py sums each test's setup, call and teardown by tier, in wall time and in CPU
time, and writes them, the session's wall time, the 20 slowest tests and every test's CPU time
to MLRB_SUITE_TIMES (a file; or a folder, one file per -m selection). Where it runs as root with
Debian's acct package, a run of pytest is also counted by kind of process (the tests' own code, warm
forks, the sandboxes' agents and scorers, new interpreters, servers: benchmarks/process_cpu.py), as
`cpu_by_process`. This script records that
under the kind's entry of `--out`, with where it was measured, and prints it against the
targets (on 2 idle cores), with the machine's speed as it ran (`SPEED_PROBE`, a fixed Python
loop's CPU seconds before and after: the same tests' CPU minutes move with it). Services
(Docker, SLURM, PostgreSQL) must be up, as `.ci/run` starts them, or their tests are skipped
and the figures mean less (a skip is recorded). With `--out` benchmarks/suite_time.json,
benchmarks/RESULTS.md is written again.

`--slower` records the figures as a slower machine's, under `slower_machine`, beside this
machine's own entry of the kind (which stays); the results page says how many times that entry's
CPU it took. Every entry records whether its CPU has AVX-512: without it torch's kernels slow
the builds and scorers most.

The entries `cold`, `warm` and `fast` measured before the split, when plain `pytest` ran every
tier in one session, are kept: the first new entry recorded moves them, unchanged, under
`before_split`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.process_cpu import KINDS, ProcessCpu
from benchmarks.results import Section, commands, load, table, where

REPO = Path(__file__).resolve().parents[1]
# Each kind's target in minutes on 2 idle cores; None: none of its own.
TARGETS_MIN: dict[str, int | None] = {"default": 15, "default-cold": 30, "system": None, "fast": 5, "ci-cold": 75}
WHAT_RUNS = {
    "default": "`pytest`, warm",
    "default-cold": "`pytest`, asset cache emptied",
    "system": "`pytest -m system`, warm",
    "fast": "`pytest -m fast`, warm",
    "ci-cold": "`bash .ci/run` in a fresh clone, asset cache emptied",
}
COMMANDS = {"default": [], "default-cold": [], "system": ["-m", "system"], "fast": ["-m", "fast"]}
COLD = {"default-cold", "ci-cold"}  # the kinds that empty the tests' asset cache first
# The CPU minutes the whole of .ci/run may take from an empty cache, so that it fits its 60 minutes
# (of CI's 90) on a 2-core machine 2.7 times slower per test than the one that measured it.
CI_CPU_TARGET_MIN = 30
# Where suite_time.json keeps the kinds measured on a slower machine than the others (`--slower`):
# what the same runs take where each test needs more CPU, beside the figures they are compared with.
SLOWER_MACHINE = "slower_machine"
# The two pytest runs of .ci/run, as the files conftest writes to the MLRB_SUITE_TIMES folder.
CI_RUNS = {"default": "not-system.json", "system": "system.json"}
# The entries measured when plain `pytest` ran every tier in one session, with their targets then.
BEFORE_SPLIT_TARGETS_MIN = {"cold": 25, "warm": 15, "fast": 5}
# What issue 35 says the suite still runs for real however the rest gets cheaper, as test-id
# parts (a test counts in the first group it matches). The suite is CPU-bound, so these tests'
# CPU time over the cores is a floor under the whole suite's time: `floor` adds them up.
KEPT_REAL = {
    "the README's quick start and first command, from a fresh clone": ("tests/test_newcomer.py::",),
    "the documented commands, run as written": ("tests/test_documented_commands.py::",),
    "a wheel in a fresh venv": ("tests/test_packaging.py::",),
    "one real tiny build and run per task": ("::test_baseline_run_is_recorded",
                                             "tests/test_end_to_end.py::test_default_run_is_recorded"),
    "PostgreSQL and an MLflow server": ("tests/test_tracking_server.py::",),
    "Chromium": ("tests/test_mlflow_ui.py::",),
    "Docker": ("tests/test_docker_", "docker]"),
    "SLURM": ("slurm",),
    "full-scale stand-ins": ("tests/test_full_scale.py::",),
}  # fmt: skip


def floor(*entries: dict) -> dict:
    """KEPT_REAL's groups with their tests' CPU seconds in ENTRIES (kinds' figures, their tests
    merged: the warm default and system runs together make the whole suite), in all, and over
    the first entry's machine's cores: a lower bound on the minutes those runs take together
    (Docker's containers, outside the tests' cgroups, are not counted)."""
    left: dict[str, float] = {}
    for entry in entries:
        for test, cpu in entry["tests_cpu_s"].items():
            left[test] = left.get(test, 0.0) + cpu
    groups = {}
    for group, parts in KEPT_REAL.items():
        mine = [test for test in left if any(part in test for part in parts)]
        groups[group] = sum(left.pop(test) for test in mine)
    # a run inside ci-cold's entry has no provenance of its own: the machine measuring it is this one
    cores = entries[0].get("measured", {}).get("machine", {}).get("cpus") or len(os.sched_getaffinity(0))
    cpu_min = sum(groups.values()) / 60
    return {"groups": groups, "cpu_min": cpu_min, "cores": cores, "floor_min": cpu_min / cores}


def split(data: dict) -> tuple[dict, dict]:
    """suite_time.json's DATA as (the kinds measured since the split, the entries from before it:
    `cold`, `warm` and `fast` without a `selection`, wherever they are kept)."""
    now, before = {}, dict(data.get("before_split", {}))
    for key, entry in data.items():
        if key in ("before_split", SLOWER_MACHINE):
            continue
        if key in BEFORE_SPLIT_TARGETS_MIN and "selection" not in entry:
            before[key] = entry
        else:
            now[key] = entry
    return now, before


def record(out: Path, kind: str, figures: dict, slower: bool = False) -> None:
    """Write FIGURES as KIND's entry of OUT, keeping the others (the entries from before the split
    unchanged, under `before_split`: the new `fast` would take the old one's place). SLOWER: as
    KIND's entry of a slower machine (under SLOWER_MACHINE), beside this machine's."""
    data = json.loads(out.read_text()) if out.exists() else {}
    now, before = split(data)
    slower_entries = dict(data.get(SLOWER_MACHINE, {}))
    (slower_entries if slower else now)[kind] = figures
    written = {
        **now,
        **({"before_split": before} if before else {}),
        **({SLOWER_MACHINE: slower_entries} if slower_entries else {}),
    }
    out.write_text(json.dumps(written, indent=2) + "\n")


def test_cache() -> Path:
    """The tests' asset cache, as tests/conftest.py finds it."""
    return Path(os.environ.get("MLRB_TEST_CACHE") or Path.home() / ".cache" / "mlrb-tests")


def cpu_cgroup() -> Path | None:
    """A new cgroup v1 cpuacct folder beside this process's, where the machine has one and lets
    this process make it (root, as in CI); None elsewhere."""
    try:
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if "cpuacct" in line.split(":", 2)[1].split(","))  # fmt: skip
        controller = next(p for p in Path("/sys/fs/cgroup").iterdir() if "cpuacct" in p.name.split(","))
        folder = controller / own.lstrip("/") / f"mlrb-suite-time-{os.getpid()}-{time.monotonic_ns()}"
        folder.mkdir()
        return folder
    except (OSError, StopIteration, IndexError):
        return None


def run_counted(command: list[str], cwd: Path, env: dict) -> tuple[int, float | None]:
    """Run COMMAND; its exit status and the CPU seconds of it and everything it started (its
    cgroup's usage: builds, servers and sandboxes included, Docker's containers not), or None
    where the machine has no cgroup for it."""
    folder = cpu_cgroup()
    if folder is None:
        return subprocess.run(command, cwd=cwd, env=env).returncode, None
    joined = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(folder), *command]
    code = subprocess.run(joined, cwd=cwd, env=env).returncode
    cpu_s = int((folder / "cpuacct.usage").read_text()) / 1e9
    for _ in range(100):  # empty once what the command left (a daemon it started) is gone
        try:
            folder.rmdir()
            break
        except OSError:
            time.sleep(0.1)
    return code, cpu_s


def files_cpu(tests_cpu_s: dict[str, float]) -> dict[str, float]:
    """Each test file's CPU seconds, its tests' summed, the costliest first."""
    files: dict[str, float] = {}
    for test, cpu in tests_cpu_s.items():
        name = test.split("::", 1)[0]
        files[name] = files.get(name, 0.0) + cpu
    return {name: round(cpu, 1) for name, cpu in sorted(files.items(), key=lambda item: -item[1])}


# A fixed piece of pure Python whose CPU time says how fast this machine runs Python code at the
# moment: the suite's CPU minutes move with it (the same tests took 2.7 times the CPU on another
# machine of the same kind, and about as much more on this one on a slower day), so a figure is read
# beside the speed it was measured at. Run in a fresh interpreter, 3 times before and after a run.
SPEED_PROBE = "import time; t = time.process_time(); sum(i * i for i in range(10**7)); print(time.process_time() - t)"


def speed_probe(times: int = 3) -> float:
    """The median CPU seconds of SPEED_PROBE over `times` fresh interpreters."""
    runs = [float(subprocess.run([sys.executable, "-c", SPEED_PROBE], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(times)]  # fmt: skip
    return round(sorted(runs)[len(runs) // 2], 3)


def measure(kind: str) -> dict:
    """Run pytest as `kind` says and return the figures conftest wrote, with each file's CPU and
    the whole run's (its builds ahead and collection included)."""
    with tempfile.TemporaryDirectory(prefix="mlrb-suite-time-") as scratch:
        env = {**os.environ, "MLRB_SUITE_TIMES": str(Path(scratch) / "times.json")}
        if kind in COLD:
            shutil.rmtree(test_cache(), ignore_errors=True)
        command = [str(REPO / ".venv" / "bin" / "python"), "-m", "pytest", *COMMANDS[kind]]
        with ProcessCpu() as accounting:
            code, cpu_s = run_counted(command, REPO, env)
        if accounting.why:
            print(f"CPU by process not counted: {accounting.why}", flush=True)
        times_file = Path(env["MLRB_SUITE_TIMES"])
        if not times_file.exists():
            raise SystemExit(f"pytest exited {code} without writing its times (collection failed?)")
        figures = json.loads(times_file.read_text())
    return {**figures, "files_cpu_s": files_cpu(figures.get("tests_cpu_s", {})), "run_cpu_s": cpu_s,
            "cpu_by_process": accounting.kinds()}  # fmt: skip


# The services .ci/run starts where they are down, and how to ask each whether it answers. Started by
# .ci/run, they run inside its measurement, so what they do for the tests (SLURM's jobs, PostgreSQL's
# backends, the Docker engine's image builds) counts in its CPU; found running, it does not.
SERVICES = {
    "Docker": ["docker", "info"],
    "PostgreSQL": ["pg_isready", "--quiet"],
    "SLURM": ["scontrol", "ping"],
}


def services_up() -> dict[str, bool]:
    """Which of SERVICES answer now."""
    up = {}
    for name, command in SERVICES.items():
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
            up[name] = done.returncode == 0 and "DOWN" not in done.stdout  # scontrol ping: "... is UP" or "DOWN"
        except (OSError, subprocess.TimeoutExpired):
            up[name] = False
    return up


def services_sentence(up: dict[str, bool] | None) -> str:
    """What a ci-cold entry's CPU holds of the services' work, as the page says it."""
    if up is None:
        return " Which services were running as it started was not recorded."
    down = ", ".join(name for name, answered in up.items() if not answered)
    running = ", ".join(name for name, answered in up.items() if answered)
    said = ""
    if down:
        said += f" Down as it started, so started by .ci/run and their work for the tests counted: {down}."
    if running:
        said += f" Running as it started, so their work for the tests not counted: {running}."
    return said


def measure_ci() -> dict:
    """Run `.ci/run` in a fresh clone of the committed HEAD, with the tests' asset cache emptied and
    uv's package cache new, and return its wall time, exit status and the two pytest runs' figures."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    commit = commit.stdout.strip()
    with tempfile.TemporaryDirectory(prefix="mlrb-ci-cold-") as scratch:
        clone, times = Path(scratch) / "mlrb", Path(scratch) / "times"
        times.mkdir()
        print(f"ci-cold: cloning {commit[:7]} (the committed HEAD: uncommitted changes are not measured)", flush=True)
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
        head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.stdout.strip() != commit:  # a detached HEAD here: the clone took the default branch
            subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
        shutil.rmtree(test_cache(), ignore_errors=True)
        # uv's cache new and empty: a new machine's install downloads and unpacks every package
        env = {**os.environ, "MLRB_SUITE_TIMES": str(times), "UV_CACHE_DIR": str(Path(scratch) / "uv-cache")}
        env.pop("VIRTUAL_ENV", None)  # the clone installs and uses its own .venv
        up = services_up()
        started = time.monotonic()
        code, cpu_s = run_counted(["bash", ".ci/run"], clone, env)  # its output goes to this terminal
        ci_s = time.monotonic() - started
        runs = {run: json.loads((times / name).read_text()) if (times / name).exists() else None
                for run, name in CI_RUNS.items()}  # fmt: skip
    if not any(runs.values()):
        raise SystemExit(
            f".ci/run exited {code} after {ci_s / 60:.1f} min without a pytest run writing its times "
            "(it failed before the tests, or the clone's tests/conftest.py does not write to a folder)"
        )
    for figures in runs.values():
        if figures:
            figures["files_cpu_s"] = files_cpu(figures.get("tests_cpu_s", {}))
    sessions = sum(figures["session_s"] for figures in runs.values() if figures)
    return {
        "ci_s": round(ci_s, 1),
        # the CPU of the whole of .ci/run (installs, builds, both pytest runs; not Docker's containers):
        # what moves with the machine's speed, as its wall time on 2 cores does not alone
        "ci_cpu_s": None if cpu_s is None else round(cpu_s, 1),
        "exit_status": code,
        "commit": commit,
        "clone": "a git clone of the committed HEAD: uncommitted changes are not measured",
        # install, services, the sandbox image, lint, type checks and the docs site (and pytest's own start-up)
        "before_tests_s": round(ci_s - sessions, 1),
        "services_up_at_start": up,
        **runs,
    }


def target_text(kind: str) -> str:
    return "no target of its own" if TARGETS_MIN[kind] is None else f"target {TARGETS_MIN[kind]} min"


def print_run(figures: dict, indent: str = "  ") -> None:
    """A pytest run's tiers, as conftest wrote them."""
    if figures.get("build_ahead_s") is not None:
        print(f"{indent}{'builds ahead':12s} {'':10s} {figures['build_ahead_s'] / 60:6.1f} min")
    for tier, entry in figures["tiers"].items():
        print(
            f"{indent}{tier:12s} {entry['tests']:4d} tests {entry['seconds'] / 60:6.1f} min, "
            f"{entry['cpu_s'] / 60:6.1f} CPU min"
        )
    if figures.get("run_cpu_s") is not None:
        print(f"{indent}the whole run (builds ahead and collection included): {figures['run_cpu_s'] / 60:.1f} CPU min")
    if figures.get("tests_cpu_s"):
        kept = floor(figures)
        print(f"{indent}what issue 35 keeps real, in this run: {kept['cpu_min']:.1f} CPU min, "
              f"so no less than {kept['floor_min']:.1f} min on {kept['cores']} cores")  # fmt: skip
        files = figures.get("files_cpu_s") or files_cpu(figures["tests_cpu_s"])
        print(f"{indent}the costliest test files (CPU s): "
              + ", ".join(f"{name.removeprefix('tests/')} {cpu:.0f}" for name, cpu in list(files.items())[:15]))  # fmt: skip
    if figures.get("cpu_by_process"):
        print(f"{indent}its CPU by process (process accounting; benchmarks/process_cpu.py):")
        for kind, counted in figures["cpu_by_process"].items():
            print(f"{indent}  {counted['cpu_s'] / 60:5.1f} CPU min in {counted['processes']:5d} processes: {kind}")


def speed_text(entry: dict) -> str:
    """The machine's speed while the entry was measured (SPEED_PROBE's CPU seconds; lower is faster),
    or "" for an entry measured before the probe was."""
    probe = entry.get("speed_probe_cpu_s")
    if not probe:
        return ""
    return f"a fixed Python loop took {probe['before']:.2f} CPU s before the run and {probe['after']:.2f} after"


def summary(kind: str, figures: dict) -> None:
    if figures.get("speed_probe_cpu_s"):
        print(f"this machine's speed: {speed_text(figures)} (benchmarks/suite_time.py's SPEED_PROBE)")
    if kind != "ci-cold":
        exited = "" if figures["exit_status"] == 0 else f", pytest exited {figures['exit_status']}"
        print(f"{kind}: {figures['session_s'] / 60:.1f} min ({target_text(kind)}{exited})", flush=True)
        print_run(figures)
        return
    status = "" if figures["exit_status"] == 0 else f", .ci/run exited {figures['exit_status']}"
    print(f"ci-cold: {figures['ci_s'] / 60:.1f} min ({target_text(kind)}{status}), commit {figures['commit'][:7]} "
          "(a fresh clone: uncommitted changes are not measured)")  # fmt: skip
    if figures.get("ci_cpu_s") is not None:
        print(f"  its CPU, all of it: {figures['ci_cpu_s'] / 60:.1f} CPU min (target {CI_CPU_TARGET_MIN} on 2 cores)")
    print(f"  before the tests (install, services, lint, docs): {figures['before_tests_s'] / 60:.1f} min")
    for run, name in CI_RUNS.items():
        run_figures = figures.get(run)
        if not run_figures:
            print(f"  {run}: no figures ({name} was not written)")
            continue
        exited = "" if run_figures["exit_status"] == 0 else f", pytest exited {run_figures['exit_status']}"
        print(f"  {run} (-m {run_figures.get('selection')!r}): {run_figures['session_s'] / 60:.1f} min{exited}")
        print_run(run_figures, indent="    ")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("kind", choices=list(TARGETS_MIN), help="default, default-cold, system, fast or ci-cold")
    parser.add_argument("--out", type=Path, default=None, help="record the figures under KIND in this JSON")
    parser.add_argument("--slower", action="store_true",
                        help=f"record them as a slower machine's (under {SLOWER_MACHINE!r}), beside this KIND's own")  # fmt: skip
    args = parser.parse_args()
    measured = results_page.provenance(sources=SECTION.sources)  # as it starts: the load average is the start's
    speed_before = speed_probe()
    figures = {**(measure_ci() if args.kind == "ci-cold" else measure(args.kind)), "measured": measured}
    figures["speed_probe_cpu_s"] = {"before": speed_before, "after": speed_probe(), "code": SPEED_PROBE}
    if args.out:  # recorded first: an hour's measurement must not be lost to a printing error
        record(args.out, args.kind, figures, slower=args.slower)
    summary(args.kind, figures)
    if args.out:
        print(results_page.update(args.out))
    sys.exit(figures["exit_status"])


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def suite_time_section(bench_dir: Path) -> str:
    data = load(bench_dir, "suite_time.json")
    now, before = split(data)
    rows, places = [], []
    for kind, target in TARGETS_MIN.items():
        entry = now.get(kind)
        target_cell = "-" if target is None else f"{target} min"
        if not entry:
            rows.append([kind, WHAT_RUNS[kind], "not measured", "-", target_cell, "-"])
            continue
        session, workers, tiers = cells(kind, entry)
        places.append(f"{kind}: {place(kind, entry)}")
        rows.append([kind, WHAT_RUNS[kind], session, workers, target_cell, tiers])
    return "\n\n".join(
        part
        for part in [
            "How long the tests take, per run and per tier. Plain `pytest` (the README's test command) runs the fast "
            "and integration tiers; `pytest -m system` runs the system tier; `.ci/run` runs both, one after the other. "
            "*default*: plain `pytest`, warm, with the tests' asset cache as an earlier run of the same code left it. "
            "*default-cold*: the same with that cache emptied first. *system*: `-m system`, warm; it has no target "
            "of its own and counts in CI's. *fast*: `-m fast`, warm. *ci-cold*: the whole `.ci/run` in a fresh "
            "clone of the committed HEAD with the asset cache emptied: installs, services, lint, docs and both "
            "pytest runs. Targets are for 2 idle cores. Services (Docker, SLURM, PostgreSQL) are up, as `.ci/run` "
            "starts them.",
            "tests/conftest.py sums each test's setup, call and teardown by its tier marker, in wall time and in CPU "
            "time: its test process's and every process it started, read from a cpuacct cgroup where the machine has "
            "one (else only the processes it waited for; the JSON's `cpu_source` says which), not Docker's "
            "containers. The tests keep every core busy, so the CPU time is what a change saves. A session's time "
            "includes collection and, for a run with the integration or system tier, the tasks' builds ahead of "
            "the tests (tests/build_ahead.py).",
            "Measured with:",
            commands(*(f"-m benchmarks.suite_time {kind} --out benchmarks/suite_time.json" for kind in TARGETS_MIN)),
            "Output: `benchmarks/suite_time.json`." + "".join(f" {place}" for place in places),
            table(
                ["run", "what runs", "time", "tests ran in", "target", "tiers (summed test time, over all processes)"],
                rows,
            ),
            slower_machine_part(data),
            before_split_table(before, BEFORE_SPLIT_TARGETS_MIN),
            costliest_table(now, before),
            process_table(now),
            floor_table(data),
        ]
        if part
    )


def cells(kind: str, entry: dict, targets: bool = True) -> tuple[str, str, str]:
    """A measured entry's cells of the table: its time (and CPU), its test processes, its tiers.
    TARGETS: with the CPU target beside its CPU (this machine's; not another machine's)."""
    if kind != "ci-cold":
        return f"{entry['session_s'] / 60:.1f} min{exited(entry, 'pytest')}", workers_text(entry), tiers_text(entry)
    runs = [(run, entry.get(run)) for run in CI_RUNS]
    tiers = f"before the tests {entry['before_tests_s'] / 60:.1f} min (install, services, lint, docs); " + "; ".join(
        f"{run} {figures['session_s'] / 60:.1f} min{exited(figures, 'pytest')}: {tiers_text(figures)}"
        if figures
        else f"{run}: no figures"
        for run, figures in runs
    )
    workers = next((workers_text(figures) for _, figures in runs if figures), "-")
    session = f"{entry['ci_s'] / 60:.1f} min{exited(entry, '.ci/run')}"
    if entry.get("ci_cpu_s") is not None:
        session += f", {entry['ci_cpu_s'] / 60:.1f} CPU min" + (f" (target {CI_CPU_TARGET_MIN})" if targets else "")
    return session, workers, tiers


def place(kind: str, entry: dict) -> str:
    """Where and how an entry was measured, as the page says it."""
    said = where(entry.get("measured"))  # its machine, with or without AVX-512 where its provenance says
    if "avx512" in entry:  # said beside the provenance, by entries recorded before it held it
        said += " Its CPU has AVX-512." if entry["avx512"] else " Its CPU has no AVX-512."
    if kind == "ci-cold":
        said += (f" It ran a fresh clone of commit {entry['commit'][:7]}: the committed HEAD, so uncommitted "
                 "changes were not measured." + services_sentence(entry.get("services_up_at_start")))  # fmt: skip
    return said + speed_sentence(entry)


def cpu_s(kind: str, entry: dict) -> float | None:
    """An entry's CPU seconds in all: the whole of .ci/run's, or its pytest run's (builds ahead included)."""
    return entry.get("ci_cpu_s") if kind == "ci-cold" else entry.get("run_cpu_s")


def slower_machine_part(data: dict) -> str:
    """The kinds measured on a slower machine (`--slower`), each beside the same kind measured here."""
    entries = data.get(SLOWER_MACHINE) or {}
    if not entries:
        return ""
    now, _ = split(data)
    rows, places = [], []
    for kind, entry in entries.items():
        session, workers, tiers = cells(kind, entry, targets=False)  # the targets are this machine's
        mine, theirs = cpu_s(kind, entry), cpu_s(kind, now.get(kind) or {})
        ratio = f"{mine / theirs:.1f} times" if mine and theirs else "-"
        rows.append([kind, WHAT_RUNS[kind], session, ratio, workers, tiers])
        places.append(f"{kind}, on the slower machine: {place(kind, entry)}")
    return (
        "The same runs on a slower machine, whose tests need more CPU each (its own kernels and clock; the builds' "
        "and scorers' torch most of all), measured with `--slower`: its CPU in all, against the same run's in the "
        "table above. "
        + " ".join(places)
        + "\n\n"
        + table(["run", "what runs", "time", "CPU, against the table above's", "tests ran in", "tiers"], rows)
    )


def speed_sentence(entry: dict) -> str:
    """speed_text as a sentence of the page ("" for an entry without the probe)."""
    text = speed_text(entry)
    return f" Its machine's speed: {text} (`SPEED_PROBE`; the CPU minutes move with it)." if text else ""


def exited(entry: dict, what: str) -> str:
    return "" if entry.get("exit_status") == 0 else f" ({what} exited {entry.get('exit_status')})"


def workers_text(entry: dict) -> str:
    return f"{entry['workers']} processes" if entry.get("workers") else "one process"


def tiers_text(entry: dict) -> str:
    """A pytest run's tiers: tests, summed wall time and CPU time, after its builds ahead."""
    tiers = ", ".join(
        f"{tier} {t['tests']} tests {t['seconds'] / 60:.1f} min"
        + (f" ({t['cpu_s'] / 60:.1f} CPU min)" if "cpu_s" in t else "")  # older entries have none
        for tier, t in entry["tiers"].items()
    )
    if entry.get("build_ahead_s") is not None:  # tests/build_ahead.py, before the tests started
        tiers = f"builds ahead {entry['build_ahead_s'] / 60:.1f} min; {tiers}"
    if entry.get("run_cpu_s") is not None:  # the whole pytest run's cgroup, builds ahead included
        tiers += f"; the whole run {entry['run_cpu_s'] / 60:.1f} CPU min"
    return tiers


def before_split_table(before: dict, targets: dict) -> str:
    """The entries measured when plain `pytest` ran every tier in one session."""
    if not before:
        return ""
    rows = []
    for kind, entry in before.items():
        measured = entry.get("measured") or {}
        rows.append([kind, f"{entry['session_s'] / 60:.1f} min{exited(entry, 'pytest')}",
                     f"{targets[kind]} min" if kind in targets else "-", tiers_text(entry),
                     f"{measured.get('commit') or 'not recorded'}, {measured.get('date') or 'not recorded'}"])  # fmt: skip
    places = " ".join(f"{kind}: {where(entry.get('measured'))}" for kind, entry in before.items())
    return (
        "Before the split (every tier in one pytest run): *cold* and *warm* ran plain `pytest`, which then ran every "
        f"tier, with the asset cache emptied first and as an earlier run left it; *fast* ran `-m fast`, warm. {places}"
        "\n\n" + table(["before the split", "session", "target then", "tiers", "measured"], rows)
    )


def costliest_table(now: dict, before: dict) -> str:
    """The 20 tests that took the most CPU time in the warm runs (default and system together where
    both are measured), else the 20 slowest in wall time; from before the split while nothing since is."""
    measured = [(kind, now[kind]) for kind in ("default", "system", "default-cold", "fast") if now.get(kind)]
    measured += [(f"{kind}, before the split", before[kind]) for kind in ("warm", "cold", "fast") if before.get(kind)]
    with_cpu = [(kind, entry) for kind, entry in measured if entry.get("tests_cpu_s")]
    if with_cpu:
        label, entries = with_cpu[0][0], [with_cpu[0][1]]
        if label == "default" and now.get("system", {}).get("tests_cpu_s"):
            label, entries = "default and system", [now["default"], now["system"]]
        cpu = {test: s for entry in entries for test, s in entry["tests_cpu_s"].items()}
        wall = {test: s for entry in entries for test, s in entry["tests"].items()}
        costliest = sorted(cpu.items(), key=lambda item: -item[1])[:20]
        return table([f"costliest tests ({label})", "CPU time", "wall time"],
                     [[f"`{test}`", f"{s:.0f} s", f"{wall.get(test, 0):.0f} s"] for test, s in costliest])  # fmt: skip
    label, entry = next(((kind, entry) for kind, entry in measured if entry.get("slowest")), (None, None))
    if not entry:
        return ""
    return table([f"slowest tests ({label})", "phase", "time"],
                 [[f"`{r['test']}`", r["when"], f"{r['seconds']:.0f} s"] for r in entry["slowest"]])  # fmt: skip


def process_table(now: dict) -> str:
    """Where the local runs' CPU time went, by kind of process (benchmarks/process_cpu.py), for
    each kind of run that counted it."""
    counted = {kind: entry["cpu_by_process"] for kind, entry in now.items() if entry.get("cpu_by_process")}
    if not counted:
        return ""
    names = [*KINDS, *sorted({name for by in counted.values() for name in by} - set(KINDS))]  # an older entry's too
    rows = [[name] + [f"{by[name]['cpu_s'] / 60:.1f} CPU min ({by[name]['processes']})" if name in by else "-"
                      for by in counted.values()] for name in names]  # fmt: skip
    rows.append(
        ["**in all**"] + [f"**{sum(c['cpu_s'] for c in by.values()) / 60:.1f} CPU min**" for by in counted.values()]
    )
    return (
        "Where that CPU time went, by kind of process, counted by Linux's process accounting as each process "
        "ended (`benchmarks/process_cpu.py`: root and Debian's acct package), with the number of processes. A "
        "warm fork is a process the tests' warm start (tests/warm_start.py), a recording server or a sweep forked "
        "with its imports made; a new interpreter imports everything itself; the sandboxes' agents and scorers "
        "are new interpreters too, which import torch, transformers and lm-eval where their task uses them.\n\n"
        + table(["process", *(f"{kind} run" for kind in counted)], rows)
    )


def floor_table(data: dict) -> str:
    """The checks issue 35 keeps real, with their CPU time in the warm default and system runs (merged:
    together they are the whole suite), or in the warm run from before the split while those are not
    both measured. On a CPU-bound suite, their sum over the cores is a floor under the runs' time
    (KEPT_REAL)."""
    now, before = split(data)
    measured = [now.get(kind) for kind in ("default", "system")]
    if all(entry and entry.get("tests_cpu_s") and entry.get("measured") for entry in measured):
        columns = {"default": [measured[0]], "system": [measured[1]], "together": measured}
        which = "the warm default and system runs above, which together are the whole suite"
    elif (warm := before.get("warm")) and warm.get("tests_cpu_s") and warm.get("measured"):
        columns = {"warm, before the split": [warm]}
        which = "the warm run from before the split, when one pytest run ran every tier"
    else:
        return ""
    kept = {column: floor(*entries) for column, entries in columns.items()}
    rows = [[group] + [f"{kept[column]['groups'][group]:.0f} s" for column in columns] for group in KEPT_REAL]
    rows.append(["**in all**"] + [f"**{k['cpu_min']:.1f} CPU min: no less than {k['floor_min']:.1f} min on "
                                  f"{k['cores']} cores**" for k in kept.values()])  # fmt: skip
    targets = TARGETS_MIN
    return (
        f"What the suite must still run for real (issue 35), with its tests' CPU time in {which} "
        "(`suite_time.KEPT_REAL` says which tests; Docker's containers not counted), against the targets of "
        f"{targets['default']} min for the default run and {targets['ci-cold']} min for the whole of `.ci/run` "
        "from cold:\n\n" + table(["kept real", *(f"CPU time ({column})" for column in columns)], rows)
    )


SECTION = Section(
    "Test suite time", order=70, reads=("suite_time.json",), render=suite_time_section, page="suite",
    sources=("mlrb", "tests", "launchers", "requirements.lock", "pyproject.toml", "install.sh", ".ci/run"),
)  # fmt: skip


if __name__ == "__main__":
    main()
