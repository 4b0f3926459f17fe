"""install.sh installs without compiling (uv's default) and compiles only what runs import
(mlrb/core/bytecode.py): the list must hold what the sandboxed processes import, which find the
environment read-only and would otherwise compile those modules at every import."""

from __future__ import annotations

import subprocess
import sys

import pytest

from build_ahead import TINY_TASKS
from conftest import REPO, task_from_config
from mlrb.core.bytecode import RUN_IMPORTS, sides
from mlrb.scoring import lmeval
from mlrb.task_kit.warm_python import starter_imports

pytestmark = pytest.mark.fast


def test_what_scorers_and_starter_scripts_import_is_compiled_at_install():
    compiled = set(RUN_IMPORTS)
    assert set(lmeval.IMPORTS) <= compiled
    for key in TINY_TASKS:
        task = task_from_config(key)
        assert set(task.judge.imports) <= compiled, key
        # the starters' third-party libraries (the standard library's bytecode ships with Python)
        assert task.start.starter.is_dir(), key
        libraries = {name.split(":")[0] for name in starter_imports(task.start.starter)}
        third_party = {name for name in libraries if name.split(".")[0] not in sys.stdlib_module_names}
        assert third_party <= compiled, (key, third_party - compiled)
    script = (REPO / "install.sh").read_text()
    assert "uv pip install" in script and "-m mlrb.core.bytecode" in script
    assert "--compile-bytecode" not in script and "UV_COMPILE_BYTECODE" not in script


def test_the_bytecode_of_an_imported_module_is_written_even_where_python_writes_none(tmp_path):
    (tmp_path / "probe_module.py").write_text("VALUE = 1\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from mlrb.core.bytecode import compile_imports; "
        "print(compile_imports(['probe_module']))"
    )
    result = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=REPO)  # -B: none
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 1
    assert list((tmp_path / "__pycache__").glob("probe_module.*.pyc"))
    again = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert int(again.stdout) < int(result.stdout)  # what has its bytecode is left as it is


def test_the_two_sides_are_every_run_import_and_are_compiled_in_processes_of_their_own(tmp_path):
    harness, models = sides(RUN_IMPORTS)
    assert harness and models and sorted(harness + models) == sorted(RUN_IMPORTS)
    assert "mlflow" in harness and "anthropic" in harness and "torch" in models and "lm_eval.evaluator" in models
    # Two modules, one a side, each imported and compiled in a process forked for it (that the two
    # run at once shows in an install's time, not here).
    for name in ("probe_one", "probe_two"):
        (tmp_path / f"{name}.py").write_text(
            f"import os, pathlib\npathlib.Path({str(tmp_path / name)!r} + '.pid').write_text(str(os.getpid()))\n"
        )
    code = (
        f"import os, sys; sys.path.insert(0, {str(tmp_path)!r}); import mlrb.core.bytecode as b; "
        "b.HARNESS_SIDE = ('probe_one',); print(b.compile_side_by_side(['probe_one', 'probe_two']), os.getpid())"
    )
    result = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    written, parent = result.stdout.split()
    assert int(written) == 2
    assert parent not in {(tmp_path / f"{name}.pid").read_text() for name in ("probe_one", "probe_two")}
    assert {path.name.split(".")[0] for path in (tmp_path / "__pycache__").glob("*.pyc")} == {"probe_one", "probe_two"}
