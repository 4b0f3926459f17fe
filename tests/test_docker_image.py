"""`sandbox=docker` on a machine without the sandbox image: the first run builds it."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import mlflow_client, run_cli, store_args
from test_docker_sandbox import needs_docker

pytestmark = pytest.mark.system


@needs_docker
def test_the_first_docker_run_builds_the_missing_image_and_runs(tmp_path, built_cache):
    image = f"mlrb-sandbox-first-use-{os.getpid()}:latest"  # a name no other run uses: it is missing
    assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0
    try:
        result = run_cli(
            "sandbox=docker", f"sandbox.options.image={image}", "task.scales.tiny.baseline_command='echo hello'",
            *store_args(tmp_path, built_cache), cwd=tmp_path, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        out = result.stdout
        assert f"mlrb: sandbox image '{image}' not found: building it now" in out
        assert f"built {image}" in out and f"mlrb: built '{image}'" in out  # the build script's own lines, then ours
        assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
        client = mlflow_client(tmp_path)
        (run,) = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
        assert run.info.status == "FINISHED" and run.data.params["sandbox.options.image"] == image
    finally:
        subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True)
