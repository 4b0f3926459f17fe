"""The docker sandbox: what is asked of Docker, and each escape an agent might try.

Tests that need a Docker engine and the sandbox image skip with the reason when
those are missing (a laptop); under CI a skip fails the run (see conftest.py).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mlrb.core.config import ConfigError, SandboxConfig
from mlrb.sandbox import docker as ds
from mlrb.sandbox.base import Limits

IMAGE = "mlrb-sandbox:latest"


@functools.cache  # asked once per test session
def docker_problem() -> str:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(IMAGE)
    except Exception as e:  # any failure means: cannot run these tests here
        return f"needs a running Docker engine and the image {IMAGE} (bash docker/build.sh): {str(e)[:120]}"
    return ""


needs_docker = pytest.mark.skipif(bool(docker_problem()), reason=docker_problem() or "docker ok")


# ---- what is requested of Docker (no engine needed) -------------------------------
def options(limits: Limits, monkeypatch, visible=None, **cfg):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return ds.container_options(SandboxConfig(kind="docker", **cfg), limits, "run1", "agent", [])


@pytest.mark.fast
def test_limits_and_lockdown_requested_of_docker(monkeypatch):
    opts = options(Limits(cpus=2, memory_gb=4, gpus=0, network=False), monkeypatch, pids_limit=100)
    assert opts["network_mode"] == "none"
    assert opts["cap_drop"] == ["ALL"] and opts["security_opt"] == ["no-new-privileges"]
    assert opts["read_only"] is True
    assert opts["user"] != "0:0" and not opts["user"].startswith("0:")
    assert opts["pids_limit"] == 100
    assert opts["mem_limit"] == opts["memswap_limit"] == "4096m"  # no swap to hide in
    assert opts["nano_cpus"] == 2_000_000_000
    assert opts["device_requests"] == []
    assert opts["labels"]["mlrb.run_id"] == "run1" and opts["labels"]["mlrb.managed"] == "true"
    assert all(mount["ReadOnly"] for mount in opts["mounts"])  # only the host Python so far


@pytest.mark.fast
def test_a_task_that_allows_network_gets_it(monkeypatch):
    assert options(Limits(network=True), monkeypatch)["network_mode"] == "bridge"


@pytest.mark.fast
def test_gpus_are_pinned_to_the_runs_allocation(monkeypatch):
    opts = options(Limits(gpus=1), monkeypatch, visible="2,3")
    (request,) = opts["device_requests"]
    assert request["DeviceIDs"] == ["2"] and request["Count"] == 0  # never "all" (-1)
    assert request["Capabilities"] == [["gpu"]]

    (request,) = options(Limits(gpus=2), monkeypatch, visible="2,3")["device_requests"]
    assert request["DeviceIDs"] == ["2", "3"]

    (request,) = options(Limits(gpus=1), monkeypatch, visible="0", gpu_ids=["5"])["device_requests"]
    assert request["DeviceIDs"] == ["5"]  # an explicit choice wins

    with pytest.raises(ConfigError, match="needs 2 GPU.*allocated 1"):
        options(Limits(gpus=2), monkeypatch, visible="0")
    assert options(Limits(gpus=0), monkeypatch, visible="0,1")["device_requests"] == []


@pytest.mark.fast
def test_a_dead_docker_daemon_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(ConfigError, match="cannot reach the Docker daemon .*no-such.sock.* or use sandbox=bwrap"):
        ds.connect(ds.DockerOptions())


@pytest.mark.fast
def test_cli_reports_a_dead_daemon_before_recording_anything(tmp_path):
    from conftest import run_cli

    result = run_cli(
        "sandbox=docker", f"tracking.dir={tmp_path / 'mlruns'}", f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path, env={"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"},
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the Docker daemon" in lines[0], result.stderr
    assert not (tmp_path / "mlruns").exists()


# ---- a live container, attacked ----------------------------------------------------
@pytest.fixture
def box(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-docker-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-docker-secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # the host's numbering of a run's GPU
    (tmp_path / "ws").mkdir()
    (tmp_path / "task" / "public").mkdir(parents=True)
    (tmp_path / "task" / "public" / "dev.jsonl").write_text("{}\n")
    (tmp_path / "task" / "hidden").mkdir()
    (tmp_path / "task" / "hidden" / "mlrb_hidden_answers.jsonl").write_text('{"answer": 3}\n')
    cfg = SandboxConfig(kind="docker", pids_limit=64, command_timeout_s=60)
    # A run id of its own: parallel test processes hold boxes of their own at the same time.
    run_id = f"test-run-{uuid.uuid4().hex[:8]}"
    sandbox = ds.DockerSandbox(
        cfg, tmp_path / "ws", tmp_path / "task" / "public", run_id, Limits(cpus=1, memory_gb=0.5)
    )
    yield sandbox
    sandbox.close()


def sh(box, command, timeout=30):
    return box.exec(command, timeout_s=timeout)


@pytest.mark.system
@needs_docker
def test_no_network(box):
    code = "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e.errno)\n"
    result = sh(box, f'python3 -c "{code}"')
    assert "blocked" in result.stdout and "CONNECTED" not in result.stdout
    assert sh(box, "cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net").stdout.split() == ["unknown", "lo"]


@pytest.mark.system
@needs_docker
def test_non_root_and_no_privilege_escalation(box):
    assert sh(box, "id -u").stdout.strip() == "1000"
    assert sh(box, "sudo id").exit_code != 0
    status = sh(box, "cat /proc/self/status").stdout
    assert "NoNewPrivs:\t1" in status
    assert "CapEff:\t0000000000000000" in status


@pytest.mark.system
@needs_docker
def test_the_workspace_is_the_only_writable_place(box, tmp_path):
    assert sh(box, "echo hi > /workspace/ok.txt").exit_code == 0
    assert (tmp_path / "ws" / "ok.txt").read_text() == "hi\n"
    for target in ("/data/x", "/etc/x", "/x", "/usr/bin/x", f"{sys.prefix}/x"):
        assert sh(box, f"touch {target}").exit_code != 0, target
    assert sh(box, "cat /data/dev.jsonl").stdout == "{}\n"  # task data readable


@pytest.mark.system
@needs_docker
def test_hidden_data_scorer_code_and_secrets_are_out_of_reach(box, tmp_path):
    hidden = tmp_path / "task" / "hidden" / "mlrb_hidden_answers.jsonl"
    assert sh(box, f"cat {hidden}").exit_code != 0
    search = sh(box, "find / -path /proc -prune -o -name 'mlrb_hidden_*' -print 2>/dev/null", timeout=60)
    assert not search.timed_out and search.stdout.strip() == ""  # nowhere in the container
    package_dir = Path(ds.__file__).resolve().parents[1]
    assert sh(box, f"ls {package_dir}").exit_code != 0  # the harness's (and scorer's) code is not mounted
    assert sh(box, "python -c 'import mlrb'").exit_code != 0
    env = sh(box, "env; cat /proc/1/environ").stdout
    assert "secret" not in env and "API_KEY" not in env
    assert "CUDA_VISIBLE_DEVICES" not in env  # the container numbers its own GPUs from 0
    # while the harness still has its own keys
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-ant-docker-secret"


@pytest.mark.system
@needs_docker
def test_memory_and_fork_bombs_are_contained(box, tmp_path):
    memory_bomb = sh(box, "python3 -c 'x = bytearray(2 * 1024**3); print(len(x))'", timeout=60)
    assert memory_bomb.exit_code == 137 and not memory_bomb.timed_out  # OOM-killed
    assert sh(box, "echo alive").stdout == "alive\n"  # the container survives the kill

    fork_bomb = sh(box, "bomb() { bomb | bomb & }; bomb; sleep 5", timeout=20)
    assert fork_bomb.duration_s < 30
    # The bomb holds every process slot of its own container, and only those:
    # another run's container works, and the harness can still stop the bombed one.
    (tmp_path / "ws2").mkdir()
    other = ds.DockerSandbox(box.cfg, tmp_path / "ws2", tmp_path / "task" / "public", "other-run", Limits(cpus=1))
    try:
        assert other.exec("echo unharmed", timeout_s=20).stdout == "unharmed\n"
    finally:
        other.close()
    box.close()
    assert subprocess.run(["true"]).returncode == 0


@pytest.mark.system
@needs_docker
def test_a_timeout_kills_the_command(box):
    result = sh(box, "sleep 60; echo late", timeout=2)
    assert result.timed_out and result.duration_s < 15 and "late" not in result.stdout


@pytest.mark.system
@needs_docker
def test_file_tools_see_the_workspace_as_the_agent_does(box, tmp_path):
    box.write_file("/workspace/sub/notes.md", "hello")
    assert box.read_file("sub/notes.md") == "hello"
    assert sh(box, "echo more >> sub/notes.md && cat sub/notes.md").stdout == "hellomore\n"  # agent owns it
    sh(box, "ln -s /etc/passwd /workspace/link")
    with pytest.raises(PermissionError):
        box.read_file("link")  # a link planted by the agent does not reach the host
    with pytest.raises(PermissionError):
        box.write_file("../outside.txt", "x")


@pytest.mark.system
@needs_docker
def test_containers_of_a_crashed_harness_are_removed_on_the_next_start(box):
    import docker

    client = docker.from_env()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    labels = {**ds.labels("crashed-run", "agent"), "mlrb.harness_pid": str(dead.pid)}
    orphan = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, labels=labels, network_mode="none")
    removed = ds.remove_stale(client)
    # Gone, by this call or by another test process's box starting at the same moment: that one's
    # removal may still be under way when this call returns (Docker answers 409 to a second remover).
    deadline = time.monotonic() + 30
    while client.containers.list(all=True, filters={"id": orphan.id}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not client.containers.list(all=True, filters={"id": orphan.id})
    assert box.container.name not in removed  # a live run's container stays
    assert client.containers.list(filters={"label": f"mlrb.run_id={box.run_id}"})


@pytest.mark.system
@needs_docker
def test_close_removes_the_container(box):
    import docker

    box.close()
    assert not docker.from_env().containers.list(all=True, filters={"label": f"mlrb.run_id={box.run_id}"})


@pytest.mark.system
@needs_docker
def test_an_agent_in_docker_reaches_the_model_only_through_the_proxy(tmp_path):
    from test_proxy import bridge_case

    seen = bridge_case("docker", tmp_path)
    assert seen["direct"] in ("ConnectionRefusedError", "OSError")  # no way to the host's loopback


@pytest.mark.system
@needs_docker
def test_an_agent_s_whole_run_in_docker_is_bounded_by_the_budget_not_by_the_command_timeout(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    cfg = SandboxConfig(kind="docker", command_timeout_s=1)
    box = ds.DockerSandbox(cfg, tmp_path / "ws", tmp_path / "data", f"whole-{uuid.uuid4().hex[:8]}", Limits())
    try:
        cut = box.exec("sleep 2; echo done", timeout_s=30)
        whole = box.exec("sleep 2; echo done", timeout_s=30, whole_run=True)
    finally:
        box.close()
    assert cut.timed_out and not whole.timed_out and whole.stdout.strip() == "done"


# ---- nothing of the agent works after its end, or while the harness's clock stands still ----
TICKER = "(setsid sh -c 'while true; do date +%s.%N >> ticks; sleep 0.05; done' >/dev/null 2>&1 &); echo started"
LEAVES_A_WORKER = (
    "(setsid sh -c 'sleep 1; echo swapped > submission.txt' >/dev/null 2>&1 &); echo honest > submission.txt"
)


def ticks(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.system
@needs_docker
def test_held_still_the_agent_s_processes_do_nothing_then_go_on(box, tmp_path):
    assert sh(box, TICKER).stdout == "started\n"
    time.sleep(0.5)
    box.hold_still(True)
    time.sleep(0.2)
    held = ticks(tmp_path / "ws" / "ticks")
    time.sleep(1.5)
    assert ticks(tmp_path / "ws" / "ticks") == held > 0
    box.hold_still(False)
    time.sleep(1.0)
    assert ticks(tmp_path / "ws" / "ticks") > held + 5
    assert sh(box, "echo answers").stdout == "answers\n"


@pytest.mark.system
@needs_docker
def test_when_a_whole_run_command_ends_nothing_it_left_goes_on(box, tmp_path):
    result = box.exec(LEAVES_A_WORKER, timeout_s=30, whole_run=True)
    assert result.exit_code == 0
    time.sleep(2)
    assert (tmp_path / "ws" / "submission.txt").read_text() == "honest\n"
    box.close()
    box.hold_still(True)  # after the end, holding still is a no-op, not an error
