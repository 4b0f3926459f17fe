"""A quiet console by default (mlrb's own lines and the result), the run's log file
complete; MLflow's telemetry off unless the user turns it on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import PLUMBING, run_cli

PROBE = (
    "import os, sys\n"
    "from mlrb.cli import main\n"
    "try:\n    main(['--cfg', 'job'])\nexcept SystemExit:\n    pass\n"
    "print('TELEMETRY_DISABLED', os.environ.get('MLFLOW_DISABLE_TELEMETRY'))\n"
)


@pytest.mark.fast
@pytest.mark.parametrize("users_setting, expected", [(None, "true"), ("false", "false")])
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on(tmp_path, users_setting, expected):
    env = {k: v for k, v in __import__("os").environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    if users_setting is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = users_setting
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert f"TELEMETRY_DISABLED {expected}" in out.stdout, out.stderr[-2000:]


@pytest.mark.integration
def test_a_run_keeps_library_noise_in_its_log_files(tmp_path, plumbing_cache):
    # From a folder that is not a git checkout.
    # (A first run's asset build and its noise: tests/test_newcomer.py, from an empty cache.)
    result = run_cli(PLUMBING, cwd=tmp_path, env={"MLRB_CACHE_DIR": str(plumbing_cache)}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    console = (result.stdout + result.stderr).splitlines()
    assert console[-1].startswith("llm_merging/baseline/smoke/0: score ")
    noise = [line for line in console[:-1] if "][mlrb." not in line]
    assert noise == [], f"the console shows more than mlrb's own lines: {noise[:5]}"
    assert result.stderr == ""

    (run,) = (tmp_path / "outputs" / "runs").glob("*")
    assert "agent ended" in (run / "mlrb.log").read_text()  # mlrb's own lines
    scorer = (run / "scoring" / "scorer.log").read_text()
    assert "Running loglikelihood requests" in scorer and "it/s]" in scorer  # lm-eval's progress bars
    assert "Loading weights" in scorer  # transformers' own
