"""Seed noise of the tiny tasks' anchors: is each task's scale worth reading?

    .venv/bin/python -m benchmarks.calibration --seeds 5 --out benchmarks/calibration.json [--tasks a,b]
    .venv/bin/python -m benchmarks.calibration --vary assets --seeds 5 --out benchmarks/calibration_assets.json
    .venv/bin/python -m benchmarks.calibration --carry --out benchmarks/calibration.json [--tasks a,b]
    .venv/bin/python -m benchmarks.calibration --another-machine --seeds 5 --out benchmarks/calibration.json --tasks a,b

Three anchors per task, scored exactly as a run's normalisation scores them
(`hidden/calibration.json`):

- do_nothing: the starting point submitted unchanged (the untouched base, an untrained
  model), or "invalid" where the rules reject it;
- baseline: the starter as given (0 on the normalised scale);
- reference: the strong known solution (100).

`--vary runs` (the default): the task's assets as everyone builds them (its YAML's
`assets.seed`), and each anchor run with the seeds s = 0..N-1 that a sweep's runs get
(`-m seed=0,1,...`: $MLRB_SEED, which the anchors' commands pass on as --seed). This is
the noise a user sees between runs of one solution. Seeds 0..anchor_seeds-1 are the asset
build's own measurements (the anchors are their means); an anchor that takes no seed (a copy of the base, llm_merging's averaging)
gives the same score every run: measured once, SEM 0, marked deterministic.

`--vary assets`: the assets built with `assets.seed = s` (data, models, and the anchors'
runs on them all change with it): the spread between draws of a task's synthetic world,
which no user sees between runs but which says whether the shipped draw is typical.

Writes, per task and anchor, `mean`, `sem` (standard error of the mean over seeds),
`n` (valid seeds) and the values, the task's number of scored items, and the checks
issue 16 asks of every task (do_nothing below the baseline by 3 combined SEM or
invalid; reference above the baseline by max(10% of it, 5 combined SEM); one scored
item worth at most 2 normalised points; baseline SEM at most 5 normalised points).
Prints the same as a table. `--carry` keeps the figures in `--out` for code that moved without
changing what it computes (a module renamed, a class split): each task is built as a user's build
is, taking the recorded calibration when seed 0 of each anchor scores as recorded, and where every
anchor does, its entry records the check, with the code's digests, under "carried"; a task that
scores otherwise, or whose assets' settings changed, keeps its entry and is named, to be measured
again. Figures depend on the machine's floating-point kernels, so compare only runs on one kind
of machine. `--another-machine` measures as the default does on another kind of machine, and keeps
it beside the task's entry (under "other_machines", one per kind of CPU: its name and whether it
has AVX-512): a tiny build there takes it, as it takes the main one here, when its seed 0 scores
alike; the tables stay the main machine's. There, `--carry` checks and marks the record a build
takes: that machine's where seed 0 scores as it. Each task's entry also records where and how it
was measured ("measured"); then benchmarks/RESULTS.md is written again when `--out` is one of its
files (benchmarks/calibration.json or calibration_assets.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.results import Section, commands, load, provenance_table
from mlrb.analysis.stats import sd as sample_sd  # the one sample SD

REPO = Path(__file__).resolve().parents[1]
TASKS = ["llm_merging", "llm_efficiency", "edge_llm_compression", "math_reasoning", "baby_lm", "mini_pile",
         "edge_llm_training"]  # fmt: skip
ANCHORS = ("do_nothing", "baseline", "reference")
# What every task's anchors depend on beside its own folder (`task_sources`): the shared task code,
# the scorers, the asset cache and the libraries' versions.
SHARED_SOURCES = ("mlrb/tasks/anchors.py", "mlrb/tasks/base.py", "mlrb/tasks/handling.py", "mlrb/tasks/builder.py",
                  "mlrb/task_kit/hub.py",
                  "mlrb/tasks/judge.py", "mlrb/tasks/solutions.py", "mlrb/task_kit/tiny_models.py",
                  "mlrb/task_kit/warm_python.py", "mlrb/scoring", "mlrb/harness/assets.py", "requirements.lock")  # fmt: skip


def task_sources(key: str) -> tuple[str, ...]:
    """The sources a task's anchors depend on: its folder, the task folders its code imports
    (mlrb.tasks.NAME), and SHARED_SOURCES."""
    import re

    tasks = REPO / "mlrb" / "tasks"
    imported = {
        name
        for path in (tasks / key).rglob("*.py")
        for name in re.findall(r"mlrb\.tasks\.(\w+)", path.read_text())
        if (tasks / name).is_dir() and name != key
    }
    return (f"mlrb/tasks/{key}", *(f"mlrb/tasks/{name}" for name in sorted(imported)), *SHARED_SOURCES)


def load_task(key: str, seed: int | None = None, overrides: dict | None = None):
    """The packaged task at tiny scale, with assets.seed = seed (None: its YAML's) and
    `overrides` ({"assets.num_layers": 3, ...}) set in its tiny scale: a trial design."""
    from mlrb.core import registry
    from mlrb.core.config import TaskConfig, packaged_task

    raw = packaged_task(key)
    raw["scale"] = "tiny"
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        place = raw["scales"]["tiny"]
        for name in parents:
            place = place.get(name) if isinstance(place, dict) else None
        if not isinstance(place, dict) or leaf not in place:  # a typo would otherwise add a key nobody reads
            raise ValueError(f"{key}: task.scales.tiny has no key {dotted!r}")
        place[leaf] = value
    if seed is not None:
        raw["scales"]["tiny"]["assets"]["seed"] = seed
    return registry.load_task(TaskConfig(**raw))


def parse_overrides(pairs: list[str]) -> dict:
    """["assets.num_layers=3", ...] -> {"assets.num_layers": 3}; values are read as the task's
    YAML file is (OmegaConf's loader: 3e-3 is a number, where plain YAML keeps it a string)."""
    from omegaconf import OmegaConf

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE, e.g. assets.num_layers=3")
        try:
            parsed = OmegaConf.to_container(OmegaConf.create(f"value: {value}"))
        except Exception as exc:  # a YAML syntax error
            raise ValueError(f"--set {pair!r}: the value is not YAML: {str(exc).splitlines()[0]}") from None
        overrides[key.strip()] = parsed["value"]  # type: ignore[index]
    return overrides


def scored_items(assets: Path) -> int:
    """Rows the score averages over: the held-out test set, or every sub-task's rows."""
    hidden = assets / "hidden"
    files = [hidden / "test.jsonl"] if (hidden / "test.jsonl").exists() else sorted((hidden / "suite").glob("*.jsonl"))
    return sum(1 for path in files for line in path.read_text().splitlines() if line.strip())


def mean_sem(values: list) -> dict:
    n = len(values)
    if n == 0:
        return {"mean": None, "sem": None, "n": 0}
    mean = sum(values) / n
    if n == 1:  # one seed says nothing about seed noise
        return {"mean": mean, "sem": None, "n": 1}
    sd = sample_sd(values)
    return {"mean": mean, "sem": sd / math.sqrt(n), "sd": sd, "n": n}


def checks(anchors: dict, items: int, score_unit: float) -> dict:
    """Issue 16's bars for a tiny task, from the anchors' mean and SEM (None: a bar that needs
    the SEM, with a single seed)."""
    base, ref, nothing = anchors["baseline"], anchors["reference"], anchors["do_nothing"]
    if base["n"] == 0 or ref["n"] == 0:
        return {}
    gap = ref["mean"] - base["mean"]
    noise = base["sem"] is not None and ref["sem"] is not None
    out = {
        "reference_beats_baseline": gap > max(0.1 * abs(base["mean"]), 5 * math.hypot(ref["sem"], base["sem"]))
        if noise
        else None,
        "item_worth_normalised_points": 100 * score_unit / items / gap if gap > 0 else None,
        "baseline_sem_normalised_points": 100 * base["sem"] / gap if gap > 0 and noise else None,
    }
    if nothing["n"] == 0:
        out["do_nothing_below_baseline"] = "invalid"
    elif nothing["sem"] is None or base["sem"] is None:
        out["do_nothing_below_baseline"] = None
    else:
        combined = math.hypot(nothing["sem"], base["sem"])
        out["do_nothing_below_baseline"] = nothing["mean"] < base["mean"] - 3 * combined
    worth, sem = out["item_worth_normalised_points"], out["baseline_sem_normalised_points"]
    out["item_worth_at_most_2"] = worth is not None and worth <= 2
    out["baseline_sem_at_most_5"] = None if sem is None else sem <= 5
    return out


def calibrate_over_runs(key: str, seeds: int, cache_dir: Path, overrides: dict | None = None) -> dict:
    """The shipped assets, built with every anchor measured at seeds 0..seeds-1 (side by side, one
    per core, each on one thread, as any asset build), never taken from the calibration mlrb ships.
    What the build wrote (hidden/calibration.json) and its asset key are kept under `built`: a later
    build of the same assets takes it once its own seed 0 scores alike (mlrb/tasks/anchors.py)."""
    import dataclasses

    from mlrb.harness.assets import prepare
    from mlrb.tasks.anchors import record_key
    from mlrb.tasks.handling import asset_key

    task = load_task(key, None, overrides)
    task = dataclasses.replace(task, anchors=dataclasses.replace(task.anchors, seeds=seeds, use_shipped=False))
    started = time.monotonic()
    assets, _ = prepare(task, cache_dir)
    build_s = json.loads((assets / "manifest.json").read_text()).get("build_seconds")
    measured = json.loads((assets / "hidden" / "calibration.json").read_text())
    commands = task.anchors.commands
    anchors = {}
    for anchor in ANCHORS:
        values = measured.get(f"{anchor}_seeds")
        if not values:  # invalid, or not measured (stated, or its own measurement: llm_merging's)
            first = measured.get(f"{anchor}_score")
            anchors[anchor] = {**mean_sem([]), "values": []} if first is None else one_value(first)
            if measured.get(f"{anchor}_invalid"):
                anchors[anchor].update(invalid=1, invalid_reason=measured[f"{anchor}_invalid"])
        elif "MLRB_SEED" not in commands.get(anchor, ""):  # no seed reaches it: every run scores the same
            anchors[anchor] = one_value(values[0])
        else:
            anchors[anchor] = {**mean_sem(values), "values": values}
        print(f"  {key} {anchor}: {anchors[anchor]['values'] or 'invalid'}", flush=True)
    print(f"  {key}: {time.monotonic() - started:.0f} s", flush=True)
    result = task_result(key, "runs", scored_items(assets), seeds, [build_s], anchors, overrides,
                         assets_seed=task.spec.assets.get("seed"))  # fmt: skip
    # A trial design's build is no calibration of the shipped assets, and a task that measures its
    # anchors its own way (llm_merging's merges: no seed reaches them) measures them whole.
    if not overrides and not task.anchors.measured_by:
        result["built"] = {"key": record_key(asset_key(task)), "calibration": measured}
    return result


def carry_over_runs(key: str, entry: dict, cache_dir: Path) -> tuple[str | None, dict | None]:
    """Whether the task's recorded calibration holds for the code as it is now: why not, or the
    measurement that holds (the entry itself, or one of its other machines' records, as a build on
    this machine takes it). It holds where its assets' settings are those it was measured on (the key
    a build matches it by, which leaves out the code's digest), and seed 0 of each anchor, built as
    any build is, scores to the last bit as recorded."""
    from mlrb.harness.assets import prepare
    from mlrb.tasks.anchors import record_key
    from mlrb.tasks.handling import asset_key

    task = load_task(key)
    if "built" in entry and entry["built"]["key"] != record_key(asset_key(task)):  # (record_key drops "shipped")
        return "its assets' settings changed since it was measured", None
    assets, _ = prepare(task, cache_dir)
    measured = json.loads((assets / "hidden" / "calibration.json").read_text())
    held = held_by(entry, measured)
    if held is not None:
        return None, held
    differ = [anchor for anchor in ANCHORS if seed_zero(measured, anchor) != recorded_seed_zero(entry, anchor)]
    elsewhere = " (nor as another machine's record)" if entry.get("other_machines") else ""
    return f"seed 0 of {', '.join(differ)} scores otherwise{elsewhere}", None


def held_by(entry: dict, measured: dict) -> dict | None:
    """The measurement whose seed 0 of each anchor a build's hidden/calibration.json scores to the
    last bit: the entry itself, else the first of its other machines' records (of the entry's assets)
    that it does; None where none does."""
    built = {anchor: seed_zero(measured, anchor) for anchor in ANCHORS}
    if built == {anchor: recorded_seed_zero(entry, anchor) for anchor in ANCHORS}:
        return entry
    for record in entry.get("other_machines", []):
        if record["built"]["key"] != entry.get("built", {}).get("key"):
            continue
        if built == {anchor: seed_zero(record["built"]["calibration"], anchor) for anchor in ANCHORS}:
            return record
    return None


def seed_zero(measured: dict, anchor: str) -> float | str | None:
    """An anchor's seed-0 score in a build's hidden/calibration.json (its reason where invalid)."""
    if measured.get(f"{anchor}_invalid"):
        return measured[f"{anchor}_invalid"]
    seeds = measured.get(f"{anchor}_seeds")
    return seeds[0] if seeds else measured.get(f"{anchor}_score")


def recorded_seed_zero(entry: dict, anchor: str) -> float | str | None:
    """The same, as the benchmark's entry records it."""
    recorded = entry["anchors"][anchor]
    if recorded.get("invalid"):
        return recorded["invalid_reason"]
    return recorded["values"][0] if recorded["values"] else None


def with_other_machines_kept(entry: dict, measurement: dict) -> dict:
    """A new measurement of the task on the main machine, keeping the entry's other machines'
    records: a build checks them at seed 0 before it takes one, and their assets' key must match."""
    kept = entry.get("other_machines")
    return {**measurement, **({"other_machines": kept} if kept else {})}


def with_other_machine(entry: dict, measurement: dict) -> dict | None:
    """The task's entry with `measurement` (the default measurement, made on another kind of
    machine) kept under "other_machines" in place of that CPU's earlier one; None where its seed 0
    scores as the entry's own, which a build there takes already."""
    if held_by(entry, measurement["built"]["calibration"]) is entry:
        return None
    record = {"built": measurement["built"], "measured": measurement["measured"]}  # its machine's AVX-512 in it
    others = [other for other in entry.get("other_machines", []) if machine_of(other) != machine_of(record)]
    return {**entry, "other_machines": [*others, record]}


def machine_of(record: dict) -> tuple:
    """Which kind of machine an other machine's record is from: its CPU's name, and whether it has AVX-512."""
    return record["measured"]["machine"]["cpu"], results_page.avx512_of(record)


def machine_name(record: dict) -> str:
    """An other machine's record's kind of machine, as a message names it: "AMD EPYC, without AVX-512"."""
    cpu, avx512 = machine_of(record)
    return ", ".join(filter(None, [cpu, results_page.avx512_text({"avx512": avx512})]))


def one_value(score: float) -> dict:
    """An anchor every run scores alike (on one machine): measured once, SEM 0."""
    return {"mean": score, "sem": 0.0, "n": 1, "values": [score], "deterministic": True}


def calibrate_over_assets(key: str, seeds: int, cache_dir: Path, overrides: dict | None = None) -> dict:
    from mlrb.harness.assets import ensure_assets

    values = {anchor: [] for anchor in ANCHORS}
    invalid, items, build_s = [], None, []
    for seed in range(seeds):
        task = load_task(key, seed, overrides)
        started = time.monotonic()
        assets = ensure_assets(task, cache_dir)
        build_s.append(json.loads((assets / "manifest.json").read_text()).get("build_seconds"))
        measured = json.loads((assets / "hidden" / "calibration.json").read_text())
        items = scored_items(assets)
        for anchor in ANCHORS:
            if measured.get(f"{anchor}_score") is not None:
                values[anchor].append(measured[f"{anchor}_score"])
        if measured.get("do_nothing_invalid"):
            invalid.append(measured["do_nothing_invalid"])
        print(f"  {key} seed {seed}: " + ", ".join(f"{a} {measured.get(f'{a}_score', 'invalid')}" for a in ANCHORS)
              + f" ({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    anchors = {anchor: {**mean_sem(v), "values": v} for anchor, v in values.items()}
    if invalid:
        anchors["do_nothing"]["invalid"] = len(invalid)
        anchors["do_nothing"]["invalid_reason"] = invalid[0]
    return task_result(key, "assets", items, seeds, build_s, anchors, overrides)


def task_result(key: str, vary: str, items: int, seeds: int, build_s: list, anchors: dict, overrides: dict | None,
                **extra) -> dict:  # fmt: skip
    """One task's entry in the output: its anchors, the checks on them, and how they were measured."""
    score_unit = 100.0 if key == "math_reasoning" else 1.0  # BLEU is 0-100, accuracies 0-1
    return {"vary": vary, **extra, "items": items, "seeds": list(range(seeds)), "build_seconds": build_s,
            "anchors": anchors, "checks": checks(anchors, items, score_unit),
            **({"overrides": overrides} if overrides else {})}  # fmt: skip


def fmt(anchor: dict, paths: list | None = None) -> str:
    """An anchor's mean with its noise: over seeds, SEM and the per-run SD; for one that every run
    on a machine scores alike, its spread over the kernel paths one machine can run
    (`paths`: its values there, benchmarks/machine_spread.py), never a SEM of 0."""
    if anchor["n"] == 0:
        return "invalid"
    if anchor.get("deterministic"):
        if not paths or len(paths) < 2:
            return f"{anchor['mean']:.4f} (every run alike here; across kernel paths not measured)"
        if min(paths) == max(paths):
            return f"{anchor['mean']:.4f} (every run alike here; the same on {len(paths)} kernel paths)"
        return (f"{anchor['mean']:.4f} (every run alike here; over {len(paths)} kernel paths "
                f"{min(paths):.4f}-{max(paths):.4f}, SD {sample_sd(paths):.4f})")  # fmt: skip
    if anchor["n"] == 1:
        return f"{anchor['mean']:.4f} (one seed)"
    sd = anchor.get("sd", sample_sd([v for v in anchor["values"] if v is not None]))
    return f"{anchor['mean']:.4f} ± {anchor['sem']:.4f} (SD {sd:.4f})"


def table(results: dict, machines: dict | None = None) -> str:
    """Each task's anchors (mean ± SEM over seeds, with the per-run SD). `machines`: for anchors that
    every run scores alike, {task: {anchor: {"values": [their scores over kernel paths]}}}."""
    machines = machines or {}
    # Six columns, so the table fits the page's column: the items and seeds sit under the task's name, the
    # two noise figures share one cell.
    lines = ["| task | do_nothing | baseline | reference | one item (norm. pts) | baseline SEM (norm. pts) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for key, r in results.items():
        a, c = r["anchors"], r["checks"]
        seen = machines.get(key, {})
        worth = c.get("item_worth_normalised_points")
        cells = [
            fmt(a[anchor], seen.get(anchor, {}).get("values")) for anchor in ("do_nothing", "baseline", "reference")
        ]
        lines.append(
            f"| {key} ({r['items']} items, n={a['baseline']['n']}) | {' | '.join(cells)} | "
            f"{'-' if worth is None else f'{worth:.1f}'} | {baseline_noise(r, seen)} |"
        )  # fmt: skip
    return "\n".join(lines)


def baseline_noise(result: dict, seen: dict) -> str:
    """The baseline's SEM in normalised points; for one that every run scores alike, the SD of its
    values over kernel paths (in the same points) where measured, not a SEM of 0."""
    sem = result["checks"].get("baseline_sem_normalised_points")
    base, ref = result["anchors"]["baseline"], result["anchors"]["reference"]
    if not base.get("deterministic"):
        return "-" if sem is None else f"{sem:.1f}"
    machines = seen.get("baseline", {}).get("values") or []
    if len(machines) < 2 or base["n"] == 0 or ref["n"] == 0 or ref["mean"] == base["mean"]:
        return "- (one kernel path)"
    return f"{100 * sample_sd(machines) / abs(ref['mean'] - base['mean']):.1f} (SD over kernel paths)"


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per task (0..N-1)")
    parser.add_argument("--vary", choices=["runs", "assets"], default="runs",
                        help="runs: the anchors' run seed ($MLRB_SEED) on the shipped assets (what a user sees); "
                             "assets: assets.seed, a new draw of the task's data and models per seed")  # fmt: skip
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task keys (default: all seven)")
    parser.add_argument("--out", type=Path, default=Path("calibration.json"))
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("MLRB_CACHE_DIR", "~/.cache/mlrb")))
    parser.add_argument("--carry", action="store_true",
                        help="keep --out's figures for code that moved without changing what it computes: "
                             "each task built once, seed 0 of each anchor checked against them")  # fmt: skip
    parser.add_argument("--another-machine", action="store_true",
                        help="measure on another kind of machine than the entries' and keep it beside them, "
                             "for builds on such machines to take")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="try a design: change a value of each task's tiny scale (e.g. assets.num_layers=3, "
                             "baseline_command='python ...'); the output records what was set")  # fmt: skip
    args = parser.parse_args()
    keys = [k.strip() for k in args.tasks.split(",") if k.strip()]
    unknown = [k for k in keys if k not in TASKS]
    if unknown or args.seeds < 1:
        parser.error(f"unknown task {unknown[0]!r}; valid: {', '.join(TASKS)}" if unknown else "--seeds must be >= 1")
    from mlrb.core.config import ConfigError

    try:  # every task takes every value, as a run's config check has it, before anything is built
        overrides = parse_overrides(args.set)
        for key in keys:
            task = load_task(key, 0, overrides)
            task.builder.check_params(task.scale)
    except (ValueError, ConfigError) as exc:  # pydantic's ValidationError is a ValueError
        parser.error(f"{key}: {exc}" if isinstance(exc, ConfigError) else str(exc))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    measured = results_page.provenance(sources=SECTION.sources)  # as it starts: the load average is the start's
    sources = {key: results_page.digests(task_sources(key)) for key in keys}  # the code as it starts, too
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    if args.another_machine:
        refuse_another_machine(args, keys, results)
    if args.carry:
        carry(args, keys, results, measured, sources)
        return
    calibrate = calibrate_over_runs if args.vary == "runs" else calibrate_over_assets
    for key in keys:  # each task is written as soon as it is done, so a long run can be resumed
        result = calibrate(key, args.seeds, args.cache_dir.expanduser(), overrides)
        measurement = {**result, "measured": {**measured, "sources": sources[key]}}
        if not args.another_machine:
            entry = with_other_machines_kept(results.get(key, {}), measurement)
        elif (entry := with_other_machine(results[key], measurement)) is None:
            print(f"  {key}: seed 0 of each anchor scores as the entry's own here; nothing to add", flush=True)
            continue
        results[key] = entry
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table({k: results[k] for k in keys}))
    print(f"written to {results_page.update(args.out)}", file=sys.stderr)


def refuse_another_machine(args: argparse.Namespace, keys: list[str], results: dict) -> None:
    """`--another-machine` records the default measurement of tasks the file measured already."""
    if args.vary != "runs" or args.set:
        sys.exit("--another-machine records the runs' calibration of the shipped assets: give neither --vary "
                 "assets nor --set")  # fmt: skip
    if args.carry:
        sys.exit("--another-machine measures; --carry checks what is measured: give one of them")
    unseeded = [key for key in keys if key in results and "built" not in results[key]]
    if unseeded:  # llm_merging: its anchors merge the adapters the same way on every run
        sys.exit(f"--another-machine: {', '.join(unseeded)} ships no seeds for a build to take: leave it out")
    missing = [key for key in keys if key not in results]
    if missing:
        sys.exit(f"--another-machine: {args.out} has no entry for {', '.join(missing)}: "
                 "measure it first on the main machine (--seeds 5, without --another-machine)")  # fmt: skip


def carry(args: argparse.Namespace, keys: list[str], results: dict, measured: dict, sources: dict) -> None:
    """`--carry`: each task's entry in --out checked on the code as it is now, and kept where it holds."""
    if args.vary != "runs" or args.set:
        sys.exit("--carry keeps the runs' calibration of the shipped assets: give neither --vary assets nor --set")
    missing = [key for key in keys if key not in results]
    if missing:
        sys.exit(f"--carry: {args.out} has no entry for {', '.join(missing)}: measure it with --seeds 5")
    stale = []
    for key in keys:
        why, held = carry_over_runs(key, results[key], args.cache_dir.expanduser())
        if held is None:
            print(f"  {key}: {why}: measure it again (--seeds 5; on another kind of machine, --another-machine)",
                  flush=True)  # fmt: skip
            stale.append(key)
            continue
        whose = "as recorded" if held is results[key] else f"as the record of {machine_name(held)}"
        print(f"  {key}: seed 0 of each anchor scores {whose}; carried", flush=True)
        checked = "seed 0 of each anchor, built by this code, scores to the last bit as measured"
        held["carried"] = {**measured, "sources": sources[key], "checked": checked}
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {results_page.update(args.out)}", file=sys.stderr)
    if stale:
        sys.exit(f"not carried (measure again): {', '.join(stale)}")


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def calibration_section(bench_dir: Path) -> str:
    runs, assets = load(bench_dir, "calibration.json"), load(bench_dir, "calibration_assets.json")
    machines = {key: task["spread"] for key, task in load(bench_dir, "machine_spread.json")["tasks"].items()}
    return "\n\n".join([
        "A tiny task is worth running only if its numbers separate a good solution from a bad one by far more "
        "than seed noise. `benchmarks/calibration.py` scores each task's three anchors as a run's normalisation "
        "does: `do_nothing` (the starting point submitted unchanged, or \"invalid\" where the rules reject it), "
        "`baseline` (the starter as given: 0 on the normalised scale) and `reference` (100), each with seeds 0 to "
        "N-1. It records per task and anchor the mean, the SEM over seeds, the per-run SD and n, the number of "
        "scored items, and "
        "the checks: `do_nothing` below the baseline by 3 combined SEM (or invalid), the reference above the "
        "baseline by max(10%, 5 combined SEM), one scored item worth at most 2 normalised points, the baseline's "
        "SEM at most 5 normalised points.",
        "Builds are deterministic (seeded, one torch thread, deterministic algorithms), so two builds on one "
        "machine give byte-identical assets; another CPU's floating-point kernels can give other numbers, so "
        "compare figures only from one kind of machine.",
        commands("-m benchmarks.calibration --seeds 5 --out benchmarks/calibration.json",
                 "-m benchmarks.calibration --vary assets --seeds 5 --out benchmarks/calibration_assets.json"),
        "### Seeds of the runs, on the shipped assets",
        "`--vary runs` (the default): the task's assets as every user builds them (its YAML's `assets.seed`), and "
        "each anchor run with the seed a sweep's run gets (`-m seed=0,1,2,3,4`): `$MLRB_SEED`, which the anchors' "
        "commands pass on as `--seed`. That is the noise a user sees between runs of one solution, and the bars "
        "are checked on it. Seed 0 is the asset build's own measurement, the one runs are normalised with. An "
        "anchor that no seed reaches scores alike on every run on one machine and is measured once; its noise "
        "is between machines: where it was measured, the table gives its range over the kernel paths one "
        "machine can run (the section \"How far the CPU's kernels move a score\" below), and the baseline's SD "
        "over them in normalised points where a SEM over seeds cannot be had.",
        "Output: `benchmarks/calibration.json`.",
        table(runs, machines),
        bars(runs),
        "### Seeds a comparison of agents needs",
        "What these anchors' seed noise means for comparing two agents: `python -m mlrb.compare --plan` computes, "
        "from this file (a copy ships with mlrb), how many seeds per task detect a 10-point difference in the "
        "counted normalised score. With runs at hand it uses their noise instead, which is an agent's own.",
        commands("-m mlrb.compare --plan --effect 10"),
        comparison_plan(runs),
        "### Draws of the assets",
        "`--vary assets`: the assets built with `assets.seed=s`, a new draw of the task's synthetic world (its "
        "facts, data and base model), with the anchors run on each draw. No user sees this between runs, since "
        "everyone builds the same draw, but it shows whether that draw is typical. A score from assets built "
        "with another `assets.seed` is not comparable with the shipped draw's (each run records its assets' "
        "fingerprint, and the report keeps runs of different fingerprints apart).",
        "Output: `benchmarks/calibration_assets.json`.",
        table(assets),
        bars(assets),
        "### Where the anchors were measured",
        "A tiny build takes the shipped seeds when its own seed 0 of each anchor scores to the last bit as "
        "shipped. Another CPU's kernels can score otherwise, so a task may also ship the same measurement made "
        "on another kind of machine (`--another-machine`); a build takes the first that its seed 0 reproduces. "
        "The tables above are the main machine's.",
        commands("-m benchmarks.calibration --another-machine --seeds 5 --out benchmarks/calibration.json "
                 "--tasks KEY"),
        provenance_table(calibration_rows(runs, "calibration.json") + other_machine_rows(runs)
                         + calibration_rows(assets, "calibration_assets.json")),
    ])  # fmt: skip


def comparison_plan(runs: dict, effect: float = 10.0) -> str:
    """`python -m mlrb.compare --plan --effect EFFECT`'s table and lines, from these anchors."""
    from mlrb.report.paired import Plan, noise_of_calibration

    return "\n\n".join(line for line in Plan(effect, noise_of_calibration(runs)).lines() if line)


BARS = {
    "do_nothing_below_baseline": "do_nothing below the baseline",
    "reference_beats_baseline": "reference above the baseline",
    "item_worth_at_most_2": "one item worth at most 2 normalised points",
    "baseline_sem_at_most_5": "baseline SEM at most 5 normalised points",
}


# The figure each numeric bar is checked on, shown where a task misses it.
NUMBERS = {
    "item_worth_at_most_2": "item_worth_normalised_points",
    "baseline_sem_at_most_5": "baseline_sem_normalised_points",
}


def bars(results: dict) -> str:
    """Which of the four bars each task meets, from the checks the benchmark computed."""
    missed, unchecked = [], []
    for key, result in results.items():
        for bar, text in BARS.items():
            value = result["checks"].get(bar)
            if value is None:  # one seed: no SEM to check it on
                unchecked.append(f"{key} ({text})")
            elif value is False:
                figure = result["checks"].get(NUMBERS.get(bar, ""))
                missed.append(f"{key} ({text}" + ("" if figure is None else f": {figure:.1f}") + ")")
    if not missed and not unchecked:
        return f"All {len(results)} tasks meet the four bars."
    lines = []
    if missed:
        lines.append("Bars not met: " + "; ".join(missed) + ".")
    if unchecked:
        lines.append("Not checked (a single seed): " + "; ".join(unchecked) + ".")
    return " ".join(lines)


def calibration_rows(results: dict, name: str) -> list[tuple[str, dict]]:
    """The provenance of a calibration file's tasks: one row per distinct measurement (the script
    writes each task as it finishes, and `--tasks` reruns some of them). The tasks of one run share
    their row, and its sources are all of theirs."""
    groups: dict[str, list[str]] = {}
    sources: dict[str, dict] = {}
    for key, result in results.items():
        measured = dict(result.get("measured") or {})
        recorded = measured.pop("sources", None)
        group = json.dumps(measured, sort_keys=True)
        groups.setdefault(group, []).append(key)
        if recorded is not None:
            sources[group] = {**sources.get(group, {}), **recorded}

    def measurement(group: str) -> dict:
        return {**json.loads(group), **({"sources": sources[group]} if group in sources else {})}

    return [(f"`{name}`: {', '.join(keys)}", measurement(group)) for group, keys in groups.items()]


def other_machine_rows(results: dict) -> list[tuple[str, dict]]:
    """The provenance of the tasks' other machines' records, one row per measurement."""
    by_machine: dict[tuple, dict] = {}
    for key, result in results.items():
        for record in result.get("other_machines", []):
            by_machine.setdefault(machine_of(record), {})[key] = record
    return [
        (f"{label}: another machine, {'with' if avx512 else 'without'} AVX-512", measured)
        for (_, avx512), records in by_machine.items()
        for label, measured in calibration_rows(records, "calibration.json")
    ]


SECTION = Section(
    "How far apart the anchors are",
    order=10,
    reads=("calibration.json", "calibration_assets.json"),
    render=calibration_section,
    sources=SHARED_SOURCES,  # and each task's folder: `task_sources`
)


if __name__ == "__main__":
    main()
