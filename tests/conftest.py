"""Shared fixtures: every test runs offline, writes into its own temporary
tracking store, and all tests of a session share one build of the task assets."""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.pop("MLFLOW_TRACKING_URI", None)
# One thread per torch process, here and in the runs the tests start (the sandboxes pass these
# on): the suite runs three test processes on two cores, and OpenMP threads that outnumber the
# cores spin while they wait, so two torch processes side by side each took four times as long.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Python's bytecode caches are written, here and in every process the tests start, even where the
# environment says not to (PYTHONDONTWRITEBYTECODE, set by some container images): without them each
# test process rewrites every test module's asserts again (about 4 CPU s a process) and each new
# interpreter compiles mlrb's own modules again. They go where Python puts them, in __pycache__
# folders, which git ignores and the harness leaves out wherever it copies or hashes code.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import warm_start  # noqa: E402  # after the lines above: it keeps this environment for its warm process

# Harbor task folders the tests run through the harness: their own tests run only in their verifier.
collect_ignore_glob = ["harbor_tasks/*"]

# The tests' asset cache, kept between test runs (MLRB_TEST_CACHE moves it). Assets are keyed by
# everything that determines them, the code that builds and scores them included
# (mlrb/task_kit/sources.py), and checked file by file on each use: a later run of the same code
# reuses them, changed code builds its own. Delete the folder to run the suite from cold.
TEST_CACHE = Path(os.environ.get("MLRB_TEST_CACHE") or Path.home() / ".cache" / "mlrb-tests")
UNUSED_FOR_DAYS = 7  # asset folders no test run has used for this long are deleted


@pytest.fixture(autouse=True)
def no_tracking_uri_leak():
    """MLflow's process-wide tracking URI (set_tracking_uri also sets $MLFLOW_TRACKING_URI) as it was
    before each test: a test that stops half-way must not send every later run to its store."""
    yield

    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if "mlflow" in sys.modules:
        import mlflow

        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The asset cache of every test run: the first test that needs a task's assets builds them."""
    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    prune(TEST_CACHE)
    return TEST_CACHE


def prune(cache: Path) -> None:
    """Delete the asset folders of code long gone, so the cache does not grow with every change."""
    import shutil
    import time

    from mlrb.harness.assets import MANIFEST, VERIFIED

    cutoff = time.time() - UNUSED_FOR_DAYS * 86400
    for manifest in cache.glob(f"*/*/{MANIFEST}"):
        if manifest.stat().st_atime < cutoff and manifest.stat().st_mtime < cutoff:
            shutil.rmtree(manifest.parent, ignore_errors=True)
    for record in cache.glob("*/unseen-seed-*.json"):  # tests/test_anchor_seeds.py's, beside their assets
        if not (record.parent / record.stem.removeprefix("unseen-seed-")).is_dir():
            record.unlink(missing_ok=True)
    for control in cache.glob("*/*.control"):  # mlrb/harness/control.py's, beside assets pruned above
        if not control.with_suffix("").is_dir():
            shutil.rmtree(control, ignore_errors=True)
    for verified in cache.glob(f"*/*{VERIFIED}"):  # mlrb/harness/assets.py's record of a check, beside its folder
        if not verified.with_name(verified.name.removesuffix(VERIFIED)).is_dir():
            verified.unlink(missing_ok=True)
    for mirror in cache.glob(f"{MIRRORS}/*"):  # kept_mirror's (a build cut short too)
        if mirror.stat().st_mtime < cutoff:
            shutil.rmtree(mirror, ignore_errors=True)


@pytest.fixture(scope="session")
def built_cache(cache_dir) -> Path:
    """The session's cache, with the default task's assets (tiny: the calibrated ones) built in it."""
    from mlrb.harness.assets import ensure_assets

    ensure_assets(tiny_llm_merging(), cache_dir)
    return cache_dir


# The override that runs a task at its plumbing scale: assets built in seconds, a run that measures
# nothing (no normalised or counted score). The integration tier's tests of how runs move (signals,
# sweeps, records, sandboxes, agents) add it to their commands; the calibrated tiny scale's own tests
# are the system tier's.
PLUMBING = "task.scale=plumbing"


@pytest.fixture(scope="session")
def plumbing_cache(cache_dir) -> Path:
    """The session's cache, with the default task's plumbing assets built in it."""
    from mlrb.harness.assets import ensure_assets

    ensure_assets(plumbing_llm_merging(), cache_dir)
    return cache_dir


# The cheapest real task, for tests of the harness's own mechanics, whose task is incidental (metering,
# the agent's end, the disk, the audit, signals): a folder task in MLAgentBench's layout whose
# training, scoring and anchors are a few lines of plain Python (tests/folder_tasks/house-price-mini).
# A run of it costs about a sixth of the CPU of the default task's plumbing run, whose scorer alone
# imports torch, transformers and lm-eval; the default task's own path is tested where it matters.
HARNESS_TASK_PATH = Path(__file__).parent / "folder_tasks" / "house-price-mini"
HARNESS_TASK = ("task=folder", f"task.path={HARNESS_TASK_PATH}")
HARNESS_EXPERIMENT = "house-price-mini"  # its runs' experiment, and the first part of their names
# An agent's shell command that leaves a valid submission there (the given train.py's predictions).
# Its baseline command (task.scales.folder.baseline_command) is run when its assets are built, as the
# check that the folder works, whatever baseline_score says: a scripted agent that works on for long
# is an `agent=command` (its proxy needs an API key in the environment, even when no model is called).
HARNESS_SUBMISSION = "python train.py"


def harness_task(*overrides: str):
    """The harness's task (HARNESS_TASK) as a task object, for tests that drive its parts in-process
    (a Scorer), with config OVERRIDES (`task.scales.folder.score_timeout_s=10`)."""
    from mlrb.core import registry

    return registry.load_task(compose_config(*HARNESS_TASK, *overrides).task)


def task_from_config(key: str, scale: str = "tiny", **overrides):
    """Task KEY as mlrb/tasks/KEY/task.yaml defines it (composed), at SCALE (tiny: the calibrated
    one; plumbing: built in seconds, for tests of how runs move), with some of its values overridden."""
    from mlrb.core import registry
    from mlrb.core.config import TaskConfig, packaged_task

    raw = packaged_task(key)
    raw["scale"] = scale
    raw["scales"][scale].update(overrides)
    return registry.load_task(TaskConfig(**raw))


def tiny_llm_merging():
    """The llm_merging task as mlrb/tasks/llm_merging/task.yaml defines it (tiny scale)."""
    return task_from_config("llm_merging")


def plumbing_llm_merging():
    """The llm_merging task at its plumbing scale (task.yaml's `plumbing`: built in seconds)."""
    return task_from_config("llm_merging", scale="plumbing")


def broken_copy_of(cache_dir: Path, dest: Path, scale: str = "tiny") -> Path:
    """A copy of the cache whose llm_merging test set (at SCALE) is not JSON, with a manifest that
    agrees (as a builder bug would leave it): the check passes, the scorer itself breaks."""

    from mlrb.harness.assets import MANIFEST, asset_dir, file_hashes, fingerprint_of

    source = asset_dir(task_from_config("llm_merging", scale=scale), cache_dir)
    shutil.copytree(source, dest / source.relative_to(cache_dir))
    for test_set in dest.glob("llm_merging/*/hidden/test.jsonl"):
        test_set.write_text("{this is not json\n")
        folder = test_set.parent.parent
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["files"] = file_hashes(folder)
        manifest["fingerprint"] = fingerprint_of(manifest["files"])
        (folder / MANIFEST).write_text(json.dumps(manifest))
    return dest


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m mlrb ARGS` as a user would type it, from `cwd`."""
    return run_module("mlrb", *args, cwd=cwd, env=env, timeout=timeout)


def run_module(module: str, *args: str, cwd: Path, env: dict | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:  # fmt: skip
    """`python -m MODULE ARGS` from `cwd`, ENV added to the environment, its output captured as
    text: started warm, as a fork of a process that has made its imports already
    (tests/warm_start.py)."""
    return warm_start.run(module, list(args), cwd, {**os.environ, **(env or {})}, timeout)


def store_args(tmp_path: Path, cache_dir: Path) -> list[str]:
    """Overrides that keep a run's store, cache and files inside the test's folders. The store
    starts as a copy of an empty one this MLflow made (`empty_store`), as creating its tables
    takes seconds of a test's time; tests of store creation itself give tracking.dir their own way."""
    store = tmp_path / "mlruns" / "mlflow.db"
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(empty_store(), store)
    return [
        f"tracking.dir={tmp_path / 'mlruns'}",
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]


@functools.cache
def empty_store() -> Path:
    """A SQLite store with MLflow's tables and nothing else, made once per MLflow version by the
    harness's own `create_sqlite_store` and kept in the test cache."""
    import mlflow

    from mlrb.store.tracking import create_sqlite_store

    folder = TEST_CACHE / "mlflow-stores"
    db = folder / f"mlflow-{mlflow.__version__}.db"
    if not db.exists():  # made under a name of this process's, then renamed: test processes may race
        mine = folder / f"{db.stem}.{os.getpid()}.db"
        create_sqlite_store(mine, (folder / "artifacts").as_uri())
        os.replace(mine, db)
        mine.with_name(mine.name + ".lock").unlink(missing_ok=True)
    return db


MIRRORS = "hub-mirrors"  # kept_mirror's folder in the test cache


def kept_mirror(eval_tasks: list[str]) -> Path:
    """The full-scale stand-in mirror for EVAL_TASKS (tests/hub_mirror.py), built once and kept in
    the test cache under its `mirror_key`: a later test process or run of the same code copies it
    instead of building it again (about 25 CPU s). Built under a name of this process's, then
    renamed: test processes may race, and the first to finish wins."""
    from unittest import mock

    import hub_mirror

    kept = TEST_CACHE / MIRRORS / hub_mirror.mirror_key(eval_tasks)
    if not kept.is_dir():
        mine = kept.with_name(f"{kept.name}.{os.getpid()}")
        shutil.rmtree(mine, ignore_errors=True)
        mine.mkdir(parents=True)
        with mock.patch.dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"):
            hub_mirror.build_mirror(mine, eval_tasks)
        try:
            os.rename(mine, kept)
        except OSError:  # another process's is there already
            shutil.rmtree(mine, ignore_errors=True)
    os.utime(kept)  # used now: `prune` keeps it
    return kept


def mlflow_client(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")


def only_run(tmp_path: Path, experiment: str):
    """The store's client under tmp_path, and the one run of EXPERIMENT in it."""
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def baseline_run(task_key: str, tmp_path: Path, cache_dir: Path):
    """`python -m mlrb task=KEY agent=baseline` into a fresh store; checks what every task's
    baseline run must show (one FINISHED, valid run scoring its own baseline) and returns it."""
    result = run_cli(f"task={task_key}", "agent=baseline", *store_args(tmp_path, cache_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name(task_key).experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == f"{task_key}/baseline/smoke/0"
    assert run.data.tags["mlrb.valid"] == "True" and run.data.tags["mlrb.scale"] == "tiny"
    metrics = run.data.metrics
    # The anchors as the asset build measured them, read from its file, not from the run.
    calibration = anchors_of(task_key, cache_dir)
    assert metrics["baseline_score"] == pytest.approx(calibration["baseline_score"], abs=1e-12)
    assert metrics["reference_score"] == pytest.approx(calibration["reference_score"], abs=1e-12)
    # The anchors are means over seeds 0, 1, 2 (the build's own), or 0-4 (the calibration mlrb ships,
    # which the build took once its seed 0 scored here as shipped), each seed's score kept with their
    # SD and SEM.
    seeds = calibration["baseline_seeds"]
    n = 5 if "shipped" in calibration else 3
    assert calibration["anchor_seeds"] == len(seeds) == len(calibration["reference_seeds"]) == n
    assert calibration["baseline_score"] == pytest.approx(sum(seeds) / n, abs=1e-12)
    spread = (sum((s - calibration["baseline_score"]) ** 2 for s in seeds) / (n - 1)) ** 0.5
    assert calibration["baseline_sd"] == pytest.approx(spread, abs=1e-12)
    assert calibration["baseline_sem"] == pytest.approx(spread / n**0.5, abs=1e-12)
    assert metrics["baseline_score_sem"] == pytest.approx(calibration["baseline_sem"], abs=1e-12)
    # The rerun reproduces the build's seed-0 baseline run (the same command and seed), and is
    # normalised on the anchors.
    assert metrics["score"] == pytest.approx(seeds[0], abs=1e-6)
    baseline, reference = calibration["baseline_score"], calibration["reference_score"]
    expected = 100 * (metrics["score"] - baseline) / (reference - baseline)
    assert metrics["normalised_score"] == pytest.approx(expected, abs=1e-4)
    assert_record_matches_store(client, run)
    return run


def assert_record_matches_store(client, run) -> dict:
    """The run folder's record.jsonl (mlrb/store/record.py) holds what the store holds for RUN: its
    params, its mlrb tags, every metric's history by step, its artifacts, its traces and its status.
    Returns the folded record."""
    from mlrb.store import record

    state = record.fold(record.read(Path(run.data.tags["mlrb.run_dir"])))
    assert state["run_id"] == run.data.tags["mlrb.run_id"] and state["status"] == run.info.status  # found by its id
    assert state["params"] == run.data.params
    # the run's own tags (not the mark mlrb.sync sets once the store's run holds all of the record)
    ours = {k: v for k, v in run.data.tags.items() if k.startswith("mlrb.") and k != "mlrb.synced_record"}
    assert {k: v for k, v in state["tags"].items() if k in ours or k.startswith("mlrb.")} == ours
    for key, history in state["metrics"].items():
        stored = sorted([m.step, m.value] for m in client.get_metric_history(run.info.run_id, key))
        assert sorted(history) == stored, key
    assert set(state["metrics"]) == set(run.data.metrics)
    run_dir = Path(run.data.tags["mlrb.run_dir"])
    logged = {Path(folder if is_dir else Path(folder or "") / Path(file).name).parts[0]  # at the artifacts' top
              for file, folder, is_dir in state["artifacts"]
              if not is_dir or any(p.is_file() for p in (run_dir / file).rglob("*"))}  # fmt: skip
    assert logged == {a.path for a in client.list_artifacts(run.info.run_id)}
    # the agent's traces: a step's in the record, a trace of the run tagged with that step in the store
    stored = client.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id)
    assert sorted(str(t["step"]) for t in state["traces"]) == sorted(t.info.tags["mlrb.step"] for t in stored)
    assert sorted(len(t["spans"]) for t in state["traces"]) == sorted(len(t.data.spans) for t in stored)
    return state


def anchors_of(task_key: str, cache_dir: Path) -> dict:
    """hidden/calibration.json of the task's tiny assets in cache_dir (built already)."""
    from mlrb.harness.assets import ensure_assets

    assets = ensure_assets(task_from_config(task_key), cache_dir)
    return json.loads((assets / "hidden" / "calibration.json").read_text())


TIERS = ("fast", "integration", "system")  # pyproject.toml says what each holds
# Module fixtures that cost next to nothing, which tests of several processes may each make: the
# others are made once per test process that runs a test of their module, so the tests that share
# one share an xdist_group (one process, one fixture; tests/test_test_processes.py).
CHEAP_MODULE_FIXTURES = {
    "assets": "the built-ahead assets, only checked: about 0.2 CPU s",
    "configs_page": "a page read from the docs folder",
}
# What plain `pytest` runs (the README's test command): the system tier only on request (`-m system`,
# as .ci/run runs it after), or when a test file or test is named.
DEFAULT_TIERS = "not system"


def pytest_configure(config):
    """The default selection: with no `-m` and no test named, the fast and integration tiers; the
    tests handed out longest first."""
    if default_selection(config):
        config.option.markexpr = DEFAULT_TIERS
    config.pluginmanager.register(LongestFirst(), "mlrb-longest-first")


def default_selection(config) -> bool:
    """Whether this run takes the default tiers: no `-m` given and no test path named (in an xdist
    worker the controller's choice has arrived already, as its `-m`)."""
    return not config.option.markexpr and config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_report_header(config):
    if config.option.markexpr == DEFAULT_TIERS and not hasattr(config, "workerinput"):
        return "tiers: fast and integration (the system tier runs with -m system; bash .ci/run runs every tier)"


def pytest_xdist_auto_num_workers(config):
    """How many test processes `-n auto` (pyproject.toml's addopts) starts: one per core and one
    more, as tests also wait on subprocesses, servers and sleeps (measured on 2 cores: 3 kept both
    busy); at most one per 4 GiB of memory, as a worker's runs load models. `-n 0` runs in one process."""
    cores = len(os.sched_getaffinity(0))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cores + 1, int(memory_gib // 4)))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an unmarked test fails every selection
def pytest_collection_modifyitems(config, items):
    """Every test carries exactly one tier marker; a test without one (or with two) is refused. So are
    tests that share a costly module fixture without one xdist_group."""
    problems = []
    for item in items:
        tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: {'no tier marker' if not tiers else 'tiers ' + ' and '.join(tiers)}")
    if problems:
        raise pytest.UsageError(
            "every test carries exactly one tier marker, pytest.mark.fast, .integration or .system "
            "(pyproject.toml says what each holds):\n  " + "\n  ".join(problems)
        )
    if problems := module_fixtures_made_more_than_once(items):
        raise pytest.UsageError(
            "tests that share a module fixture share one pytest.mark.xdist_group, so that one test process "
            "makes it once (or the fixture is named in tests/conftest.py's CHEAP_MODULE_FIXTURES):\n  "
            + "\n  ".join(problems)
        )


def module_fixtures_made_more_than_once(items) -> list[str]:
    """Each module fixture (not a cheap one) that several tests use without one xdist_group between them:
    xdist hands those tests to whichever test process is free, and each process makes the fixture anew."""
    users: dict[tuple[str, str], dict[str, str | None]] = {}
    for item in items:
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        for name in item.fixturenames:
            definition = (definitions.get(name) or [None])[-1]  # the one the test gets
            if definition is not None and definition.scope == "module" and name not in CHEAP_MODULE_FIXTURES:
                users.setdefault((item.nodeid.split("::")[0], name), {})[item.name] = xdist_group(item)
    problems = []
    for (module, name), tests in sorted(users.items()):
        groups = set(tests.values())
        if len(tests) > 1 and (None in groups or len(groups) > 1):
            held = "no group" if groups == {None} else "groups " + ", ".join(sorted(g or "(none)" for g in groups))
            problems.append(f"{module}: {name!r}, used by {', '.join(sorted(tests))} ({held})")
    return problems


def xdist_group(item) -> str | None:
    """The name of the xdist_group ITEM is in, or None."""
    mark = item.get_closest_marker("xdist_group")
    return (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None


class LongestFirst:
    """Hands the tests out longest first: xdist gives each test process its next test (or group) as it
    finishes one and keeps one more queued, so a long test started last keeps a process busy after the
    others are done. The lengths are the ones benchmarks/suite_time.py last recorded (the slowest
    seen); a test it never recorded counts as the longest, as a new test may be. A group keeps its tests
    together and in their order, and is as long as they are together."""

    @pytest.hookimpl(trylast=True)  # after -m has deselected and pytest has ordered the tests for their fixtures
    def pytest_collection_modifyitems(self, items):
        items[:] = longest_first(items, recorded_test_seconds())


def recorded_test_seconds() -> dict[str, float]:
    """Each test's seconds (setup and teardown included) as benchmarks/suite_time.json records them,
    the most of any entry; {} where it cannot be read (then the order stays the collection's)."""
    try:
        entries = json.loads((REPO / "benchmarks" / "suite_time.json").read_text())
    except (OSError, ValueError):
        return {}
    seconds: dict[str, float] = {}
    for entry in entries.values():
        for test_id, took in (entry.get("tests") or {}).items() if isinstance(entry, dict) else ():
            test_id = re.sub(r"@[\w-]+$", "", test_id)  # xdist's loadgroup adds @GROUP to a grouped test's id
            seconds[test_id] = max(float(took), seconds.get(test_id, 0.0))
    return seconds


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """ITEMS by SECONDS, longest first (see LongestFirst)."""
    units: dict[str, list] = {}
    for item in items:
        group = xdist_group(item)
        units.setdefault(f"group {group}" if group else item.nodeid, []).append(item)
    length = {key: sum(seconds.get(item.nodeid, math.inf) for item in unit) for key, unit in units.items()}
    ranked = sorted(units, key=length.__getitem__, reverse=True)  # stable: equal ones keep their order
    return [item for key in ranked for item in units[key]]


# Where the time goes, per tier: summed from every test's setup, call and teardown, printed at the
# end of the run and written as JSON to $MLRB_SUITE_TIMES when it is set: that file, or in that
# folder one file per -m selection (benchmarks/suite_time.py).
TIER_SECONDS: dict[str, float] = {}
TIER_TESTS: dict[str, set[str]] = {}
FILE_SECONDS: dict[str, float] = {}  # per test file: where to look first for time to save
TEST_SECONDS: dict[str, float] = {}  # per test, setup and teardown included
# CPU seconds, which on a busy machine say more than wall time: the suite keeps every core busy,
# so what it costs is what its processes compute. Counted per test process, with everything it
# started (subprocesses, their sandboxes, servers of its fixtures), not Docker's containers nor
# services started outside the suite; see `CpuMeter`.
TIER_CPU: dict[str, float] = {}
TEST_CPU: dict[str, float] = {}
CPU_SOURCES: set[str] = set()  # how the test processes read it: "cgroup" or "getrusage"
SESSION_STARTED: list[float] = []


BUILD_AHEAD_S: list[float] = []  # tests/build_ahead.py's time, when the whole suite runs


def pytest_sessionstart(session):
    """Before xdist starts the test processes (its own hook runs last): a run of the whole suite
    builds the tiny tasks ahead, two at a time on every core (tests/build_ahead.py)."""
    import time

    import build_ahead

    SESSION_STARTED.append(time.monotonic())
    scales = [] if hasattr(session.config, "workerinput") else build_ahead.wanted(session.config)
    if not scales:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reporter.write_sep(
        "-", f"the tasks' builds at scale {' and '.join(scales)}, ahead of the tests (cache {TEST_CACHE})"
    )
    TEST_CACHE.mkdir(parents=True, exist_ok=True)
    prune(TEST_CACHE)
    build_ahead.build(TEST_CACHE, reporter.write_line, scales)
    BUILD_AHEAD_S.append(time.monotonic() - SESSION_STARTED[0])
    reporter.write_line(f"builds ahead: {BUILD_AHEAD_S[0]:.0f} s")


class CpuMeter:
    """The CPU seconds of this test process and every process it started. Where the machine has
    cgroup v1's cpuacct controller and lets this process use it (root, as in CI), the process
    moves into a cpuacct cgroup of its own, which its descendants inherit, and the meter reads
    the cgroup's usage: that counts processes nobody waits for, such as a sandbox's, whose
    pid-namespace init reaps them, or a scorer killed with its sandbox (about half the suite's
    CPU time). Elsewhere it reads getrusage: this process and the children it waited for."""

    def __init__(self) -> None:
        self.usage: Path | None = None
        self.source = "getrusage"
        try:
            own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                       if "cpuacct" in line.split(":", 2)[1].split(","))  # fmt: skip
            controller = next(p for p in Path("/sys/fs/cgroup").iterdir() if "cpuacct" in p.name.split(","))
            folder = controller / own.lstrip("/") / f"mlrb-tests-{os.getpid()}"
            for left in folder.parent.glob("mlrb-tests-*"):  # an earlier test process's, still there when it ended
                if not Path(f"/proc/{left.name.rsplit('-', 1)[1]}").exists():
                    with contextlib.suppress(OSError):  # not empty yet: a process of its is still running
                        left.rmdir()
            folder.mkdir(exist_ok=True)
            (folder / "cgroup.procs").write_text(str(os.getpid()))
        except (OSError, StopIteration, IndexError):
            return
        self.usage, self.source, self.folder = folder / "cpuacct.usage", "cgroup", folder
        import atexit

        atexit.register(self.leave)

    def seconds(self) -> float:
        if self.usage is not None:
            return int(self.usage.read_text()) / 1e9
        import resource

        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def leave(self) -> None:
        """Back into the parent cgroup, and the cgroup removed once nothing is left in it."""
        try:
            (self.folder.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.folder.rmdir()
        except OSError:
            pass  # a process of a test still runs in it: left, empty once it ends


@functools.cache
def cpu_meter() -> CpuMeter:
    return CpuMeter()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.cpu_mark = cpu_meter().seconds()
    result = yield
    keep_imports_out_of_collections()
    return result


FROZEN_MODULES = [0]  # how many modules this test process had imported when it last froze them


def keep_imports_out_of_collections() -> None:
    """Once a test has imported modules (MLflow, torch, transformers: a million objects), what the
    process holds is put out of the cyclic collector's reach (gc.freeze, after one collection of
    what is not yet frozen, so that no garbage is kept): each of the later tests' collections then
    goes through their own objects only, not the libraries' again (seconds of a test process's CPU)."""
    if len(sys.modules) > FROZEN_MODULES[0]:
        gc.collect()
        gc.freeze()
        FROZEN_MODULES[0] = len(sys.modules)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds spent since the last one ended, through xdist
    to the process that sums them."""
    report = yield
    now = cpu_meter().seconds()
    report.user_properties.append(("cpu_s", now - getattr(item, "cpu_mark", now)))
    report.user_properties.append(("cpu_source", cpu_meter().source))
    item.cpu_mark = now
    return report


def pytest_runtest_logreport(report):
    tier = next((name for name in TIERS if name in report.keywords), "none")
    properties = dict(report.user_properties)
    cpu = properties.get("cpu_s", 0.0)
    CPU_SOURCES.add(properties.get("cpu_source", "none"))
    TIER_CPU[tier] = TIER_CPU.get(tier, 0.0) + cpu
    TEST_CPU[report.nodeid] = TEST_CPU.get(report.nodeid, 0.0) + cpu
    TIER_SECONDS[tier] = TIER_SECONDS.get(tier, 0.0) + report.duration
    TIER_TESTS.setdefault(tier, set()).add(report.nodeid)
    test_file = report.nodeid.split("::", 1)[0]
    FILE_SECONDS[test_file] = FILE_SECONDS.get(test_file, 0.0) + report.duration
    TEST_SECONDS[report.nodeid] = TEST_SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import time

    if not TIER_SECONDS:
        return
    wall = time.monotonic() - SESSION_STARTED[0] if SESSION_STARTED else None
    terminalreporter.section("time per tier")
    for tier in (*TIERS, "none"):
        if tier in TIER_SECONDS:
            seconds = TIER_SECONDS[tier]
            terminalreporter.write_line(
                f"{tier:12s} {len(TIER_TESTS[tier]):4d} tests {seconds:8.1f} s ({seconds / 60:.1f} min), "
                f"{TIER_CPU.get(tier, 0.0) / 60:.1f} CPU min"
            )
    workers = getattr(config.option, "numprocesses", None) or 0  # xdist's, resolved from -n auto
    if BUILD_AHEAD_S:
        terminalreporter.write_line(
            f"{'builds ahead':12s} {'':10s} {BUILD_AHEAD_S[0]:8.1f} s ({BUILD_AHEAD_S[0] / 60:.1f} min)"
        )
    if wall is not None:
        terminalreporter.write_line(
            f"{'session':12s} {'':10s} {wall:8.1f} s ({wall / 60:.1f} min, collection included; "
            f"{workers or 'no'} parallel test processes, whose tiers' times add up)"
        )
    files = sorted(FILE_SECONDS.items(), key=lambda item: -item[1])
    terminalreporter.section("time per test file (the 15 longest)")
    for test_file, seconds in files[:15]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {test_file}")
    terminalreporter.section(f"CPU time per test (the 15 costliest; read from {', '.join(sorted(CPU_SOURCES))})")
    for test, cpu in sorted(TEST_CPU.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{cpu:8.1f} s  {test}")
    out = os.environ.get("MLRB_SUITE_TIMES")
    if out:
        slowest = sorted(terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []),
                         key=lambda r: -r.duration)[:20]  # fmt: skip
        figures = {
            "tiers": {
                tier: {
                    "tests": len(TIER_TESTS[tier]),
                    "seconds": round(TIER_SECONDS[tier], 1),
                    "cpu_s": round(TIER_CPU.get(tier, 0.0), 1),
                }
                for tier in TIER_SECONDS
            },
            "session_s": None if wall is None else round(wall, 1),
            "build_ahead_s": round(BUILD_AHEAD_S[0], 1) if BUILD_AHEAD_S else None,
            "workers": workers,
            "exit_status": int(exitstatus),
            "slowest": [{"test": r.nodeid, "when": r.when, "seconds": round(r.duration, 1)} for r in slowest],
            "files": {test_file: round(seconds, 1) for test_file, seconds in files},
            "tests": {test: round(seconds, 1) for test, seconds in sorted(TEST_SECONDS.items(), key=lambda t: -t[1])},
            "cpu_source": sorted(CPU_SOURCES),
            "tests_cpu_s": {test: round(cpu, 1) for test, cpu in sorted(TEST_CPU.items(), key=lambda t: -t[1])},
        }
        figures["selection"] = config.option.markexpr or ""  # the tiers this run chose (-m)
        target = Path(out)
        if target.is_dir():  # one file per pytest run: .ci/run runs two (python -m benchmarks.suite_time ci-cold)
            target = target / f"{selection_name(figures['selection'])}.json"
        target.write_text(json.dumps(figures, indent=2) + "\n")


def selection_name(markexpr: str) -> str:
    """A file name for a -m selection: "not system" -> "not-system", "" -> "every-tier"."""
    return "-".join(markexpr.split()) or "every-tier"


def pytest_sessionfinish(session, exitstatus):
    """Under CI every test must run: a skip there (say Docker or SLURM missing) is a failure.
    Judged where every test's report arrives: the one process, or xdist's controller."""
    if hasattr(session.config, "workerinput"):  # an xdist worker: it sees only its own share
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("CI") and skipped and exitstatus == 0:
        reporter.write_line(f"CI: {len(skipped)} test(s) were skipped; every test must run in CI", red=True)
        session.exitstatus = 1


def compose_config(*overrides: str):
    """The typed config `python -m mlrb OVERRIDES` would run, for in-process runs."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb.cli import CONF_DIR
    from mlrb.core.config import register_schema, to_typed

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    GlobalHydra.instance().clear()
    return to_typed(cfg)


def printed(tool_result: dict) -> str:
    """What the baseline's command printed to stdout, from its trajectory line's output
    ("exit code 0 (0.1 s)\nstdout:\n...", as a model is shown a command's result)."""
    return tool_result["output"].split("stdout:\n", 1)[1].split("\nstderr:\n", 1)[0]


@functools.cache
def docs_hook(name: str):
    """docs/hooks/NAME.py, one of the site's hooks (no package: loaded by its path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"docs_{name}_hook", REPO / "docs" / "hooks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tasks_hook():
    """docs/hooks/tasks.py, the site's hook that finds the task pages."""
    return docs_hook("tasks")


def reference_hook():
    """docs/hooks/reference.py, the site's hook that writes the reference pages."""
    return docs_hook("reference")
