"""Which NVIDIA device nodes a confined run may have: the run's own GPUs, from its allocation.

The allocation is what the harness was given: `sandbox.gpu_ids`, else `CUDA_VISIBLE_DEVICES`
as the launcher or SLURM set it (indices, `GPU-<uuid>`, `MIG-...`). It is mapped to device
nodes through the driver's own facts: each GPU's `/proc/driver/nvidia/gpus/<bus id>/information`
says its `Device Minor` (its node, /dev/nvidiaN), its `GPU UUID` and its `Bus Location`; an
index counts GPUs in PCI bus order (CUDA's order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`), those
this process may open (under SLURM's device cgroup, the job's own, which it numbers from 0).

`run_gpus` is what a sandbox binds and the environment it sets inside (the run's GPUs as
0..n-1); `check_allocation` is the one-line error before a run whose allocation names a GPU
the driver does not know. Both take the /dev and driver folders as parameters (tests point
them at folders they make). Nothing here changes the host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEV = Path("/dev")
DRIVER = Path("/proc/driver/nvidia")
# The nodes every GPU process needs besides its GPUs' own (present ones only).
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
CAPS = "nvidia-caps"  # a folder: MIG's access nodes


class GpuError(ValueError):
    """The allocation names a GPU this node's driver does not know (one line)."""


@dataclass(frozen=True)
class Gpu:
    bus_id: str  # "0000:01:00.0", lower case
    minor: int  # its node: /dev/nvidia<minor>
    uuid: str  # "GPU-..."


@dataclass(frozen=True)
class GpuView:
    """What a confined run gets: host device nodes to show at /dev/<name> inside, the environment
    to set there, and why fewer (or none) are shown than the task asks for ("" when none is missing)."""

    nodes: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


def driver_gpus(driver: Path = DRIVER) -> list[Gpu]:
    """The GPUs the NVIDIA driver knows, in PCI bus order; [] where there is no driver."""
    found = []
    for info in sorted((driver / "gpus").glob("*/information")):
        facts = {}
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            facts[key.strip()] = value.strip()
        if "Device Minor" not in facts:
            continue
        bus = (facts.get("Bus Location") or info.parent.name).lower()
        found.append(Gpu(bus, int(facts["Device Minor"]), facts.get("GPU UUID", "")))
    return sorted(found, key=lambda gpu: gpu.bus_id)


def usable(gpus: Sequence[Gpu], dev: Path = DEV) -> list[Gpu]:
    """Those of `gpus` this process may open: a job's device cgroup (SLURM's ConstrainDevices)
    refuses the node of a GPU it was not given, and then numbers the job's own from 0."""
    allowed = []
    for gpu in gpus:
        try:
            os.close(os.open(dev / f"nvidia{gpu.minor}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
        except (PermissionError, FileNotFoundError):
            continue
        except OSError:  # the node is there but says nothing of this process (no device behind it)
            pass
        allowed.append(gpu)
    return allowed


def allocation(gpu_ids: Sequence[object] | None, environ: Mapping[str, str]) -> list[str] | None:
    """The run's GPUs as named: sandbox.gpu_ids, else CUDA_VISIBLE_DEVICES; None when neither is set
    (the whole node is the harness's). As for CUDA, a negative index ends the list ("-1": none)."""
    if gpu_ids is not None:
        named = [str(i).strip() for i in gpu_ids]
    elif "CUDA_VISIBLE_DEVICES" in environ:
        named = environ["CUDA_VISIBLE_DEVICES"].split(",")
    else:
        return None
    entries = []
    for entry in (e.strip() for e in named):
        if re.fullmatch(r"-\d+", entry):
            break
        if entry:
            entries.append(entry)
    return entries


def given(gpu_ids: Sequence[object] | None, wanted: int, environ: Mapping[str, str]) -> int:
    """How many GPUs the run was given, for its compute's account (mlrb/core/compute.py): every one
    sandbox.gpu_ids names (they are the run's, used or not); else the task's count, as many of them
    as CUDA_VISIBLE_DEVICES names where it is set. Whether this machine has them is not asked: a run
    given a GPU holds it."""
    if gpu_ids is not None:
        return len(allocation(gpu_ids, environ) or [])
    named = allocation(None, environ)
    return max(0, wanted if named is None else min(wanted, len(named)))


def mig_parents(listing: str) -> dict[str, str]:
    """MIG UUID -> its GPU's UUID, from `nvidia-smi -L` (each GPU's line, then its MIG devices')."""
    parents, gpu = {}, ""
    for line in listing.splitlines():
        match = re.search(r"\(UUID: ((GPU|MIG)-[^)\s]+)\)", line)
        if match and match.group(2) == "GPU":
            gpu = match.group(1)
        elif match and gpu:
            parents[match.group(1)] = gpu
    return parents


def smi_listing() -> str:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return ""
    try:
        return subprocess.run([binary, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def resolve(
    entries: Sequence[str], gpus: Sequence[Gpu], listing: str | None = None, counted: Sequence[Gpu] | None = None
) -> list[Gpu]:
    """The driver's GPU for each entry (an index in PCI bus order over `counted`, by default all of
    `gpus`; a GPU UUID or a unique prefix of one; a MIG device's UUID: its GPU); GpuError naming
    the first it does not know."""
    counted = gpus if counted is None else counted
    by_uuid = {gpu.uuid.lower(): gpu for gpu in gpus if gpu.uuid}
    chosen: list[Gpu] = []
    for entry in entries:
        key = entry.lower()
        gpu: Gpu | None = None
        if entry.isdigit():
            gpu = counted[int(entry)] if int(entry) < len(counted) else None
        elif key.startswith("mig-gpu-"):  # MIG-GPU-<uuid>/<gi>/<ci> (drivers before 470)
            gpu = by_uuid.get(key[len("mig-") :].split("/")[0])
        elif key.startswith("mig-"):
            if listing is None:
                listing = smi_listing()
            parent = {k.lower(): v for k, v in mig_parents(listing).items()}.get(key)
            gpu = by_uuid.get(parent.lower()) if parent else None
        else:  # GPU-<uuid>, or a unique prefix of one as CUDA takes it
            prefix = key if key.startswith("gpu-") else f"gpu-{key}"
            matches = [g for uuid, g in by_uuid.items() if uuid.startswith(prefix)]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None:
            known = ", ".join(f"{i} ({g.uuid}, {g.bus_id})" for i, g in enumerate(gpus))
            raise GpuError(f"GPU '{entry}' is not one this node's NVIDIA driver knows (its GPUs: {known})")
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def check_allocation(
    gpu_ids: Sequence[object] | None, environ: Mapping[str, str] = os.environ, dev: Path = DEV, driver: Path = DRIVER
) -> None:
    """GpuError where the allocation names a GPU the driver does not know (nothing to check
    where there is no driver)."""
    gpus = driver_gpus(driver)
    entries = allocation(gpu_ids, environ)
    if gpus and entries:
        resolve(entries, gpus, counted=usable(gpus, dev))


def run_gpus(
    wanted: int,
    gpu_ids: Sequence[object] | None,
    environ: Mapping[str, str] = os.environ,
    dev: Path = DEV,
    driver: Path = DRIVER,
) -> GpuView:
    """The device nodes and environment of a run whose task asks for `wanted` GPUs: the first
    `wanted` of its allocation (all of the node's, in PCI bus order, when nothing is set) and the
    control nodes they need; none at all when it asks for none or names a GPU the driver does not
    know. Inside, its GPUs are 0..n-1 (CUDA_VISIBLE_DEVICES, in PCI bus order), MIG devices by
    their own names; CUDA_VISIBLE_DEVICES is empty where it has none. On a machine without the
    NVIDIA driver nothing is shown and the environment is left as it is."""
    gpus = driver_gpus(driver)
    if not gpus:  # no GPU here (or none the driver vouches for): nothing shown, nothing renumbered
        nodes_here = any(dev.glob("nvidia*"))
        if wanted <= 0 and not nodes_here:
            return GpuView()
        note = "the task asks for no GPU" if wanted <= 0 else "the task asks for GPUs but the NVIDIA driver lists none"
        if nodes_here:
            note += f" ({driver / 'gpus'} is missing or empty): no GPU device is shown"
        return GpuView((), {}, note)
    none = GpuView((), {"CUDA_VISIBLE_DEVICES": ""})
    if wanted <= 0:
        return GpuView((), none.env, "the task asks for no GPU: no GPU device is shown")
    entries = allocation(gpu_ids, environ)
    counted = usable(gpus, dev)  # what an index counts: the GPUs this process may use
    named = entries if entries is not None else [str(i) for i in range(len(counted))]
    try:
        chosen = resolve(named, gpus, counted=counted)[:wanted]
    except GpuError as e:
        return GpuView((), none.env, f"{e}: no GPU device is shown")
    if not chosen:
        return GpuView((), none.env, f"the task asks for {wanted} GPU(s) but the run was allocated none")
    mig = [e for e in named if e.lower().startswith("mig-")][:wanted]
    nodes = [dev / f"nvidia{gpu.minor}" for gpu in chosen]
    missing = [str(node) for node in nodes if not node.is_char_device()]
    if missing:
        return GpuView((), none.env, f"{', '.join(missing)} missing: no GPU device is shown")
    nodes += [dev / name for name in CONTROL_NODES if (dev / name).is_char_device()]
    if (dev / CAPS).is_dir():
        nodes.append(dev / CAPS)
    visible = ",".join(mig) if mig else ",".join(str(i) for i in range(len(chosen)))
    note = ""
    if len(chosen) < wanted:
        note = f"the task asks for {wanted} GPU(s) but the run was allocated {len(chosen)} ({','.join(named)})"
    return GpuView(tuple(nodes), {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, note)
