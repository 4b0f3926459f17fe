"""The suite's own parallelism works as pyproject.toml says: tests that share an xdist_group
run in one test process, one after another, so a module's costly fixture is made once and
tests that need one fixed port never overlap. (pytest 9.2 with pytest-xdist 3.8 ignored the
groups without a word: the report's store was filled twice, about 150 s each.)"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib

import pytest

from conftest import REPO

pytestmark = pytest.mark.fast

GROUPED = """
import os, pytest

@pytest.fixture(scope="module")
def costly(tmp_path_factory):
    with open(os.environ["SETUPS"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.xdist_group("store")
@pytest.mark.parametrize("n", range(4))
def test_grouped(costly, n):
    with open(os.environ["WORKERS"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("n", range(6))
def test_free(n):
    pass
"""


def test_an_xdist_group_runs_in_one_process_and_its_module_fixture_is_made_once(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not this project's settings, bar the options below
    addopts = shlex.split(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    )
    dist_mode = addopts[addopts.index("--dist") + 1]  # the mode the suite runs in
    env = {"SETUPS": str(tmp_path / "setups"), "WORKERS": str(tmp_path / "workers"), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "--dist", dist_mode, "."]
    try:  # about 3 s idle; once, beside the whole suite's load, over 120 s
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the inner pytest did not end in 600 s; it printed:\n{e.stdout}\n{e.stderr}")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "10 passed" in result.stdout
    workers = (tmp_path / "workers").read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
    assert (tmp_path / "setups").read_text().split() == workers[:1]


SHARED_FIXTURES = """
import pytest

@pytest.fixture(scope="module")
def server():
    pass

@pytest.fixture(scope="module")
def store():
    pass

@pytest.fixture(scope="module")
def assets():  # named in conftest's CHEAP_MODULE_FIXTURES
    pass

@pytest.mark.fast
def test_one(server, store, assets):
    pass

@pytest.mark.fast
@pytest.mark.xdist_group("store")
def test_two(server, store, assets):
    pass

@pytest.mark.fast
@pytest.mark.xdist_group("store")
def test_three(store):
    pass
"""


def test_tests_that_share_a_costly_module_fixture_without_one_xdist_group_fail_collection(tmp_path):
    """tests/conftest.py refuses a module fixture that tests of several test processes may each make:
    one used by tests of no group, or of different groups; a cheap one (CHEAP_MODULE_FIXTURES) may be."""
    import os

    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURES)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "conftest", "-p", "no:cacheprovider",
               "-n", "0", "--rootdir", str(tmp_path), "-c", str(REPO / "pyproject.toml"), str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    printed = result.stdout + result.stderr
    assert result.returncode != 0, printed
    assert "test_shared.py: 'server', used by test_one, test_two (no group)" not in printed  # one has a group
    assert "test_shared.py: 'server', used by test_one, test_two (groups (none), store)" in printed
    assert "test_shared.py: 'store', used by test_one, test_three, test_two (groups (none), store)" in printed
    assert "'assets'" not in printed
    (tmp_path / "test_shared.py").write_text(
        SHARED_FIXTURES.replace(
            "@pytest.mark.fast\ndef test_one", '@pytest.mark.fast\n@pytest.mark.xdist_group("store")\ndef test_one'
        )
    )
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "3 tests collected" in result.stdout


@pytest.mark.parametrize(
    "source, keyword, markexpr, collect_only, builds",
    [
        ("TESTPATHS", "", "not system", False, ["plumbing"]),  # the README's command (conftest's default -m)
        ("TESTPATHS", "", "system", False, ["tiny"]),  # CI's second command: the calibrated builds
        ("TESTPATHS", "", "", False, ["tiny", "plumbing"]),  # every tier
        ("TESTPATHS", "", "fast or integration", False, ["plumbing"]),
        ("TESTPATHS", "", "fast", False, []),  # the edit loop uses no assets
        ("TESTPATHS", "", "system", True, []),  # --collect-only runs nothing, so builds nothing
        ("TESTPATHS", "baseline", "", False, []),  # -k: a few tests, which build what they need
        ("ARGS", "", "", False, []),  # a file or test named: only what it needs, when it needs it
    ],
)
def test_only_a_run_of_whole_tiers_builds_ahead_and_only_the_scales_its_tiers_use(source, keyword, markexpr,
                                                                                  collect_only, builds):  # fmt: skip
    from types import SimpleNamespace

    import build_ahead

    option = SimpleNamespace(keyword=keyword, markexpr=markexpr, collectonly=collect_only)
    config = SimpleNamespace(args_source=getattr(pytest.Config.ArgsSource, source), option=option)
    assert build_ahead.wanted(config) == builds


def test_what_the_builds_ahead_print_goes_to_their_log_and_stderr_comes_back(tmp_path):
    import os
    import sys

    import build_ahead

    log = tmp_path / "build-ahead.log"
    with build_ahead.stderr_to(log):
        print("a progress bar", file=sys.__stderr__)  # the process's stderr, as tqdm writes it
        os.write(2, b"a library's own write\n")  # below Python, as a C extension writes
    assert log.read_text() == "a progress bar\na library's own write\n"
    os.write(2, b"")  # fd 2 is open again and not the log
    assert os.readlink("/proc/self/fd/2") != str(log)


@pytest.mark.fast
def test_a_build_that_took_a_shipped_calibration_names_its_machine_avx_512_included():
    """The build-ahead line names the kind of machine whose record a build took, as a build keeps it
    (anchors.shipped_records): two EPYCs, with and without AVX-512, are told apart."""
    import build_ahead
    from mlrb.tasks.anchors import record_key, shipped_file, shipped_records

    named = {}
    for task in build_ahead.SEEDED:
        entry = shipped_file()[task]
        for record in [entry, *entry.get("other_machines", [])]:
            for kept in shipped_records(task, record_key(record["built"]["key"])):
                named.setdefault(task, set()).add(build_ahead.shipped_machine(task, kept["shipped"]))
    assert named["math_reasoning"] == {
        "Intel(R) Xeon(R) Processor",
        "AMD EPYC, without AVX-512",
        "AMD EPYC, with AVX-512",
    }
    assert all("Intel(R) Xeon(R) Processor" in names for names in named.values())
    # a record no longer shipped (mlrb upgraded under a kept build) is named by the CPU the build kept
    gone = {"commit": "0000000", "date": "2026-01-01 00:00 UTC", "cpu": "AMD EPYC"}
    assert build_ahead.shipped_machine("math_reasoning", gone) == "AMD EPYC"


def collected(*args: str, cache) -> list[str]:
    """The test ids `python -m pytest --collect-only ARGS` selects from the repository's root, with
    the tests' asset cache at CACHE."""
    import os

    env = {**os.environ, "MLRB_TEST_CACHE": str(cache)}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-n", "0", *args]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_plain_pytest_runs_fast_and_integration_and_collecting_builds_nothing(tmp_path):
    """The README's test command leaves the system tier out, `-m system` runs it alone, a file named
    runs whole; and collecting, of any tier, builds nothing (from an empty cache)."""
    cache = tmp_path / "cache"
    default = collected(cache=cache)
    system = collected("-m", "system", cache=cache)
    named = collected("tests/test_docker_runs.py", cache=cache)
    docker_run = "tests/test_docker_runs.py::test_default_run_in_docker_scores_like_the_default_sandbox"
    assert docker_run not in default and docker_run in system and docker_run in named
    assert "tests/test_lock.py::test_install_sh_installs_with_the_lock" in default  # fast
    assert "tests/test_lock.py::test_install_sh_installs_with_the_lock" not in system
    assert not set(default) & set(system) and len(default) > 500 and len(system) > 40
    assert not cache.exists() or not [p for p in cache.rglob("*") if p.name.startswith(("tiny-", "plumbing-"))]


def test_the_tests_are_handed_out_longest_first_a_group_together_and_an_unrecorded_one_first():
    """conftest's LongestFirst orders by the seconds benchmarks/suite_time.json recorded: xdist hands each
    test process the next test as it finishes one, so a long test handed out last would end the run late."""
    from types import SimpleNamespace

    from conftest import longest_first, recorded_test_seconds

    def item(nodeid: str, group: str | None = None) -> SimpleNamespace:
        mark = SimpleNamespace(args=(group,), kwargs={}) if group else None
        return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: mark if name == "xdist_group" else None)

    items = [item("t.py::short"), item("t.py::store_a", "store"), item("t.py::long"), item("t.py::new"),
             item("t.py::store_b", "store"), item("t.py::medium")]  # fmt: skip
    seconds = {
        "t.py::short": 1.0,
        "t.py::store_a": 20.0,
        "t.py::store_b": 25.0,
        "t.py::long": 40.0,
        "t.py::medium": 5.0,
    }
    ordered = [i.nodeid for i in longest_first(items, seconds)]
    assert ordered == ["t.py::new", "t.py::store_a", "t.py::store_b", "t.py::long", "t.py::medium", "t.py::short"]

    # The recorded figures: a grouped test's id as xdist's loadgroup records it (with @GROUP) is the test's.
    recorded = recorded_test_seconds()
    newcomer = "tests/test_newcomer.py::test_the_readme_quick_start_works_from_a_fresh_clone"
    documented = "tests/test_documented_commands.py::test_the_documented_runs_work_as_written"
    assert (
        recorded[newcomer] > 60
        and recorded[documented] > 60
        and recorded[newcomer] > recorded["tests/test_newcomer.py::test_quick_start_reading"]
    )
