"""Only its own GPUs: a run under the bwrap sandbox has the device nodes of the GPUs it was
allocated (and the control nodes they need), numbered 0..n-1 inside, and nothing of the node's
other GPUs, whatever it sets CUDA_VISIBLE_DEVICES to; so has its scorer.

A 4-GPU node is made in a temp folder: real character devices (as root, with os.mknod) and the
NVIDIA driver's /proc/driver/nvidia/gpus/<bus id>/information files. The GPUs' minors are not
in their PCI bus order, so an index (PCI bus order, as CUDA counts with
CUDA_DEVICE_ORDER=PCI_BUS_ID) and a node (/dev/nvidia<minor>) differ, as they can on a real node.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from mlrb.core.config import ConfigError, SandboxConfig
from mlrb.sandbox import bwrap as bw
from mlrb.sandbox import gpus
from mlrb.sandbox.base import IsolatedCommand, Limits, Mount, sandbox_environment
from mlrb.scoring.runner import with_run_devices
from test_bwrap_sandbox import needs_namespaces

pytestmark = pytest.mark.fast

# (bus id, minor, uuid) in PCI bus order: index 0 is /dev/nvidia2, index 1 /dev/nvidia0, ...
NODE = [
    ("0000:0a:00.0", 2, "GPU-aaaaaaaa-1111-2222-3333-444444444444"),
    ("0000:0b:00.0", 0, "GPU-bbbbbbbb-1111-2222-3333-444444444444"),
    ("0000:0c:00.0", 3, "GPU-cccccccc-1111-2222-3333-444444444444"),
    ("0000:0d:00.0", 1, "GPU-dddddddd-1111-2222-3333-444444444444"),
]
CONTROL = {"nvidiactl": (195, 255), "nvidia-modeset": (195, 254), "nvidia-uvm": (511, 0), "nvidia-uvm-tools": (511, 1)}
ALL_NODES = [f"/dev/nvidia{minor}" for minor in range(4)] + [f"/dev/{name}" for name in CONTROL] + ["/dev/nvidia-caps"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes (mknod) needs root")


def information(bus: str, minor: int, uuid: str) -> str:
    """As the driver writes it (tabs and all)."""
    return (f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.00.00.00\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")  # fmt: skip


def make_node(root: Path) -> tuple[Path, Path]:
    """/dev and /proc/driver/nvidia of a 4-GPU node under `root`."""
    dev, driver = root / "dev", root / "proc" / "driver" / "nvidia"
    (dev / "nvidia-caps").mkdir(parents=True)
    for bus, minor, uuid in NODE:
        os.mknod(dev / f"nvidia{minor}", stat.S_IFCHR | 0o666, os.makedev(195, minor))
        (driver / "gpus" / bus).mkdir(parents=True)
        (driver / "gpus" / bus / "information").write_text(information(bus, minor, uuid))
    for name, (major, minor) in CONTROL.items():
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    os.mknod(dev / "nvidia-caps" / "nvidia-cap1", stat.S_IFCHR | 0o400, os.makedev(237, 1))
    (dev / "nvidia-notes.txt").write_text("not a device")
    return dev, driver


@pytest.fixture
def node(tmp_path, monkeypatch):
    """The made node as the one the harness runs on."""
    dev, driver = make_node(tmp_path / "node")
    monkeypatch.setattr(gpus, "DEV", dev)
    monkeypatch.setattr(gpus, "DRIVER", driver)
    return dev, driver


# ---- the mapping (no namespaces needed) -------------------------------------------
@needs_root
def test_the_driver_s_gpus_in_pci_bus_order(tmp_path):
    dev, driver = make_node(tmp_path)
    found = gpus.driver_gpus(driver)
    assert [(g.bus_id, g.minor, g.uuid) for g in found] == NODE
    assert gpus.driver_gpus(tmp_path / "no-driver") == []


@needs_root
@pytest.mark.parametrize(
    "allocated, minors, inside",
    [
        ("1", [0], "0"),
        ("2,0", [3, 2], "0,1"),
        (NODE[3][2], [1], "0"),
        ("GPU-cccc", [3], "0"),  # a unique prefix, as CUDA takes it
        (f"{NODE[0][2]},{NODE[1][2]},{NODE[2][2]}", [2, 0], "0,1"),  # the task asks for 2: the first 2
    ],
)
def test_the_run_s_gpus_and_their_control_nodes_only(tmp_path, allocated, minors, inside):
    dev, driver = make_node(tmp_path)
    view = gpus.run_gpus(2 if "," in allocated else 1, None, {"CUDA_VISIBLE_DEVICES": allocated}, dev, driver)
    controls = [dev / name for name in gpus.CONTROL_NODES] + [dev / "nvidia-caps"]
    assert list(view.nodes) == [dev / f"nvidia{m}" for m in minors] + controls
    assert view.env == {"CUDA_VISIBLE_DEVICES": inside, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert view.note == ""
    args = [arg for _, mount in bw.gpu_args(view.nodes) for arg in mount]
    assert args[:3] == ["--dev-bind", str(dev / f"nvidia{minors[0]}"), f"/dev/nvidia{minors[0]}"]


@needs_root
def test_no_gpu_device_unless_the_run_has_its_own(tmp_path):
    dev, driver = make_node(tmp_path)

    def view(wanted, visible=None, gpu_ids=None):
        environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
        return gpus.run_gpus(wanted, gpu_ids, environ, dev, driver)

    for shown in (view(0, "0,1,2,3"), view(0), view(1, ""), view(1, "-1"), view(1, "7"), view(1, "GPU-ffff")):
        assert shown.nodes == () and shown.env == {"CUDA_VISIBLE_DEVICES": ""}, shown
    assert view(0, "0").note == "the task asks for no GPU: no GPU device is shown"
    assert view(1, "7").note.startswith("GPU '7' is not one this node's NVIDIA driver knows")
    assert view(1, "").note == "the task asks for 1 GPU(s) but the run was allocated none"
    assert view(2, "3").note == "the task asks for 2 GPU(s) but the run was allocated 1 (3)"
    assert view(2, "3").env["CUDA_VISIBLE_DEVICES"] == "0"  # fewer than asked for: only those
    assert view(1, gpu_ids=["3"], visible="0").nodes[0] == dev / "nvidia1"  # sandbox.gpu_ids wins
    assert view(1).nodes[0] == dev / "nvidia2"  # nothing set: the node is the harness's, the first GPU
    # Nodes without the driver's facts: none shown. No driver: the allocation names nothing here, and
    # is left as it is (a CPU machine's sweep hands out GPU ids all the same).
    no_driver = gpus.run_gpus(1, None, {"CUDA_VISIBLE_DEVICES": "0"}, dev, tmp_path / "none")
    assert no_driver.nodes == () and no_driver.env == {} and "no GPU device is shown" in no_driver.note
    assert gpus.run_gpus(1, None, {}, tmp_path / "no-dev", tmp_path / "none").env == {}
    assert gpus.run_gpus(0, None, {}, tmp_path / "no-dev", tmp_path / "none") == gpus.GpuView()


@needs_root
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux's unshare")
def test_under_a_job_s_device_cgroup_an_index_counts_the_job_s_own_gpus(tmp_path):
    """SLURM's ConstrainDevices: the job may open only its GPUs' nodes, and CUDA_VISIBLE_DEVICES
    numbers those from 0. Here the other GPUs' nodes refuse to open as a cgroup would refuse them
    (each bound over itself as nodev, in a mount namespace of the test's own)."""
    dev, driver = make_node(tmp_path)
    refused = [dev / f"nvidia{minor}" for minor in (2, 0)]  # the node's GPUs 0 and 1 (PCI bus order)
    mounts = "; ".join(f"mount --bind {n} {n} && mount -o remount,bind,nodev {n}" for n in refused)
    probe = (
        "import json, sys; from pathlib import Path; from mlrb.sandbox import gpus\n"
        f"view = gpus.run_gpus(1, None, {{'CUDA_VISIBLE_DEVICES': sys.argv[1]}}, Path({str(dev)!r}), "
        f"Path({str(driver)!r}))\nprint(json.dumps([str(n) for n in view.nodes[:1]]))"
    )
    for visible, node in (("0", dev / "nvidia3"), ("1", dev / "nvidia1"), (NODE[2][2], dev / "nvidia3")):
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              f'{mounts} && exec "$0" -c "$1" "$2"', sys.executable, probe, visible],
                             capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        assert json.loads(out.stdout) == [str(node)], (visible, out.stderr)
    # without the cgroup, index 0 is the node's first GPU
    assert gpus.run_gpus(1, None, {"CUDA_VISIBLE_DEVICES": "0"}, dev, driver).nodes[0] == dev / "nvidia2"


def test_a_mig_device_is_on_its_gpu():
    listing = (f"GPU 0: NVIDIA A100 (UUID: {NODE[0][2]})\n"
               "  MIG 3g.20gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)\n"
               f"GPU 1: NVIDIA A100 (UUID: {NODE[1][2]})\n"
               "  MIG 3g.20gb     Device  0: (UUID: MIG-66666666-2222-3333-4444-555555555555)\n")  # fmt: skip
    node = [gpus.Gpu(bus, minor, uuid) for bus, minor, uuid in NODE]
    (gpu,) = gpus.resolve(["MIG-66666666-2222-3333-4444-555555555555"], node, listing)
    assert gpu.minor == 0
    (gpu,) = gpus.resolve([f"MIG-{NODE[2][2]}/1/0"], node, "")  # the older form names its GPU
    assert gpu.minor == 3
    with pytest.raises(gpus.GpuError, match="GPU 'MIG-77"):
        gpus.resolve(["MIG-77777777-2222-3333-4444-555555555555"], node, listing)


@needs_root
def test_a_gpu_the_driver_does_not_know_is_one_line_before_the_run(node, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7")
    with pytest.raises(ConfigError) as refused:
        bw.BwrapSandbox.preflight(SandboxConfig())
    (line,) = str(refused.value).splitlines()
    assert line.startswith("sandbox=bwrap: CUDA_VISIBLE_DEVICES names a GPU this run cannot have: GPU '7' is not")
    assert NODE[0][2] in line and NODE[0][0] in line  # what the node has
    with pytest.raises(ConfigError, match="sandbox.gpu_ids names a GPU .* 'GPU-ffff'"):
        bw.BwrapSandbox.preflight(SandboxConfig(gpu_ids=["GPU-ffff"]))
    for fine in ("1", NODE[2][2], "", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fine)
        gpus.check_allocation(None, os.environ, gpus.DEV, gpus.DRIVER)
    monkeypatch.setattr(gpus, "DRIVER", node[1].parent / "no-driver")  # a machine without the driver: nothing to check
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    gpus.check_allocation(None, os.environ, gpus.DEV, gpus.DRIVER)


# ---- a live sandbox on the made node ----------------------------------------------
PROBE = "ls -d /dev/nvidia* | sort | tr '\\n' ' '; echo; echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER"


def inside(sandbox, command: str = PROBE) -> tuple[list[str], str]:
    result = sandbox.exec(command, timeout_s=30)
    assert result.exit_code == 0, result.stderr
    nodes, env = result.stdout.splitlines()
    return nodes.split(), env


def minor_inside(sandbox, path: str) -> tuple[int, int]:
    result = sandbox.exec(f"stat -c '%t %T' {path}", timeout_s=30)
    major, minor = result.stdout.split()
    return int(major, 16), int(minor, 16)


@pytest.fixture
def start(tmp_path, node, monkeypatch):
    """A bwrap sandbox for a run allocated `visible` (CUDA_VISIBLE_DEVICES), its task asking for `wanted` GPUs."""
    started = []

    def start(visible: str, wanted: int):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        ws = tmp_path / f"ws{len(started)}"
        (ws / "data").mkdir(parents=True)
        sandbox = bw.BwrapSandbox(SandboxConfig(command_timeout_s=60), ws, ws / "data", "gpus", Limits(gpus=wanted))
        started.append(sandbox)
        return sandbox

    yield start
    for sandbox in started:
        sandbox.close()


CONTROLS = ["/dev/nvidia-caps", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


@needs_root
@needs_namespaces
@pytest.mark.parametrize(
    "visible, wanted, minors",
    [("1", 1, [0]), (NODE[3][2], 1, [1]), ("2,3", 2, [3, 1]), (f"{NODE[0][2]},{NODE[2][2]}", 2, [2, 3])],
    ids=["index", "uuid", "two-indices", "two-uuids"],
)
def test_the_agent_has_its_own_gpus_only_whatever_it_sets(start, visible, wanted, minors):
    sandbox = start(visible, wanted)
    nodes, env = inside(sandbox)
    assert nodes == sorted(CONTROLS + [f"/dev/nvidia{m}" for m in minors])
    assert env == f"{','.join(str(i) for i in range(wanted))} PCI_BUS_ID"  # its GPUs are 0..n-1
    for minor in minors:  # the host's node of that GPU, not another
        assert minor_inside(sandbox, f"/dev/nvidia{minor}") == (195, minor)
    # Asking for every GPU reaches nothing more: the others' nodes are not there to open.
    assert inside(sandbox, "export CUDA_VISIBLE_DEVICES=0,1,2,3; " + PROBE) == (nodes, "0,1,2,3 PCI_BUS_ID")
    others = sorted(set(ALL_NODES) - set(nodes))
    assert len(others) == 4 - wanted
    probe = sandbox.exec(f"for n in {' '.join(others)}; do : < $n && echo opened $n; done; true", timeout_s=30)
    assert "opened" not in probe.stdout
    # Nor can it make them: no mknod in a user namespace without capabilities, anywhere writable.
    for folder in ("/tmp", "/workspace", "/dev"):
        made = sandbox.exec(
            f"{sys.executable} -c \"import os, stat; os.mknod('{folder}/nvidia9', stat.S_IFCHR | 0o666, "
            f"os.makedev(195, {next(iter(set(range(4)) - set(minors)))}))\"; ls {folder}/nvidia9",
            timeout_s=30,
        )  # fmt: skip
        assert made.exit_code != 0 and ("PermissionError" in made.stderr or "Read-only" in made.stderr), made
        assert "No such file" in made.stderr


@needs_root
@needs_namespaces
def test_a_run_that_asks_for_no_gpu_or_names_an_unknown_one_gets_none(start):
    for visible, wanted in (("0,1,2,3", 0), ("", 1), ("9", 1)):
        nodes, env = inside(start(visible, wanted))
        assert nodes == [] and env == "", (visible, wanted)


@needs_root
@needs_namespaces
def test_the_scorer_has_the_run_s_gpus_as_the_agent_does(tmp_path, node, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the launcher's allocation, in the host's numbering
    cfg = SandboxConfig()
    work = tmp_path / "scoring"
    work.mkdir()
    job = IsolatedCommand(
        argv=["/bin/sh", "-c", PROBE], mounts=[Mount(work, writable=True)], workdir=str(work),
        env=with_run_devices(sandbox_environment(str(work)), cfg), timeout_s=60, log_file=work / "scorer.log",
        limits=Limits(gpus=2),
    )  # fmt: skip
    assert bw.BwrapSandbox.run_isolated(cfg, job) == 0, job.log_file.read_text()
    nodes, env = job.log_file.read_text().splitlines()
    assert nodes.split() == sorted(CONTROLS + ["/dev/nvidia3", "/dev/nvidia1"])
    assert env == "0,1 PCI_BUS_ID"


# ---- benchmarks/gpu_check.py's devices part, on the made node ---------------------
@needs_root
@needs_namespaces
def test_the_gpu_check_s_devices_part_sees_only_the_run_s_nodes(tmp_path, node):
    found = gpu_check.devices_part("1", tmp_path, torch_inside=False)
    assert found["expected"] == sorted(CONTROLS + ["/dev/nvidia0"])
    assert found["inside"] == found["inside_asking_for_all"] == found["expected"]
    assert found["visible"] == "0" and found["torch_devices"] is None
    assert gpu_check.failed_checks({"devices": found}) == []
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != "1"  # put back as it was
    json.dumps(found)  # it goes into --out


def test_the_gpu_check_names_a_sandbox_with_another_run_s_gpu():
    failed_checks = gpu_check.failed_checks
    ok = {"expected": ["/dev/nvidia0", "/dev/nvidiactl"], "inside": ["/dev/nvidia0", "/dev/nvidiactl"],
          "inside_asking_for_all": ["/dev/nvidia0", "/dev/nvidiactl"], "visible": "0", "torch_devices": 1,
          "torch_devices_asking_for_all": 1}  # fmt: skip
    assert failed_checks({"devices": ok}) == []
    extra = {**ok, "inside_asking_for_all": ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]}
    (line,) = failed_checks({"devices": extra})
    assert line == "devices: the sandbox for GPU 0 has /dev/nvidia1 (asking for every GPU)"
    (line,) = failed_checks({"devices": {**ok, "torch_devices_asking_for_all": 2}})
    assert line == "devices: torch in the sandbox sees 2 GPU(s) asking for every GPU, not 1"


# ---- the single-GPU rule, broken on purpose -------------------------------------------------
# What a full-scale task states ("on a single GPU") holds under the default sandbox: an agent given
# one GPU that reaches for the node's others finds no such device, where the same reads outside any
# sandbox find all four.
SECOND_GPUS = "for n in 0 1 3; do stat -c %n {dev}/nvidia$n; done"


def unconfined(command: str) -> subprocess.CompletedProcess:
    """COMMAND run outside any sandbox, as a process of the harness would."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


@needs_root
@needs_namespaces
def test_an_agent_given_one_gpu_that_reaches_for_the_others_finds_no_such_device(start, node):
    sandbox = start("0", 1)  # index 0: /dev/nvidia2 on the made node
    tried = sandbox.exec("export CUDA_VISIBLE_DEVICES=0,1,2,3; " + SECOND_GPUS.format(dev="/dev"), timeout_s=30)
    assert tried.exit_code != 0 and tried.stderr.count("No such file or directory") == 3, tried
    outside = unconfined(SECOND_GPUS.format(dev=node[0]))
    assert outside.returncode == 0 and len(outside.stdout.split()) == 3  # the node's other GPUs are there
