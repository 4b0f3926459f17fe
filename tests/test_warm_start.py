"""The tests' warm start (tests/warm_start.py): a command forked from the warm process ends,
prints and exits as the same command in a new interpreter does, and commands whose fork
could differ start as a new interpreter."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warm_start

PROBE = """
import atexit, json, os, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True))).start()
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "path0": sys.path[0], "env": os.environ.get("PROBE_VALUE"),
                  "stdin": sys.stdin.read(), "name": __name__}))
print("to stderr\\r\\nand on", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("the probe's error")
if sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


def both(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """`python -m probe ARGS` from tmp_path, warm, then in a new interpreter."""
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**warm_start.STARTING_ENV, "PROBE_VALUE": "given"}
    assert warm_start.warm_enough(tmp_path, env)
    warm = warm_start.run("probe", list(args), tmp_path, env, 60)
    cold = subprocess.run([sys.executable, "-m", "probe", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    return warm, cold


@pytest.mark.fast
@pytest.mark.parametrize("args", [["0", "x y"], ["3"], ["a message"], ["raise"], ["interrupt"]])
def test_a_warm_command_exits_prints_and_ends_as_a_new_interpreter_does(tmp_path, args):
    warm, cold = both(tmp_path, *args)
    assert warm.returncode == cold.returncode
    assert warm.stdout == cold.stdout
    assert warm.stderr == cold.stderr  # a traceback too, frame by frame
    facts = json.loads(warm.stdout.splitlines()[0])
    assert facts == {"argv": args, "cwd": str(tmp_path), "path0": str(tmp_path), "env": "given", "stdin": "",
                     "name": "__main__"}  # fmt: skip
    if args[0] not in ("raise", "interrupt"):
        assert warm.stdout.splitlines()[1:] == ["thread joined", "atexit ran"]
    assert "to stderr\nand on\n" in warm.stderr  # text as subprocess gives it: universal newlines


@pytest.mark.fast
def test_a_warm_command_is_a_fork_that_has_the_imports_made(tmp_path):
    """The point of it: the command finds MLflow and the Anthropic SDK imported."""
    (tmp_path / "probe.py").write_text(
        "import sys; print(sorted(m for m in ('anthropic', 'mlflow') if m in sys.modules))"
    )
    warm = warm_start.run("probe", [], tmp_path, dict(warm_start.STARTING_ENV), 60)
    assert warm.stdout.strip() == "['anthropic', 'mlflow']", warm.stderr


@pytest.mark.fast
def test_a_warm_command_past_its_timeout_is_killed_as_subprocess_run_kills_it(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        warm_start.run("probe", ["sleep"], tmp_path, dict(warm_start.STARTING_ENV), 3)
    assert b'"argv": ["sleep"]' in raised.value.output


@pytest.mark.fast
def test_commands_start_as_a_new_interpreter_where_a_fork_could_differ(tmp_path):
    env = dict(warm_start.STARTING_ENV)  # the test process's own may hold what earlier tests left
    # read when they are used: set by the test, or left by mlrb or torch called in the test process
    assert warm_start.warm_enough(tmp_path, {**env, "ANTHROPIC_BASE_URL": "http://127.0.0.1:1"})
    assert warm_start.warm_enough(tmp_path, {**env, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"})
    assert warm_start.warm_enough(tmp_path, {**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert warm_start.warm_enough(tmp_path, {**env, "HF_HOME": str(tmp_path)})  # read by the hub, which it imports
    assert warm_start.warm_enough(tmp_path, {k: v for k, v in env.items() if k != "HF_HUB_OFFLINE"})
    assert not warm_start.warm_enough(tmp_path, {**env, "MLFLOW_CONFIGURE_LOGGING": "false"})  # read on import
    assert not warm_start.warm_enough(tmp_path, {**env, "PYTHONPATH": str(tmp_path)})
    assert not warm_start.warm_enough(tmp_path, {**env, "HOME": str(tmp_path)})
    assert not warm_start.warm_enough(tmp_path, {**env, "OMP_NUM_THREADS": "7"})  # numpy's, imported
    (tmp_path / "mlrb").mkdir()
    (tmp_path / "mlrb" / "__init__.py").write_text("")  # a clone of its own: `python -m mlrb` imports that one
    assert not warm_start.warm_enough(tmp_path, env)
    assert warm_start.warm_enough(Path(warm_start.TESTS).parent, env)  # this checkout's own root


def venv_first_on_path() -> dict[str, str]:
    """The warm process's environment, where `python` is this venv's."""
    return {**warm_start.STARTING_ENV, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}


def in_bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.mark.fast
@pytest.mark.parametrize("args", [["0", "x y"], ["3"], ["raise"], ["interrupt"]])
def test_python_on_path_runs_python_m_mlrb_warm_and_as_a_new_interpreter_would(tmp_path, args):
    """Written in bash, as a page shows it: `python -m mlrb... ARGS` is forked from the warm process
    and exits and prints as the venv's python in a new interpreter does."""
    (tmp_path / "mlrb_probe.py").write_text(PROBE)
    env = {**venv_first_on_path(), "PROBE_VALUE": "given"}
    shown = warm_start.python_on_path(env)
    assert shown["PATH"] != env["PATH"] and shown["PATH"].endswith(env["PATH"])
    words = " ".join(f"'{a}'" for a in args)
    warm = in_bash(f"python -m mlrb_probe {words}", tmp_path, shown)
    cold = in_bash(f"python -m mlrb_probe {words}", tmp_path, env)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert json.loads(warm.stdout.splitlines()[0])["argv"] == args


@pytest.mark.fast
def test_python_on_path_forks_with_mlflow_imported_and_starts_cold_where_a_fork_could_differ(tmp_path):
    (tmp_path / "mlrb_probe.py").write_text("import sys; print('mlflow' in sys.modules)")
    env = venv_first_on_path()
    warm = in_bash("python -m mlrb_probe", tmp_path, warm_start.python_on_path(env))
    assert warm.stdout.strip() == "True", warm.stderr
    # anything but `python -m mlrb...` is the venv's python itself
    other = in_bash("python -c 'import sys; print(\"mlflow\" in sys.modules, sys.prefix)'", tmp_path,
                    warm_start.python_on_path(env))  # fmt: skip
    assert other.stdout.split() == ["False", sys.prefix], other.stderr
    # what numpy reads as it is imported differs: a new interpreter
    differs = in_bash("python -m mlrb_probe", tmp_path, warm_start.python_on_path({**env, "OMP_NUM_THREADS": "7"}))
    assert differs.stdout.strip() == "False", differs.stderr


@pytest.mark.fast
def test_a_local_sweep_job_started_by_a_warm_command_is_forked_warm_too(tmp_path):
    """submitit's local executor starts a job as `PYTHON -u -m submitit.core._submit FOLDER`; in a
    warm command that `python` is python_on_path()'s, so the job finds MLflow imported."""
    (tmp_path / "mlrb_probe.py").write_text(
        "import sys, submitit\n"
        "def where():\n"
        "    import os, sys\n"
        "    print('from the job', flush=True)\n"
        "    return 'mlflow' in sys.modules, os.environ['SUBMITIT_EXECUTOR']\n"
        "executor = submitit.LocalExecutor(folder=sys.argv[1])\n"
        "executor.update_parameters(timeout_min=2)\n"
        "job = executor.submit(where)\n"
        "print(job.result(), 'from the job' in job.stdout())\n"
    )
    env = dict(warm_start.STARTING_ENV)
    warm = warm_start.run("mlrb_probe", [str(tmp_path / "jobs")], tmp_path, env, 120)
    assert warm.stdout.strip() == "(True, 'local') True", warm.stderr[-2000:]
    cold = subprocess.run([sys.executable, "-m", "mlrb_probe", str(tmp_path / "cold")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cold.stdout.strip() == "(False, 'local') True", cold.stderr[-2000:]


@pytest.mark.fast
def test_python_on_path_passes_on_its_signals_and_a_kill_takes_its_command_with_it(tmp_path):
    (tmp_path / "mlrb_probe.py").write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda *_: sys.exit(7))\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    )
    env = warm_start.python_on_path(venv_first_on_path())

    def started(name: str) -> tuple[subprocess.Popen, int]:
        pid_file = tmp_path / name
        program = subprocess.Popen(["bash", "-c", f"exec python -m mlrb_probe {pid_file}"], cwd=tmp_path, env=env)
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        command = int(pid_file.read_text())
        assert command != program.pid  # a fork of the warm process, not the program itself
        return program, command

    program, _ = started("usr2")
    program.send_signal(signal.SIGUSR2)  # as submitit's controller warns a job of its time limit
    assert program.wait(30) == 7
    program, command = started("kill")
    program.kill()
    program.wait(30)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{command}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{command}").exists()
