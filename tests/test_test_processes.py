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


@pytest.mark.parametrize(
    "source, keyword, markexpr, builds",
    [
        ("TESTPATHS", "", "", True),  # the README's command, as CI runs it
        ("TESTPATHS", "", "not system", True),
        ("TESTPATHS", "", "system", True),
        ("TESTPATHS", "", "fast or integration", True),
        ("TESTPATHS", "", "fast", False),  # the edit loop uses no assets
        ("TESTPATHS", "baseline", "", False),  # -k: a few tests, which build what they need
        ("ARGS", "", "", False),  # a file or test named: only what it needs, when it needs it
    ],
)
def test_only_a_run_of_the_whole_suite_builds_the_tiny_tasks_ahead(source, keyword, markexpr, builds):
    from types import SimpleNamespace

    import build_ahead

    config = SimpleNamespace(args_source=getattr(pytest.Config.ArgsSource, source),
                             option=SimpleNamespace(keyword=keyword, markexpr=markexpr))  # fmt: skip
    assert build_ahead.wanted(config) is builds


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
