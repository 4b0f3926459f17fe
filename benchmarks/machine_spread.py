"""How far the CPU's floating-point kernels move a tiny task's anchors, over the machines it has run on.

    .venv/bin/python -m benchmarks.machine_spread --out benchmarks/machine_spread.json [--tasks llm_merging]

An asset build is deterministic on one machine (seeded, one torch thread, deterministic
algorithms: mlrb/task_kit/tiny_models.py), and llm_merging's anchors take no seed, so every run of
the default benchmark scores alike here: its score can differ only between machines, whose CPUs
make torch, MKL and oneDNN pick other kernels. One machine cannot be another, but it can make
those libraries take the kernel paths an older CPU would: this script builds each task's default
tiny assets afresh once per path the machine can run (as the libraries pick it; then capped at
AVX2; then at no vector extension beyond SSE4), each in a process of its own with the libraries'
switches set (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA), and records the
three anchors' scores. The default run's score is its build's baseline score (the baseline
takes no seed). What it cannot show: other hardware's rounding on the same path, other library
builds, another torch version. Torch's thread count is no source of spread: builds and scoring
run on one thread.

Writes, per kind of CPU, task and path, the switches, the path torch reports, the anchors' scores
and the build's seconds (they move with the machine's load); the kinds of CPU measured before are
kept (one is replaced by its new measurement), and each anchor's spread is over every machine's
paths; then the results page.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.calibration import ANCHORS, TASKS, load_task, task_sources
from benchmarks.results import Section, commands, cpu_flags, load, provenance_table, table

# Each kernel path: the libraries' switches that cap it, and the CPU flag it needs.
PATHS = {
    "as picked": ({}, None),
    "AVX2": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "avx2"),
    "SSE4": ({"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
             "sse4_2"),
}  # fmt: skip


def build(key: str, cache_dir: Path) -> dict:
    """In this process (the child): the task's default tiny assets built into CACHE_DIR; its anchors' scores."""
    import time

    import torch

    from mlrb.harness.assets import ensure_assets

    started = time.monotonic()
    assets = ensure_assets(load_task(key), cache_dir)
    measured = json.loads((assets / "hidden" / "calibration.json").read_text())
    return {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "anchors": {anchor: measured.get(f"{anchor}_score") for anchor in ANCHORS},
        "build_s": round(time.monotonic() - started, 1),
    }


def build_on_path(key: str, switches: dict) -> dict:
    """A fresh build of KEY in a process of its own with the libraries' SWITCHES set (they are read at import)."""
    with tempfile.TemporaryDirectory(prefix="mlrb-machine-spread-") as cache:
        done = subprocess.run([sys.executable, "-m", __spec__.name, "--child", key, "--cache-dir", cache],
                              env={**os.environ, **switches}, capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{key}: the build with {switches or 'no switches'} failed:\n{done.stderr[-3000:]}")
    return {"switches": switches, **json.loads(done.stdout.strip().splitlines()[-1])}


def spread(paths: dict) -> dict:
    """Each anchor's scores over the paths, with their range."""
    out = {}
    for anchor in ANCHORS:
        values = [p["anchors"][anchor] for p in paths.values() if p["anchors"][anchor] is not None]
        out[anchor] = {"values": values, "min": min(values), "max": max(values)} if values else {"values": []}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="llm_merging", help="comma-separated task keys (default: llm_merging)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    parser.add_argument("--child", metavar="TASK", help=argparse.SUPPRESS)  # one build, in its own process
    parser.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(build(args.child, args.cache_dir)))
        return
    keys = [k.strip() for k in args.tasks.split(",") if k.strip()]
    unknown = [k for k in keys if k not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]!r}; valid: {', '.join(TASKS)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    sources = sorted({path for key in keys for path in task_sources(key)})
    measured = results_page.provenance(sources=sources)  # as it starts: the load average is the start's
    flags = cpu_flags()
    tasks = {}
    for key in keys:
        paths = {}
        for name, (switches, flag) in PATHS.items():
            if flag is not None and flag not in flags:
                print(f"{key} {name}: skipped, this CPU lacks {flag}", flush=True)
                continue
            paths[name] = build_on_path(key, switches)
            print(f"{key} {name}: {paths[name]}", flush=True)
        tasks[key] = {"paths": paths, "spread": spread(paths)}
    here = {"cpu": measured["machine"]["cpu"], "measured": measured, "tasks": tasks}
    machines = [here]
    if args.out and args.out.exists():  # the other kinds of CPU measured before: kept, this one's replaced
        machines += [m for m in machines_of(json.loads(args.out.read_text())) if m["cpu"] != here["cpu"]]
    figures = {"tasks": overall(machines), "machines": machines, "measured": measured}
    print(json.dumps({key: task["spread"] for key, task in figures["tasks"].items()}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"written to {results_page.update(args.out)}", file=sys.stderr)


def machines_of(data: dict) -> list[dict]:
    """The machines a file measured (one file written before it kept several: its one machine)."""
    if "machines" in data:
        return data["machines"]
    return [{"cpu": data["measured"]["machine"]["cpu"], "measured": data["measured"], "tasks": data["tasks"]}]


def overall(machines: list[dict]) -> dict:
    """Per task, each anchor's scores over every machine's kernel paths (`spread`)."""
    keys = sorted({key for machine in machines for key in machine["tasks"]})
    return {key: {"spread": spread({f"{m['cpu']} {name}": path for m in machines
                                    for name, path in m["tasks"].get(key, {}).get("paths", {}).items()})}
            for key in keys}  # fmt: skip


def baseline_range(data: dict, key: str = "llm_merging") -> tuple[float, float]:
    """The default run's score over the kernel paths: its task's baseline, lowest and highest."""
    baseline = data["tasks"][key]["spread"]["baseline"]
    return baseline["min"], baseline["max"]


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def machine_spread_section(bench_dir: Path) -> str:
    data = load(bench_dir, "machine_spread.json")
    rows = []
    for machine in machines_of(data):
        for key, task in machine["tasks"].items():
            for name, path in task["paths"].items():
                scores = [("invalid" if path["anchors"][a] is None else f"{path['anchors'][a]:.4f}") for a in ANCHORS]
                rows.append([machine["cpu"], key, name, f"`{path['capability']}`", *scores])
    measured = [(f"`machine_spread.json`: {m['cpu']}", m.get("measured")) for m in machines_of(data)]
    return "\n\n".join([
        "Every run of one solution scores alike on one machine when its anchors take no seed (llm_merging's "
        "do not), so the default run's score can move only between machines: another CPU makes torch, MKL and "
        "oneDNN pick other kernels, whose sums round differently. `benchmarks/machine_spread.py` builds the "
        "task's assets afresh once per kernel path this machine can run: as the libraries pick it, then capped "
        "at AVX2, then at SSE4 (the libraries' switches `ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS`, "
        "`ONEDNN_MAX_CPU_ISA`), and scores the three anchors on each. The default run's score is the baseline's. "
        "Each kind of CPU it has run on keeps its rows; run on another kind, it adds that one's. This is what "
        "these machines can show; other hardware, other library builds and other torch versions can move a score "
        "further.",
        commands("-m benchmarks.machine_spread --out benchmarks/machine_spread.json"),
        "Output: `benchmarks/machine_spread.json`.",
        table(["CPU", "task", "kernel path", "torch reports", *ANCHORS], rows),
        provenance_table(measured),
    ])  # fmt: skip


SECTION = Section(
    "How far the CPU's kernels move a score",
    order=20,
    reads=("machine_spread.json",),
    render=machine_spread_section,
    sources=task_sources("llm_merging"),
)


if __name__ == "__main__":
    main()
