"""Sandbox mounts are applied from the least specific path to the most specific, so a bind is
never hidden by a later one: checked as a property of what bwrap and Docker are asked for, with
the agent's and the scorer's mounts, wherever the run's folders lie (inside the source tree or
the venv's folder, under the system's temp folder, on a path with spaces)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path, PurePosixPath

import pytest

import mlrb
from conftest import REPO
from mlrb.core.config import SandboxConfig
from mlrb.sandbox import bwrap as bw
from mlrb.sandbox import docker as ds
from mlrb.sandbox.base import DATA, WORKSPACE, Limits, Mount
from mlrb.scoring.runner import scorer_mounts

pytestmark = pytest.mark.fast

# bwrap's mount options and how many arguments each takes (the target is the last).
BWRAP_MOUNTS = {"--bind": 2, "--ro-bind": 2, "--dev-bind": 2, "--symlink": 2, "--proc": 1, "--dev": 1, "--tmpfs": 1}


def bwrap_mounts(argv: list[str]) -> list[tuple[str, bool]]:
    """(target, writable) of each mount in a bwrap command line, in the order bwrap applies them."""
    found, i = [], 0
    while i < len(argv):
        arity = BWRAP_MOUNTS.get(argv[i], 0)
        if arity:
            found.append((argv[i + arity], argv[i] in ("--bind", "--tmpfs")))
        i += 1 + arity
    return found


def docker_mounts(options: dict) -> list[tuple[str, bool]]:
    return [(m["Target"], not m["ReadOnly"]) for m in options["mounts"]]


def inside(path: str, folder: str) -> bool:
    return PurePosixPath(folder) in PurePosixPath(path).parents


def hidden_mounts(mounts: list[tuple[str, bool]]) -> list[str]:
    """Mounts that a later mount of a folder around them hides."""
    return [f"{a} (hidden by {b})" for i, (a, _) in enumerate(mounts) for b, _ in mounts[i + 1 :] if inside(a, b)]


def writable_at(mounts: list[tuple[str, bool]], path: str) -> bool:
    """Whether `path` is writable inside: what the last mount at or around it says."""
    covering = [writable for target, writable in mounts if target == path or inside(path, target)]
    return bool(covering) and covering[-1]


def test_the_check_finds_a_hidden_bind():
    """The failure of issue 33: the run's writable scoring folder, then the source tree around it."""
    mounts = [("/clone/outputs/runs/r/scoring", True), ("/clone", False)]
    assert hidden_mounts(mounts) == ["/clone/outputs/runs/r/scoring (hidden by /clone)"]
    assert not writable_at(mounts, "/clone/outputs/runs/r/scoring")


def where_runs_lie() -> dict[str, Path]:
    """Folders a user may run from: their runs' folders lie under them."""
    return {
        "the source tree": REPO,
        "the package's folder": Path(mlrb.__file__).parent,
        "the venv's parent": Path(sys.prefix).parent,
        "inside the venv": Path(sys.prefix),
        "the system's temp folder": Path(tempfile.gettempdir()) / "mlrb-user",
        "a path with spaces": Path(tempfile.gettempdir()) / "my runs" / "a b",
        "the root": Path("/"),
    }


@pytest.fixture(params=list(where_runs_lie()), ids=lambda name: name.replace(" ", "-"))
def run_root(request) -> Path:
    return where_runs_lie()[request.param]


def the_scorers(run_root: Path) -> tuple[list[Mount], str]:
    """The scorer's mounts for a run under run_root, with its cache beside it, and its folder."""
    work_dir = run_root / "outputs" / "runs" / "llm_merging-baseline-smoke-0" / "scoring"
    return scorer_mounts(run_root / ".cache" / "mlrb" / "llm_merging" / "abc", work_dir), str(work_dir)


def the_agents(run_root: Path) -> list[Mount]:
    run = run_root / "outputs" / "runs" / "llm_merging-baseline-smoke-0"
    return [Mount(run / "workspace", WORKSPACE, writable=True), Mount(run / "data", DATA)]


def test_bwrap_applies_every_mount_after_the_folders_around_it(run_root, tmp_path):
    options = bw.BwrapOptions(ro_paths=[str(run_root)])  # a user's extra read-only path around it all
    mounts, work_dir = the_scorers(run_root)
    for limits in (Limits(), Limits(gpus=1, network=True)):
        scorer = bw.mount_args(options, limits, mounts, tmp_path)
        order = bwrap_mounts(scorer)
        assert not hidden_mounts(order), order
        assert writable_at(order, work_dir), order
        agent = bwrap_mounts(bw.mount_args(options, limits, the_agents(run_root), tmp_path))
        assert not hidden_mounts(agent), agent
        assert writable_at(agent, WORKSPACE) and not writable_at(agent, DATA)
        assert writable_at(agent, "/tmp") and not writable_at(agent, "/usr")


def test_docker_is_asked_for_every_mount_after_the_folders_around_it(run_root, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = SandboxConfig(kind="docker")
    mounts, work_dir = the_scorers(run_root)
    order = docker_mounts(ds.container_options(cfg, Limits(), "run1", "scorer", mounts))
    assert not hidden_mounts(order), order
    assert writable_at(order, work_dir), order
    agent = docker_mounts(ds.container_options(cfg, Limits(), "run1", "agent", the_agents(run_root)))
    assert not hidden_mounts(agent), agent
    assert writable_at(agent, WORKSPACE) and not writable_at(agent, DATA)


def test_the_scorer_sees_its_folders_at_the_paths_it_is_given(tmp_path):
    """Not resolved: a run folder reached through a link is mounted where the scorer is told it is."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    work_dir = tmp_path / "link" / "run" / "scoring"
    targets = {m.target: m.writable for m in scorer_mounts(tmp_path / "link" / "assets", work_dir)}
    assert targets[str(work_dir)] is True and targets[str(tmp_path / "link" / "assets")] is False
