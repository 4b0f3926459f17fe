"""The warm interpreter that runs the anchors' `python SCRIPT` commands at asset build
(mlrb/task_kit/warm_python.py): a script run warm must see and do what it would in a fresh
`python SCRIPT`, and whatever is not one plain python command must be left to bash."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import task_from_config
from mlrb.task_kit.warm_python import WarmPython, starter_imports
from mlrb.tasks.anchors import contents_digest
from mlrb.tasks.handling import solutions_of

# What a script sees of its process, written where it runs, so a warm run and a fresh one compare.
REPORTER = textwrap.dedent("""\
    import json, os, sys
    import numpy

    json.dump({"argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
               "seed": os.environ.get("MLRB_SEED"), "home": os.environ.get("HOME"),
               "hash": hash("same in every run"), "draw": numpy.random.random()}, open("seen.json", "w"))
    print("to stderr", file=sys.stderr)
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """)


def environment(workspace: Path, seed: int) -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workspace), "MLRB_SEED": str(seed),
            "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}  # fmt: skip


@pytest.fixture
def warm(tmp_path):
    with WarmPython(str(Path(sys.executable).parent / "python"), environment(tmp_path, 0), ["numpy", "json"],
                    tmp_path / "server") as server:  # fmt: skip
        assert server.ready
        yield server


def workspace(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "report.py").write_text(REPORTER)
    return folder


def seen(folder: Path) -> dict:
    import json

    return json.loads((folder / "seen.json").read_text())


@pytest.mark.fast
def test_a_script_run_warm_sees_what_a_fresh_python_shows_it(warm, tmp_path):
    fresh, hot = workspace(tmp_path, "fresh"), workspace(tmp_path, "warm")
    command = 'python report.py 0 "$MLRB_SEED"'
    cold = subprocess.run(["bash", "-c", command], cwd=fresh, env=environment(fresh, 7), capture_output=True, text=True)
    code, stderr = warm.run(command, hot, environment(hot, 7))
    assert (code, stderr) == (cold.returncode, cold.stderr) == (0, "to stderr\n")
    a, b = seen(fresh), seen(hot)
    for key in ("argv", "name", "seed", "hash"):
        assert a[key] == b[key], key
    assert a["argv"] == ["report.py", "0", "7"] and a["name"] == "__main__"
    for key in ("file", "path0", "cwd", "home"):  # the same, each in its own folder
        assert Path(a[key]).relative_to(fresh) == Path(b[key]).relative_to(hot), key
    assert Path(b["file"]) == hot / "report.py"


@pytest.mark.fast
def test_each_warm_run_draws_its_own_unseeded_numbers_as_fresh_processes_do(warm, tmp_path):
    draws = []
    for name in ("one", "two"):
        folder = workspace(tmp_path, name)
        assert warm.run("python report.py", folder, environment(folder, 0)) == (0, "to stderr\n")
        draws.append(seen(folder)["draw"])
    assert draws[0] != draws[1]


@pytest.mark.fast
def test_a_warm_run_fails_as_python_would(warm, tmp_path):
    folder = workspace(tmp_path, "failing")
    env = environment(folder, 0)
    assert warm.run("python report.py 3", folder, env)[0] == 3
    (folder / "raises.py").write_text("raise ValueError('no such model')\n")
    code, stderr = warm.run("python raises.py", folder, env)
    assert code == 1 and "ValueError: no such model" in stderr and "Traceback" in stderr
    (folder / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert warm.run("python killed.py", folder, env)[0] == 128 + 9  # as bash reports a signal
    (folder / "says.py").write_text("import sys\nsys.exit('no data at $MLRB_DATA')\n")
    assert warm.run("python says.py", folder, env) == (1, "no data at $MLRB_DATA\n")


@pytest.mark.fast
def test_an_interrupted_warm_run_is_killed_not_left_training(warm, tmp_path):
    import os
    import signal
    import time

    folder = workspace(tmp_path, "interrupted")
    (folder / "trains.py").write_text("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            warm.run("python trains.py", folder, environment(folder, 0))
    finally:
        signal.signal(signal.SIGALRM, previous)
    pid = int((folder / "pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # reaped by the server once killed
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the interrupted run (pid {pid}) is still running")


@pytest.mark.fast
def test_a_warm_run_ends_as_python_ends_a_script(warm, tmp_path):
    """Its exit handlers run, and what it wrote to a file it never closed is there."""
    folder = workspace(tmp_path, "ending")
    (folder / "ends.py").write_text(
        textwrap.dedent("""\
        import atexit
        log = open("log.txt", "w")
        log.write("written, never closed")
        atexit.register(lambda: open("exit.txt", "w").write("handled"))
        """)
    )
    assert warm.run("python ends.py", folder, environment(folder, 0)) == (0, "")
    assert (folder / "log.txt").read_text() == "written, never closed"
    assert (folder / "exit.txt").read_text() == "handled"


@pytest.mark.fast
@pytest.mark.parametrize("command", [
    "python report.py && echo done", "python report.py > out.txt", "python -u report.py", "FOO=1 python report.py",
    "python3 report.py", "python -m json.tool seen.json", "cd sub; python report.py", "python report.py $(echo 1)",
])  # fmt: skip
def test_anything_but_one_plain_python_command_is_left_to_bash(warm, tmp_path, command):
    folder = workspace(tmp_path, "shell")
    assert warm.run(command, folder, environment(folder, 0)) is None
    assert not (folder / "seen.json").exists()


@pytest.mark.fast
def test_another_python_on_the_path_is_left_to_bash(warm, tmp_path):
    folder = workspace(tmp_path, "other")
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python").symlink_to(sys.executable)
    assert warm.run("python report.py", folder, {**environment(folder, 0), "PATH": f"{other}:/usr/bin"}) is None


@pytest.mark.fast
def test_a_server_that_cannot_start_leaves_every_command_to_bash(tmp_path):
    folder = workspace(tmp_path, "nowhere")
    with WarmPython("/bin/false", environment(folder, 0), [], tmp_path / "server") as server:
        assert not server.ready
        assert server.run("python report.py", folder, environment(folder, 0)) is None


@pytest.mark.fast
def test_a_server_gone_mid_build_is_an_error_that_says_what_it_wrote(tmp_path):
    folder = workspace(tmp_path, "gone")
    with WarmPython(
        str(Path(sys.executable).parent / "python"), environment(folder, 0), [], tmp_path / "server"
    ) as server:
        assert server.ready
        server.log.write_text("MemoryError while importing\n")  # as a server that died would leave it
        server.server.kill()
        server.server.wait()
        with pytest.raises(RuntimeError, match=r"could not run `python report.py` .*: MemoryError while importing$"):
            server.run("python report.py", folder, environment(folder, 0))


@pytest.mark.fast
def test_the_starters_imports_are_preloaded_but_not_their_own_modules(tmp_path):
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""\
        from __future__ import annotations
        import json, torch
        from transformers import AutoTokenizer, GPT2LMHeadModel
        from helpers import tidy
        from . import sibling
        import data.loader
        def main():
            import peft  # not at the top: not preloaded
        """)
    )
    (tmp_path / "helpers.py").write_text("def tidy(): pass\n")
    (tmp_path / "data").mkdir()
    assert starter_imports(tmp_path) == ["json", "torch", "transformers:AutoTokenizer", "transformers:GPT2LMHeadModel"]


@pytest.mark.fast
def test_what_a_run_imports_from_the_libraries_is_imported_for_the_runs_after_it_but_not_its_own_files(warm, tmp_path):
    """A module a run imports as it goes (an Auto class's model, say) is found imported by the next
    run; the run's own modules, and those of a folder its script is in, never are."""
    script = textwrap.dedent("""\
        import json, sys
        json.dump({name: name in sys.modules for name in ("email.mime.text", "helper")}, open("seen.json", "w"))
        import email.mime.text, helper
        """)
    for name in ("first", "second"):
        folder = workspace(tmp_path, name)
        (folder / "lazy.py").write_text(script)
        (folder / "helper.py").write_text("VALUE = 1\n")
        assert warm.run("python lazy.py", folder, environment(folder, 0)) == (0, "")
    assert seen(tmp_path / "first") == {"email.mime.text": False, "helper": False}
    assert seen(tmp_path / "second") == {"email.mime.text": True, "helper": False}


@pytest.mark.integration
def test_a_training_run_warm_writes_the_bytes_a_fresh_one_writes(cache_dir, tmp_path):
    """baby_lm's baseline (a GPT-2 initialised from the seed and trained on the public text), cut
    to a few steps: the model the warm interpreter saves is byte for byte the fresh run's."""
    from mlrb.harness.assets import ensure_assets

    task = task_from_config("baby_lm", scale="plumbing")
    assets = ensure_assets(task, cache_dir)
    command = task.spec.baseline_command + " --max-steps 5"
    solutions = solutions_of(task, assets / "public")
    fresh = solutions.run(command, tmp_path / "fresh", seed=1)
    with solutions.warm() as warm:
        assert warm.arguments(command, tmp_path, solutions.environment_for(tmp_path, 1))
        hot = solutions.run(command, tmp_path / "warm", seed=1, warm=warm)
    submission = task.cfg.submission
    assert (hot / submission / "model.safetensors").stat().st_size > 0
    assert contents_digest(hot / submission) == contents_digest(fresh / submission)


@pytest.mark.integration
def test_llm_merging_s_calibration_merges_warm_to_the_bytes_of_a_fresh_merge(cache_dir, tmp_path):
    """llm_merging's calibration runs the starter's merge.py in a warm interpreter (its own, not
    the anchors' commands): the merged model is byte for byte the one a new interpreter writes."""
    import shlex

    from conftest import plumbing_llm_merging
    from mlrb.harness.assets import ensure_assets
    from mlrb.tasks.base import scale_spec
    from mlrb.tasks.llm_merging.task import LlmMerging, LlmMergingScale, merge_environment

    task = plumbing_llm_merging()
    public = ensure_assets(task, cache_dir) / "public"
    code = LlmMerging(scale_spec(task.cfg, LlmMergingScale), task.cfg.higher_is_better, task.start.starter)
    n = len([d for d in (public / "adapters").iterdir() if d.is_dir()])
    weights = [1.0 / n] * n
    fresh = code.merge(public, tmp_path / "fresh", weights)
    with code.warm_merges(tmp_path / "scratch") as warm:
        assert warm is not None
        command = shlex.join(["python", str(task.start.starter / "merge.py"), "--data", str(public)])
        assert warm.arguments(command, tmp_path, merge_environment())  # run warm, not left to a new python
        hot = code.merge(public, tmp_path / "warm", weights, warm)
    assert (hot / "model.safetensors").read_bytes() == (fresh / "model.safetensors").read_bytes()
    assert sorted(p.name for p in hot.iterdir()) == sorted(p.name for p in fresh.iterdir())


@pytest.mark.fast
def test_llm_merging_merges_in_a_new_interpreter_where_python_on_the_path_is_another_folder_s(tmp_path, monkeypatch):
    """An interpreter with no `python` beside it (a system python3, say): the first `python` on
    PATH may be another environment's link to the same binary, with other libraries. Calibration
    then merges in new interpreters of its own, as before."""
    import os
    import sys

    from conftest import plumbing_llm_merging
    from mlrb.tasks.base import scale_spec
    from mlrb.tasks.llm_merging.task import LlmMerging, LlmMergingScale

    alone, other = tmp_path / "alone", tmp_path / "other-env"
    alone.mkdir(), other.mkdir()
    (alone / "python3").symlink_to(sys.executable)
    (other / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(alone / "python3"))
    monkeypatch.setenv("PATH", f"{other}:{os.environ['PATH']}")
    task = plumbing_llm_merging()
    code = LlmMerging(scale_spec(task.cfg, LlmMergingScale), task.cfg.higher_is_better, task.start.starter)
    with code.warm_merges(tmp_path / "scratch") as warm:
        assert warm is None
