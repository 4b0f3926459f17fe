"""benchmarks/gpu_check.py is the GPU check a CUDA machine runs (the tiny tasks' evaluation on
cpu and on cuda side by side, a run given no GPU, the full-scale stand-ins on cuda). No GPU
here: its dry run (--device cpu) goes through the same runs and tables with cpu for cuda, so
the script is known to work when a GPU machine runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, tiny_llm_merging
from mlrb.assets import ensure_assets

pytestmark = pytest.mark.slow


def test_the_gpu_checks_dry_run_scores_both_sides_and_the_full_stand_in(built_cache, tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--tasks", "llm_merging",
         "--work", str(tmp_path / "work"), "--cache-dir", str(built_cache), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(out.read_text())
    tiny = found["tiny"]["llm_merging"]
    for side in ("cpu", "device"):
        assert tiny[side]["status"] == "ok" and tiny[side]["valid"] == "True", tiny[side]
    # The default task's baseline, as its assets measured it when built on this machine (the
    # figure moves by an item or two between CPUs: 0.5500, 0.5625, 0.5833 seen).
    task = tiny_llm_merging()
    baseline = task.calibration(ensure_assets(task, built_cache))["baseline_score"]
    assert tiny["cpu"]["score"] == tiny["device"]["score"] == pytest.approx(baseline, abs=1e-9)
    assert tiny["score_difference"] == 0.0
    assert "pinning: skipped" in proc.stdout and "pinning" not in found
    full = found["full"]["llm_merging"]
    assert full["status"] == "ok" and full["valid"] == "True" and full["score"] is not None, full
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("llm_merging") and "ok/ok" in line)
    assert f"{baseline:.4f}" in row


def test_the_gpu_check_refuses_without_a_gpu_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "sees no CUDA GPU here (use --device cpu to dry-run)" in proc.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())  # nothing run, nothing written
