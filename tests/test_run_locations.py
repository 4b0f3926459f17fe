"""The default run works wherever a user runs it from: the run's folders inside the source tree
(and so inside the venv's parent folder), or under the system's temp folder on a path with spaces
reached through a link, with the asset cache on another filesystem. tests/test_newcomer.py runs
it from a fresh clone's root; tests/test_mount_order.py checks the mounts behind this. Their task is
incidental: they run the cheapest real task (conftest's HARNESS_TASK) with the baseline agent."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, REPO, harness_task, run_cli
from mlrb.harness.assets import asset_dir, ensure_assets

pytestmark = pytest.mark.integration

OTHER_FILESYSTEM = Path("/dev/shm")  # a tmpfs on Linux


def assert_one_valid_finished_run(cwd: Path, result) -> None:
    from mlflow.tracking import MlflowClient

    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{HARNESS_EXPERIMENT}/baseline/smoke/0: score " in result.stdout and "(valid); status ok" in result.stdout
    client = MlflowClient(f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["mlrb.valid"] == "True"
    assert (cwd / "outputs" / "runs").is_dir()


@pytest.mark.skipif(not OTHER_FILESYSTEM.is_dir(), reason="needs /dev/shm, a second filesystem")
def test_a_path_with_spaces_through_a_link_with_the_cache_on_another_filesystem(tmp_path, cache_dir):
    real = tmp_path / "real folder with spaces"
    real.mkdir()
    (tmp_path / "my runs").symlink_to(real)
    cwd = tmp_path / "my runs"
    cache = Path(tempfile.mkdtemp(prefix="mlrb cache ", dir=OTHER_FILESYSTEM))
    try:
        assert cache.stat().st_dev != cwd.stat().st_dev
        task = harness_task()
        ensure_assets(task, cache_dir)  # built in the session's cache, then copied as they are
        assets = asset_dir(task, cache_dir)
        shutil.copytree(assets, cache / assets.relative_to(cache_dir), symlinks=True)
        result = run_cli(*HARNESS_TASK, f"paths.cache_dir='{cache}'", cwd=cwd, env={"HOME": str(tmp_path)})
        assert_one_valid_finished_run(cwd, result)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.skipif(
    Path(sys.prefix).parent != REPO, reason="the venv of this checkout is elsewhere; test_newcomer.py runs it in a clone"
)  # fmt: skip
def test_inside_the_source_tree_beside_the_venv(cache_dir):
    """The editable install's package is shown read-only to the scorer; the run's own folders in the
    same tree stay writable."""
    cwd = Path(tempfile.mkdtemp(prefix=".test-run-", dir=REPO))
    try:
        result = run_cli(*HARNESS_TASK, f"paths.cache_dir={cache_dir}", cwd=cwd)
        assert_one_valid_finished_run(cwd, result)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
