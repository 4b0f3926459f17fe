"""The tiny tasks' builds for a run of the whole suite, done before its test processes start.

Left to the tests, the first test that needs a task builds it, beside the other test processes:
from an empty cache, up to three builds ran at once beside the other tests, each build's anchor
runs taking one core each, and the cold suite took 57 minutes (benchmarks/suite_time.json). Built
ahead, before any test, the builds have the cores to themselves, and the tests that follow
find the cache warm. They run two at a time (BUILDS_AT_ONCE), each in a process of its own: a
build's data and base model are made on one torch thread (byte-identical files on any core
count), which left the second core idle for a third of the builds' time when they ran one after
another. With the builds come the unseen-seed runs of tests/test_anchor_seeds.py,
which are kept beside the assets in the same way.

Only a run of the whole suite builds ahead (no test paths named, no -k, and an -m that selects
the integration or system tier, which are the ones that use the assets): a developer who runs one
file builds only what that file needs, when it needs it. Whatever is already built and intact is
only checked. A build that fails here is reported in one line and left to the tests that need
it, which fail with the whole error."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from mlrb.tasks.handling import solutions_of

# In the order benchmarks/build_times.py builds them.
TINY_TASKS = ["llm_merging", "llm_efficiency", "edge_llm_compression", "math_reasoning", "baby_lm", "mini_pile",
              "edge_llm_training"]  # fmt: skip
# The tasks whose anchors are commands run at build (llm_merging's are its merges, no seed reaches them).
SEEDED = TINY_TASKS[1:]
# Builds at once: two, on the 2 cores CI has (a build's anchor runs take two cores at times).
BUILDS_AT_ONCE = 2
# The builds' order per scale, the longest first: llm_efficiency's base model takes a quarter of the
# tiny builds' time; at plumbing scale, llm_merging's merges are scored at build.
LONGEST = {"tiny": "llm_efficiency", "plumbing": "llm_merging"}


def longest_first(scale: str) -> list[str]:
    return [LONGEST[scale], *(key for key in TINY_TASKS if key != LONGEST[scale])]


def wanted(config: pytest.Config) -> list[str]:
    """The scales this run builds ahead: `tiny` (the calibrated builds) when it runs the system tier,
    `plumbing` (seconds each) when it runs the integration tier; none for a run of a few tests (a
    path named, or -k: they build what they use, when they use it), for the fast tier alone, and
    for --collect-only, which runs nothing."""
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.keyword:
        return []
    if getattr(config.option, "collectonly", False):
        return []
    from _pytest.mark.expression import Expression  # how pytest itself reads -m

    expression = config.option.markexpr
    selects = Expression.compile(expression).evaluate if expression else (lambda matcher: True)
    runs = {tier for tier in ("integration", "system") if selects(lambda name, tier=tier, **_: name == tier)}
    return [scale for tier, scale in (("system", "tiny"), ("integration", "plumbing")) if tier in runs]


def build(cache_dir: Path, say: Callable[[str], None], scales: Sequence[str] = ("tiny",)) -> None:
    """Each task's assets at SCALES in cache_dir and, for the seeded ones at tiny scale, their
    unseen-seed scores.
    What the builds print (lm-eval's and transformers' progress bars and warnings, on stderr)
    goes to cache_dir/build-ahead.log, not between the suite's lines."""
    cache_dir.mkdir(parents=True, exist_ok=True)  # a first build on this machine
    log = cache_dir / "build-ahead.log"
    say(f"(their output: {log})")
    with stderr_to(log):
        for scale in scales:
            build_each(cache_dir, say, scale)


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 into `path` (the libraries' own writes too), restored afterwards."""
    streams = {sys.stderr, sys.__stderr__} - {None}
    for stream in streams:
        stream.flush()
    kept = os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            for stream in streams:
                stream.flush()
            os.dup2(kept, 2)
            os.close(kept)


def build_each(cache_dir: Path, say: Callable[[str], None], scale: str) -> None:
    """Every task's build at SCALE, BUILDS_AT_ONCE at a time, each task's lines said as it ends
    (the longest first, so that the last to end is a short one)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # Forked: a build starts without a new interpreter's imports. Each process builds tasks one after
    # another; what the builds print goes to the log, which the processes share as their stderr.
    with ProcessPoolExecutor(max_workers=BUILDS_AT_ONCE, mp_context=multiprocessing.get_context("fork")) as pool:
        builds = {pool.submit(build_one, cache_dir, key, scale): key for key in longest_first(scale)}
        for done in as_completed(builds):
            try:
                lines = done.result()
            except Exception as e:  # its process died (killed, out of memory): its tests build it again
                lines = [
                    f"{builds[done]}: its build's process ended ({type(e).__name__}: {e}); its tests will build it"
                ]
            for line in lines:
                say(line)


def build_one(cache_dir: Path, key: str, scale: str) -> list[str]:
    """One task's assets at SCALE (and at tiny scale, a seeded task's unseen-seed scores): what to
    say of them. A build that fails is said in one line; its traceback goes to the log."""
    from conftest import task_from_config
    from mlrb.harness.assets import MANIFEST, asset_dir, ensure_assets

    lines = []
    try:
        task = task_from_config(key, scale=scale)
        fresh = not (asset_dir(task, cache_dir) / MANIFEST).exists()
        started = time.monotonic()
        assets = ensure_assets(task, cache_dir)
        if fresh:
            lines.append(f"{key} ({scale}): built in {time.monotonic() - started:.0f} s{shipped_or_not(task, assets)}")
        if scale == "tiny" and key in SEEDED and kept_unseen_seed_scores(task, assets) is None:
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"unseen-seed-{key}-") as scratch:
                unseen_seed_scores(task, assets, Path(scratch))
            lines.append(f"{key}: its anchors run at an unseen seed in {time.monotonic() - started:.0f} s")
    except Exception as e:  # the tests that need it build it again and show the whole error
        lines.append(f"{key}: FAILED ({type(e).__name__}: {str(e)[:300]}); its tests will build it again")
        traceback.print_exc()  # into the log, after what the build printed
        sys.stderr.flush()
    return lines


def shipped_or_not(task, assets: Path) -> str:
    """Whether a build took the calibration mlrb ships, said where it could have: a task whose
    shipped calibration no longer holds measures every seed, which the suite's time shows."""
    from mlrb.tasks.anchors import shipped_file

    if task.spec.plumbing or task.anchors.measured_by or "built" not in shipped_file().get(task.name, {}):
        return ""
    shipped = json.loads((assets / "hidden" / "calibration.json").read_text()).get("shipped")
    if shipped:
        return f" (took the shipped calibration measured on {shipped_machine(task.name, shipped)})"
    return " (measured every seed: the shipped calibration does not hold here; see docs/development.md)"


def shipped_machine(task_name: str, shipped: dict) -> str:
    """The kind of machine a build's shipped calibration was measured on, as `benchmarks.calibration
    --carry` names it: its CPU and, where its record says, whether it has AVX-512 (two EPYCs share
    the name "AMD EPYC"). The build keeps the record's commit and date; the record, shipped with
    mlrb, has the rest."""
    from benchmarks.calibration import machine_name
    from mlrb.tasks.anchors import shipped_file

    entry = shipped_file().get(task_name, {})
    for record in [entry, *entry.get("other_machines", [])]:
        measured = record.get("measured", {})
        if measured and (measured.get("commit"), measured.get("date")) == (shipped.get("commit"), shipped.get("date")):
            return machine_name(record)
    return shipped.get("cpu") or "an unnamed CPU"


def unseen_seed_record(task, assets: Path) -> tuple[Path, dict]:
    """Where a task's unseen-seed scores are kept (beside its assets), and what they must have been
    run with: the first seed the build did not run, and the commands."""
    seed = json.loads((assets / "hidden" / "calibration.json").read_text())["anchor_seeds"]
    commands = task.anchors.commands
    wanted = {"seed": seed, "commands": {a: commands[a] for a in ("baseline", "reference")}}
    return assets.parent / f"unseen-seed-{assets.name}.json", wanted


def kept_unseen_seed_scores(task, assets: Path) -> dict[str, float] | None:
    """The scores kept beside the assets, if they were run as they must be; None otherwise."""
    record, wanted = unseen_seed_record(task, assets)
    kept = json.loads(record.read_text()) if record.exists() else {}
    return kept["scores"] if {k: kept.get(k) for k in wanted} == wanted else None


def unseen_seed_scores(task, assets: Path, scratch: Path) -> dict[str, float]:
    """The baseline's and the reference's scores at the first seed the build did not run, run and
    scored as at asset build (side by side, forked from a warm interpreter, each scored on one
    torch thread as soon as it ends; an invalid submission stops it, AnchorFailed). Kept beside the assets in the test cache: the asset key covers the
    commands, the data and the code that runs and scores them (mlrb/task_kit/sources.py), so a rerun
    of the same code reads the same scores back, and any change to them runs both again."""
    kept = kept_unseen_seed_scores(task, assets)
    if kept is not None:
        return kept
    record, wanted = unseen_seed_record(task, assets)
    solutions = solutions_of(task, assets / "public")
    jobs = [("reference", wanted["seed"]), ("baseline", wanted["seed"])]  # the longer first, as at asset build
    with solutions.warm() as warm:  # forked from one warm interpreter, as at asset build
        reports = task.anchors.score_seeds(
            scratch, jobs, run=lambda command, workspace, seed: solutions.run(command, workspace, seed, warm),
            score=lambda submission, work_dir: task.judge.score(submission, assets, work_dir), workers=2,
        )  # fmt: skip
    scores = {anchor: reports[anchor, wanted["seed"]].score for anchor in ("baseline", "reference")}
    record.write_text(json.dumps({**wanted, "scores": scores}, indent=2))
    return scores
