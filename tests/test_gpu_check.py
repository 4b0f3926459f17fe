"""benchmarks/gpu_check.py is the GPU check a CUDA machine runs (the tiny tasks' evaluation on
cpu and on cuda side by side, a run given no GPU, the full-scale stand-ins on cuda). No GPU
here: its dry run (--device cpu) goes through the same runs and tables with cpu for cuda, so
the script is known to work when a GPU machine runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from benchmarks import gpu_check
from conftest import REPO, kept_mirror, tiny_llm_merging
from mlrb.harness.assets import ensure_assets
from test_full_scale import EVAL_TASKS


def tiny_pair(cpu_score, device_score, cpu_valid="True", device_valid="True") -> dict:
    """One tiny task's two runs as the script records them."""
    runs = {"cpu": {"status": "ok", "valid": cpu_valid, "score": cpu_score},
            "device": {"status": "ok", "valid": device_valid, "score": device_score}}  # fmt: skip
    scores = (cpu_score, device_score)
    return {**runs, "score_difference": abs(scores[0] - scores[1]) if None not in scores else None}


@pytest.mark.fast
def test_a_device_that_disagrees_with_the_cpu_fails_the_check():
    # A dry run compares cpu with cpu, so it cannot show a mismatch: fed one, the check must name it.
    failed_checks = gpu_check.failed_checks
    assert failed_checks({"tiny": {"llm_merging": tiny_pair(0.5625, 0.5625)}}) == []
    assert failed_checks({"tiny": {"llm_merging": tiny_pair(0.5625, 0.5667)}}) == []  # one item flipped of 240
    (line,) = failed_checks({"tiny": {"llm_merging": tiny_pair(0.5625, 0.45)}})
    assert line.startswith("tiny llm_merging: score 0.5625 on cpu, 0.4500 on the device")
    assert failed_checks({"tiny": {"math_reasoning": tiny_pair(31.0, 31.5)}}) == []  # BLEU: 0-100
    assert failed_checks({"tiny": {"math_reasoning": tiny_pair(31.0, 33.0)}}) != []
    invalid_on_device = failed_checks({"tiny": {"baby_lm": tiny_pair(0.6, None, device_valid="False")}})
    assert "tiny baby_lm: valid True on cpu, False on the device" in invalid_on_device
    failed = {"status": "infra_error", "valid": None, "score": None}
    assert failed_checks({"tiny": {"baby_lm": {**tiny_pair(None, None), "device": failed}}})
    assert failed_checks({"pinning": {"scorer_kept_off_the_gpu": False}})
    assert failed_checks({"full": {"baby_lm": {"status": "ok", "valid": "False"}}})


@pytest.mark.fast
def test_the_gpu_check_exits_1_naming_a_mismatch(tmp_path, monkeypatch, capsys):
    # The tiny part's runs stood in for: the device scores well below the cpu.
    monkeypatch.setattr(gpu_check, "tiny_part", lambda *args: {"llm_merging": tiny_pair(0.5625, 0.45)})
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--parts", "tiny", "--tasks", "llm_merging",
                                      "--work", str(tmp_path), "--out", str(tmp_path / "out.json")])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        gpu_check.main()
    assert exited.value.code == 1
    assert "FAILED: tiny llm_merging: score 0.5625 on cpu, 0.4500 on the device" in capsys.readouterr().err
    assert json.loads((tmp_path / "out.json").read_text())["tiny"]["llm_merging"]["score_difference"] > 0.1


@pytest.mark.system
def test_the_gpu_checks_dry_run_scores_both_sides_and_the_full_stand_in(built_cache, tmp_path):
    out = tmp_path / "gpu_check.json"
    # The script keeps its stand-in mirror in --work between calls; it is given the one the test
    # cache keeps (the same build_mirror's, tests/hub_mirror.py) instead of building its own.
    shutil.copytree(kept_mirror(EVAL_TASKS), tmp_path / "work" / "hf_home", symlinks=True)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--tasks", "llm_merging",
         "--work", str(tmp_path / "work"), "--cache-dir", str(built_cache), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr  # cpu against cpu: every check passes
    assert "FAILED" not in proc.stderr
    found = json.loads(out.read_text())
    tiny = found["tiny"]["llm_merging"]
    for side in ("cpu", "device"):
        assert tiny[side]["status"] == "ok" and tiny[side]["valid"] == "True", tiny[side]
    # The default task's baseline, as its assets measured it when built on this machine (the
    # figure moves by an item or two between CPUs: 0.5500, 0.5625, 0.5833 seen).
    task = tiny_llm_merging()
    baseline = task.anchors.read(ensure_assets(task, built_cache))["baseline_score"]
    assert tiny["cpu"]["score"] == tiny["device"]["score"] == pytest.approx(baseline, abs=1e-9)
    assert tiny["score_difference"] == 0.0
    assert "pinning: skipped" in proc.stdout and "pinning" not in found
    full = found["full"]["llm_merging"]
    assert full["status"] == "ok" and full["valid"] == "True" and full["score"] is not None, full
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("llm_merging") and "ok/ok" in line)
    assert f"{baseline:.4f}" in row


@pytest.mark.integration
def test_the_gpu_check_refuses_without_a_gpu_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--work", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert "sees no CUDA GPU here (use --device cpu to dry-run)" in proc.stderr.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())  # nothing run, nothing written
