"""`python -m mlrb.preflight`: can runs start on this machine? Run it on a compute node
(`srun ... .venv/bin/python -m mlrb.preflight`) before a sweep.

It asks each sandbox the question a run asks it before it starts (the sandbox's own
`preflight`: bwrap starts a namespace, docker pings its daemon), then says which GPUs the
NVIDIA driver lists, what torch's CUDA sees, and where the venv, the asset cache and the
Hugging Face cache are and whether they sit on a shared file system. It ends with the
`sandbox=` to use. Exit status 1 when no confined sandbox can run here; nothing is
written or built.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mlrb.core.config import ConfigError, SandboxConfig

# File systems that several machines mount at once (what a cluster's home or scratch is).
SHARED_FS = (
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "cifs",
    "smb3",
    "ceph",
    "panfs",
    "wekafs",
    "glusterfs",
    "fuse.glusterfs",
    "fuse.sshfs",
    "fuse.ceph",
    "fuse.weka",
    "fuse.juicefs",
    "afs",
    "9p",
)
NO_SANDBOX = (
    "no confined sandbox can run here. Ask the cluster's admins to allow unprivileged user namespaces "
    "(sysctl user.max_user_namespaces=15000, kernel.unprivileged_userns_clone=1, and on Ubuntu 24.04+ "
    "kernel.apparmor_restrict_unprivileged_userns=0) for sandbox=bwrap, or for Docker on the compute nodes "
    "for sandbox=docker. sandbox=unconfined runs without any confinement: only for agents you wrote yourself"
)


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m mlrb.preflight",
        description="Check that runs can start on this machine (run it on a compute node): which sandbox "
        "works, the GPUs and torch's CUDA, and whether the venv and caches are on a shared file system. "
        "Exit status 1 when no confined sandbox can run here.",
    )


def check(probe: Callable[[], object]) -> tuple[bool, str]:
    """(works, what to say): a probe that raises ConfigError says why it cannot work."""
    try:
        said = probe()
    except ConfigError as e:  # "sandbox=KIND: why": the line already names its sandbox
        return False, str(e).split(": ", 1)[-1] if str(e).startswith("sandbox=") else str(e)
    return True, str(said or "works")


def bwrap_probe() -> str:
    from mlrb.sandbox.bwrap import BwrapOptions, BwrapSandbox, find_bwrap

    BwrapSandbox.preflight(SandboxConfig(kind="bwrap"))
    return f"works ({find_bwrap(BwrapOptions().binary)}, unprivileged user namespaces allowed)"


def docker_probe() -> str:
    from mlrb.sandbox.docker import DockerOptions, connect
    from mlrb.sandbox.docker_image import build_command, has_image

    image = DockerOptions().image
    client = connect(DockerOptions())
    if has_image(client, image):
        return f"works (image {image})"
    return f"the daemon answers; image {image} is not built yet: the first run builds it, or `{build_command(image)}`"


def file_system(path: Path) -> str:
    """The type of the file system that holds `path` (the longest mount point above it)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def where(path: Path) -> str:
    kind = file_system(path)
    if kind in SHARED_FS or kind.split(".")[-1] in SHARED_FS:
        return f"{path} (shared: {kind})"
    return f"{path} ({kind}: local to this node? every node must see it at this path)"


def gpus_line() -> str:
    from mlrb.sandbox import gpus

    found = gpus.driver_gpus(gpus.DRIVER)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    given = f"; CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
    if not found:
        return f"none listed by the NVIDIA driver{given}"
    return f"{len(found)} listed by the NVIDIA driver{given}"


def torch_line() -> str:
    try:
        import torch
    except ImportError:
        return "not installed in this venv"
    if torch.version.cuda is None:
        return f"{torch.__version__}, a CPU-only build: GPU tasks need a CUDA build (MLRB_TORCH, see the install)"
    if not torch.cuda.is_available():
        return f"{torch.__version__}, CUDA {torch.version.cuda}, but no GPU is usable from here"
    return f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) usable"


def cache_paths() -> tuple[Path, Path]:
    """The asset cache (paths.cache_dir's default) and the Hugging Face cache."""
    from huggingface_hub import constants

    mlrb_cache = Path(os.environ.get("MLRB_CACHE_DIR") or Path(os.environ.get("HOME", "/tmp")) / ".cache" / "mlrb")
    return mlrb_cache, Path(constants.HF_HOME)


def advice(bwrap_ok: bool, docker_ok: bool) -> str:
    if bwrap_ok:
        return "use the default, sandbox=bwrap"
    if docker_ok:
        return "use sandbox=docker (add it to every command)"
    return NO_SANDBOX


def main(argv: list[str] | None = None) -> int:
    parser().parse_args(argv)
    bwrap_ok, bwrap_said = check(bwrap_probe)
    docker_ok, docker_said = check(docker_probe)
    mlrb_cache, hf_cache = cache_paths()
    lines = [
        ("sandbox=bwrap", bwrap_said if bwrap_ok else f"cannot run: {bwrap_said}"),
        ("sandbox=docker", docker_said if docker_ok else f"cannot run: {docker_said}"),
        ("GPUs", gpus_line()),
        ("torch", torch_line()),
        ("venv", where(Path(sys.prefix))),
        ("asset cache", where(mlrb_cache)),
        ("HF cache", where(hf_cache)),
    ]
    for name, said in lines:
        print(f"{name + ':':16}{said}")
    print(f"{'advice:':16}{advice(bwrap_ok, docker_ok)}")
    return 0 if bwrap_ok or docker_ok else 1


if __name__ == "__main__":
    sys.exit(main())
