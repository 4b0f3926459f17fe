"""A user's own config folder adds tasks, agents and budgets without editing the package."""

from __future__ import annotations

import pytest

from conftest import run_cli

pytestmark = pytest.mark.fast

SMALL_MERGING = """\
# my_merging: llm_merging, scored on 20 questions only
defaults:
  - llm_merging
  - _self_
scales:
  tiny:
    eval:
      limit: 20
"""

QUICK_BUDGET = """\
name: quick
wall_time_s: 120
max_steps: 5
max_input_tokens: 10000
max_output_tokens: 1000
max_usd: 0.05
"""


def user_config(tmp_path):
    folder = tmp_path / "my-configs"
    (folder / "task").mkdir(parents=True)
    (folder / "budget").mkdir()
    (folder / "task" / "my_merging.yaml").write_text(SMALL_MERGING)
    (folder / "budget" / "quick.yaml").write_text(QUICK_BUDGET)
    return folder


def test_a_config_folder_adds_a_task_and_a_budget(tmp_path):
    folder = user_config(tmp_path)
    result = run_cli("task=my_merging", "budget=quick", "--config-dir", str(folder), "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "name: llm_merging" in result.stdout and "limit: 20" in result.stdout
    assert "name: quick" in result.stdout and "wall_time_s: 120" in result.stdout

    listed = run_cli("--config-dir", str(folder), "--help", cwd=tmp_path)
    assert "my_merging" in listed.stdout and "quick" in listed.stdout


def test_the_added_choices_are_validated_like_the_packaged_ones(tmp_path):
    folder = user_config(tmp_path)
    (folder / "budget" / "broken.yaml").write_text(QUICK_BUDGET.replace("wall_time_s: 120", "wall_time_s: -1"))
    result = run_cli("budget=broken", "--config-dir", str(folder), cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "mlrb: error: budget.wall_time_s must be positive, got -1.0: give a finite number above 0"
    )
    unknown = run_cli("budget=quik", "--config-dir", str(folder), cwd=tmp_path)
    assert unknown.returncode == 2 and "valid choices: 1h, 24h, broken, paper, quick, smoke" in unknown.stderr


def test_a_missing_config_folder_is_one_line(tmp_path):
    result = run_cli("--config-dir", str(tmp_path / "nope"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"mlrb: error: --config-dir {tmp_path / 'nope'}: no such folder"
