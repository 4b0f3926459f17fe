"""benchmarks/suite_time.py's kinds since the split (plain `pytest` runs the fast and integration tiers,
`-m system` the rest, `.ci/run` both): what it records, what the results page makes of it, and how
`ci-cold` runs `.ci/run` in a clone of the committed HEAD. No real suite runs here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import results, suite_time

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def figures(selection: str, tests_cpu_s: dict[str, float]) -> dict:
    """What tests/conftest.py writes for a pytest run, with provenance as the script adds it."""
    measured = results.provenance(note="a unit test's figures")
    measured["machine"]["cpus"] = 2
    return {
        "tiers": {"fast": {"tests": 3, "seconds": 60.0, "cpu_s": 30.0}},
        "session_s": 600.0,
        "build_ahead_s": 12.0,
        "workers": 3,
        "exit_status": 0,
        "slowest": [],
        "files": {},
        "tests": {test: cpu * 2 for test, cpu in tests_cpu_s.items()},
        "cpu_source": ["cgroup"],
        "tests_cpu_s": tests_cpu_s,
        "selection": selection,
        "measured": measured,
    }


def copied_benchmarks(tmp_path: Path) -> Path:
    """A copy of the benchmarks' JSON files, as the results page reads them; its suite_time.json."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for path in BENCH.glob("*.json"):
        shutil.copy(path, folder)
    return folder / "suite_time.json"


def test_new_kinds_are_recorded_beside_the_entries_from_before_the_split(tmp_path):
    out = copied_benchmarks(tmp_path)
    folder = out.parent
    old = json.loads(out.read_text())
    _, old_before = suite_time.split(old)

    default = figures("not system", {"tests/test_mini_pile.py::test_baseline_run_is_recorded_with_its_score": 120.0,
                            "tests/test_config.py::test_a": 30.0})  # fmt: skip
    system = figures("system", {"tests/test_newcomer.py::test_the_readme_quick_start": 240.0,
                       "tests/test_docker_sandbox.py::test_b": 60.0})  # fmt: skip
    ci = {"ci_s": 3000.0, "exit_status": 1, "commit": "0123456789abcdef", "clone": "a git clone",
          "before_tests_s": 1800.0, "default": default, "system": {**system, "exit_status": 1},
          "measured": default["measured"]}  # fmt: skip
    fast = figures("fast", {})
    for kind, entry in (("default", default), ("system", system), ("fast", fast), ("ci-cold", ci)):
        suite_time.record(out, kind, entry)

    written = json.loads(out.read_text())
    assert written["before_split"] == old_before  # moved, unchanged: the new fast took the old one's place
    assert set(old_before) == {"cold", "warm", "fast"} and "selection" not in old_before["fast"]
    assert written["fast"]["selection"] == "fast" and written["default"] == default
    assert suite_time.split(written) == (
        {key: written[key] for key in ("default", "system", "fast", "ci-cold")},
        old_before,
    )

    page = results.render(folder, "suite")
    assert "| default | `pytest`, warm | 10.0 min | 3 processes | 15 min | builds ahead 0.2 min; fast 3 tests" in page
    assert "| system | `pytest -m system`, warm | 10.0 min | 3 processes | - |" in page
    assert "| default-cold | `pytest`, asset cache emptied | not measured | - | 30 min | - |" in page
    assert (
        "| ci-cold | `bash .ci/run` in a fresh clone, asset cache emptied | 50.0 min (.ci/run exited 1) | 3 processes "
        "| 75 min | before the tests 30.0 min (install, services, lint, docs); default 10.0 min: builds ahead 0.2 min"
    ) in page
    assert "; system 10.0 min (pytest exited 1): builds ahead" in page
    assert "It ran a fresh clone of commit 0123456: the committed HEAD" in page
    assert "| before the split | session | target then | tiers | measured |" in page
    assert "| warm | 48.4 min | 15 min |" in page
    # the floor: the warm default and system runs' tests merged
    assert "| one real tiny build and run per task | 120 s | 0 s | 120 s |" in page
    assert "| the README's quick start and first command, from a fresh clone | 0 s | 240 s | 240 s |" in page
    assert "**7.0 CPU min: no less than 3.5 min on 2 cores**" in page  # 120 + 240 + 60 s over 2 cores
    assert "| costliest tests (default and system) | CPU time | wall time |" in page
    kept = suite_time.floor(default, system)
    assert kept["cpu_min"] == 7.0 and kept["groups"]["Docker"] == 60.0


def test_a_slower_machine_s_run_is_kept_beside_this_machine_s_and_compared_with_it(tmp_path):
    out = copied_benchmarks(tmp_path)
    here = json.loads(out.read_text())
    slower = {**here["ci-cold"], "ci_s": 3600.0, "ci_cpu_s": here["ci-cold"]["ci_cpu_s"] * 2.5, "commit": "fedcba9876",
              "avx512": False}  # fmt: skip
    suite_time.record(out, "ci-cold", slower, slower=True)
    suite_time.record(out, "fast", figures("fast", {}))  # a later run here keeps it
    written = json.loads(out.read_text())
    assert written["ci-cold"] == here["ci-cold"]  # this machine's own, unchanged
    assert written[suite_time.SLOWER_MACHINE] == {**here.get(suite_time.SLOWER_MACHINE, {}), "ci-cold": slower}
    assert suite_time.SLOWER_MACHINE not in suite_time.split(written)[0]  # not a kind of this machine's

    page = results.render(out.parent, "suite")
    cpu_min = slower["ci_cpu_s"] / 60
    assert (
        f"| ci-cold | `bash .ci/run` in a fresh clone, asset cache emptied | 60.0 min, {cpu_min:.1f} CPU min "
        "| 2.5 times | 3 processes | before the tests"
    ) in page  # no target: the targets are this machine's, in the table above
    assert "ci-cold, on the slower machine: Commit:" in page and "It ran a fresh clone of commit fedcba9" in page
    assert "Its CPU has no AVX-512. It ran a fresh clone" in page


def test_ci_cold_runs_ci_in_a_clone_of_the_committed_head_with_the_asset_cache_emptied(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    # A stand-in for .ci/run: the two pytest runs' figures, as conftest writes them into the folder.
    (repo / ".ci" / "run").write_text(
        "set -eu\n"
        'echo "{\\"session_s\\": 30, \\"exit_status\\": 0, \\"said\\": \\"$(cat said.txt)\\"}"'
        ' > "$MLRB_SUITE_TIMES/not-system.json"\n'
        'echo \'{"session_s": 20, "exit_status": 1}\' > "$MLRB_SUITE_TIMES/system.json"\n'
        "exit 1\n"
    )
    (repo / "said.txt").write_text("committed")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "ci"], check=True)
    (repo / "said.txt").write_text("uncommitted")
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    cache = tmp_path / "test-cache"
    (cache / "some-task").mkdir(parents=True)
    monkeypatch.setenv("MLRB_TEST_CACHE", str(cache))
    monkeypatch.setattr(suite_time, "REPO", repo)

    entry = suite_time.measure_ci()
    assert not cache.exists()
    assert entry["commit"] == commit and entry["exit_status"] == 1
    assert entry["default"]["said"] == "committed"  # the clone's, not the working tree's
    assert entry["system"] == {"session_s": 20, "exit_status": 1, "files_cpu_s": {}}
    assert entry["before_tests_s"] == pytest.approx(entry["ci_s"] - 50, abs=0.2)
    # the whole of .ci/run's CPU, where this machine has a cpuacct cgroup for it (as root, as CI has)
    assert (entry["ci_cpu_s"] is None) == (suite_time.cpu_cgroup() is None) or entry["ci_cpu_s"] >= 0
    # and which services were up as it started: those it starts run inside its measurement
    assert set(entry["services_up_at_start"]) == {"Docker", "PostgreSQL", "SLURM"}


def test_a_ci_cold_entry_says_which_services_its_cpu_counts(monkeypatch):
    """.ci/run starts the services that are down, inside the measurement: their work for the tests
    (SLURM's jobs, PostgreSQL's backends) then counts in its CPU, and two entries compare only when
    they started alike."""
    monkeypatch.setattr(suite_time, "SERVICES", {"up": ["true"], "down": ["false"], "missing": ["no-such-program-x"]})
    assert suite_time.services_up() == {"up": True, "down": False, "missing": False}
    said = suite_time.services_sentence({"Docker": False, "PostgreSQL": False, "SLURM": True})
    assert said == (" Down as it started, so started by .ci/run and their work for the tests counted: Docker, "
                    "PostgreSQL. Running as it started, so their work for the tests not counted: SLURM.")  # fmt: skip
    assert suite_time.services_sentence(None) == " Which services were running as it started was not recorded."


def test_a_run_s_cpu_counts_every_process_it_started_and_each_file_s_tests_add_up(tmp_path):
    # a grandchild that burns about 0.5 s of CPU, left running detached as a sandbox's process is (nobody
    # waits for it): counted all the same, where the machine has a cpuacct cgroup for it (root, as in CI)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\nopen('burnt', 'w')\n"
    (tmp_path / "burn.py").write_text(burn)
    # its parent, the subshell, is gone at once; the shell only looks for its mark (on a busy machine
    # the half second of CPU takes longer than that of wall time)
    detached = f"({sys.executable} burn.py &); until [ -e burnt ]; do sleep 0.1; done"
    code, cpu_s = suite_time.run_counted(["sh", "-c", detached], tmp_path, dict(os.environ))
    assert code == 0
    if suite_time.cpu_cgroup() is not None:
        assert cpu_s is not None and cpu_s >= 0.5
    else:  # no cgroup: no figure, never a wrong one
        assert cpu_s is None
    files = suite_time.files_cpu({"tests/a.py::x": 1.0, "tests/b.py::y": 5.0, "tests/a.py::z[p]": 2.5})
    assert list(files.items()) == [("tests/b.py", 5.0), ("tests/a.py", 3.5)]


def test_the_lab_sweep_reads_slurm_s_scheduling_delays_from_its_log():
    """benchmarks/lab_sweep.py: SLURM's part of a handover, from a job's end to the next job's allocation
    (a backfill start too), for the sweep's own arrays only, the allocations made at submission aside."""
    from benchmarks.lab_sweep import scheduler_delays

    log = [
        "[2026-12-03T06:56:40.513] sched: Allocate JobId=61_0(62) NodeList=vm #CPUs=1 Partition=debug",
        "[2026-12-03T06:56:40.514] sched: Allocate JobId=61_1(63) NodeList=vm #CPUs=1 Partition=debug",
        "[2026-12-03T06:57:09.584] _job_complete: JobId=61_1(63) WEXITSTATUS 0",
        "[2026-12-03T06:57:09.584] _job_complete: JobId=61_1(63) done",
        "[2026-12-03T06:57:09.618] sched: Allocate JobId=61_2(64) NodeList=vm #CPUs=1 Partition=debug",
        "[2026-12-03T06:57:10.363] _job_complete: JobId=61_0(62) done",
        "[2026-12-03T06:57:10.500] sched: Allocate JobId=70_0(71) NodeList=vm #CPUs=1 Partition=debug",  # another sweep's
        "[2026-12-03T06:57:11.567] sched/backfill: _start_job: Started JobId=61_3(65) in debug on vm",
    ]
    assert [round(d, 3) for d in scheduler_delays(log, {"61"}, slots=2)] == [0.034, 1.204]


def test_each_measurement_carries_the_machine_s_speed_so_a_slow_day_is_told_from_a_slower_suite():
    """The suite's CPU minutes move with the machine's speed; each entry records SPEED_PROBE's CPU
    seconds before and after its run, and the page says them beside where it was measured."""
    probe = suite_time.speed_probe(times=1)
    assert 0 < probe < 60
    entry = {"speed_probe_cpu_s": {"before": 1.119, "after": 1.23, "code": suite_time.SPEED_PROBE}}
    assert suite_time.speed_text(entry) == "a fixed Python loop took 1.12 CPU s before the run and 1.23 after"
    assert "1.12 CPU s" in suite_time.speed_sentence(entry)
    assert suite_time.speed_text({}) == suite_time.speed_sentence({}) == ""  # entries measured before the probe


def test_cpu_by_process_tells_the_sandboxes_the_warm_forks_and_new_interpreters_apart():
    """benchmarks/process_cpu.py's classes, on a tree as process accounting and its watcher see one:
    pytest's process and a build it forked ahead; a test worker and its warm process, whose fork is a
    command that starts a bwrap sandbox with a scorer, and a sweep's command started cold with its
    recording process."""
    from benchmarks import process_cpu as by

    python = ".venv/bin/python"
    accounting = by.ProcessCpu()
    tree = {  # pid: (name, CPU s, parent, forked, command line)
        10: ("python", 9.0, 1, False, f"{python} -m pytest"),
        11: ("python", 30.0, 10, False, f"{python} -u -c import sys;exec(eval(sys.stdin.readline()))"),
        12: ("python", 1.0, 11, True, ""),  # a test's own fork
        13: ("python", 60.0, 10, True, ""),  # a build ahead, forked by pytest's own process
        14: ("python", 20.0, 13, False, f"{python} -c import warm_anchor_runs"),  # the build's anchor runs
        20: ("python", 4.0, 11, False, f"{python} -c import warm_start; warm_start.serve(14, 15, 'python')"),
        21: ("python", 0.5, 20, True, ""),  # python -m mlrb, forked warm
        22: ("bwrap", 0.0, 21, False, "/usr/bin/bwrap --unshare-all -- python -I -m mlrb.scoring.worker r.json torch"),
        23: ("jemalloc_bg_thd", 5.0, 22, False, f"{python} -I -m mlrb.scoring.worker r.json torch"),
        24: ("python", 3.0, 22, False, ""),  # a python there the watcher missed: classed as an agent
        25: ("bwrap", 0.0, 21, False, "/usr/bin/bwrap --unshare-all -- python -m mlrb_agent"),  # an agent's sandbox
        26: ("python", 2.0, 25, False, ""),  # its python, whose command line the watcher missed
        30: ("python", 0.7, 11, False, f"{python} -m mlrb task=folder -m seed=1,2"),
        31: ("python", 2.5, 30, False, f"{python} -m mlrb.store.recording_process 3 6"),
        40: ("git", 0.1, 30, False, "git rev-parse HEAD"),
    }
    for pid, (comm, cpu_s, parent, forked, argv) in tree.items():
        accounting.processes[pid] = by.Process(comm, cpu_s, parent, forked, argv)
    kinds = accounting.kinds()
    assert kinds[by.TESTS] == {"processes": 3, "cpu_s": 40.0}
    assert kinds[by.WARM] == {"processes": 2, "cpu_s": 4.5} and kinds[by.BUILDS] == {"processes": 2, "cpu_s": 80.0}
    assert kinds[by.SCORERS] == {"processes": 1, "cpu_s": 5.0} and kinds[by.AGENTS] == {"processes": 2, "cpu_s": 5.0}
    assert kinds[by.COMMANDS]["cpu_s"] == 0.7 and kinds[by.RECORDING]["cpu_s"] == 2.5
    assert kinds[by.OTHER]["processes"] == 3  # the two bwrap processes and git
    assert kinds[by.COMMANDS]["processes"] == 1  # a scorer's or an agent's `-m mlrb...` is not a command
    assert sum(k["cpu_s"] for k in kinds.values()) == pytest.approx(sum(t[1] for t in tree.values()))


def test_a_kind_s_costliest_command_lines_are_counted_together_with_their_temporary_paths_folded():
    from benchmarks import process_cpu as by

    accounting = by.ProcessCpu()
    python = ".venv/bin/python"
    tree = {  # pid: (name, CPU s, parent, forked, command line)
        10: ("python", 1.0, 1, False, f"{python} -m mlrb task=folder"),
        11: ("python", 2.5, 10, False, f"{python} -m mlrb.store.recording_process 3 6"),
        20: ("python", 1.0, 1, False, f"{python} -m mlrb task=llm_merging"),
        21: ("python", 2.0, 20, False, f"{python} -m mlrb.store.recording_process 3 6"),
        30: ("python", 0.5, 1, False, f"{python} -m mlrb.sync /tmp/pytest-of-root/run-1/a"),
        31: ("python", 0.25, 1, False, f"{python} -m mlrb.sync /tmp/pytest-of-root/run-2/b"),
    }
    for pid, (comm, cpu_s, parent, forked, argv) in tree.items():
        accounting.processes[pid] = by.Process(comm, cpu_s, parent, forked, argv)
    assert accounting.commands(by.RECORDING) == [(4.5, 2, f"{python} -m mlrb.store.recording_process 3 6")]
    assert accounting.commands(by.COMMANDS, top=2) == [
        (1.0, 1, f"{python} -m mlrb task=folder"),
        (1.0, 1, f"{python} -m mlrb task=llm_merging"),
    ]
    assert (0.8, 2, f"{python} -m mlrb.sync /tmp/…") in accounting.commands(by.COMMANDS)


@pytest.mark.parametrize("argv", [["--top", "x", "--", "true"], ["true"], ["--"]])
def test_process_cpu_refuses_a_bad_command_line_in_one_message_before_it_counts_anything(argv, capsys):
    from benchmarks import process_cpu

    with pytest.raises(SystemExit) as exited:
        process_cpu.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m benchmarks.process_cpu [--top N] -- COMMAND...") and "Traceback" not in err
