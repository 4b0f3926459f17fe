"""requirements.lock pins every library mlrb installs, install.sh installs with it, and the
environment under test is the locked one (so tiny assets and scores are the same everywhere)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def locked() -> dict:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def declared() -> list:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for group in project.get("optional-dependencies", {}).values() for r in group]
    return [Requirement(r) for r in project["dependencies"] + extras]


def torch_pin() -> str:
    """The torch version install.sh installs (the lock leaves torch to it)."""
    return re.search(r"TORCH_SPEC=\$\{MLRB_TORCH:-torch==([^}]+)\}", (REPO / "install.sh").read_text()).group(1)


def test_every_declared_dependency_is_pinned_within_its_declared_range():
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        version = torch_pin() if name == "torch" else pins.get(name)
        assert version, f"{requirement.name} is declared in pyproject.toml but not pinned in requirements.lock"
        assert requirement.specifier.contains(version, prereleases=True), f"{name}=={version} breaks {requirement}"
    assert "torch" not in pins  # install.sh pins it (MLRB_TORCH may ask for a CUDA build)


def test_install_sh_installs_with_the_lock():
    assert "-c requirements.lock" in (REPO / "install.sh").read_text()


def test_the_environment_under_test_is_the_locked_one():
    pins = locked()
    drifted = []
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        installed = metadata.version(requirement.name)
        if installed != pins[name]:
            drifted.append(f"{name} {installed} (locked {pins[name]})")
    assert not drifted, "installed versions differ from requirements.lock: " + ", ".join(drifted)
