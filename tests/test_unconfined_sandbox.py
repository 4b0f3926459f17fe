"""The unconfined sandbox: plain subprocesses, a scrubbed environment, timeouts that kill
whole process groups. (What confinement adds is tested in test_bwrap_sandbox.py.)"""

from __future__ import annotations

import os
import socket
import time

import pytest

from mlrb.core.config import SandboxConfig
from mlrb.sandbox.base import Limits
from mlrb.sandbox.unconfined import UnconfinedSandbox

pytestmark = pytest.mark.fast


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_test_secret")
    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    cfg = SandboxConfig(kind="unconfined", command_timeout_s=30)
    box = UnconfinedSandbox(cfg, tmp_path / "ws", tmp_path / "data", "run1", Limits(), seed=7)
    yield box
    box.close()


def test_commands_run_in_the_workspace_without_the_harness_secrets(sandbox, tmp_path):
    result = sandbox.exec("pwd; env", timeout_s=10)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == str((tmp_path / "ws").resolve())
    assert "secret" not in result.stdout
    assert f"MLRB_DATA={(tmp_path / 'data').resolve()}" in result.stdout
    assert "MLRB_SEED=7" in result.stdout.splitlines()  # the run's seed, for the task's scripts
    # the harness's Python (and its ML stack) is the sandbox's `python`
    assert sandbox.exec("python -c 'import torch; print(1)'", timeout_s=60).stdout.strip() == "1"


def test_a_timeout_kills_the_command_and_its_children(sandbox, tmp_path):
    marker = tmp_path / "ws" / "late"
    started = time.monotonic()
    result = sandbox.exec(f"(sleep 3; touch {marker}) & sleep 30", timeout_s=1)
    assert result.timed_out and time.monotonic() - started < 10
    time.sleep(3.5)
    assert not marker.exists()  # the background child died with its group


def test_file_tools_stay_inside_the_workspace(sandbox, tmp_path):
    sandbox.write_file("sub/a.txt", "hello")
    assert sandbox.read_file("sub/a.txt") == "hello"
    with pytest.raises(PermissionError):
        sandbox.write_file("../escape.txt", "x")
    with pytest.raises(PermissionError):
        sandbox.read_file("/etc/passwd")
    assert not (tmp_path / "escape.txt").exists()


def test_long_output_is_truncated_with_a_marker(sandbox):
    result = sandbox.exec("python -c \"print('x' * 2_000_000)\"", timeout_s=30)
    assert "output truncated" in result.stdout
    assert len(result.stdout) < 1_100_000
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-ant-test-secret"  # the harness keeps its own


def test_unconfined_means_unconfined(sandbox, tmp_path):
    """What the name says: files outside the workspace and the host's loopback are reachable."""
    (tmp_path / "hidden.txt").write_text("answers")
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        port = listener.getsockname()[1]
        assert sandbox.exec(f"cat {tmp_path / 'hidden.txt'}", timeout_s=10).stdout == "answers"
        connect = f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\""
        assert sandbox.exec(connect, timeout_s=30).exit_code == 0
    finally:
        listener.close()
