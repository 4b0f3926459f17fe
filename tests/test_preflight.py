"""`python -m mlrb.preflight`, run as a user runs it on a compute node: a subprocess of this venv's
Python. Here bwrap works; a node that blocks unprivileged user namespaces is played by a `bwrap` on
PATH that fails as bwrap fails there, with Docker's daemon out of reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_bwrap_sandbox import needs_namespaces

pytestmark = pytest.mark.fast

NO_DAEMON = "unix:///nonexistent/docker.sock"


def preflight(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlrb.preflight"], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def said(stdout: str) -> dict:
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in stdout.splitlines() if ":" in line}


@needs_namespaces
def test_where_bwrap_works_it_advises_the_default_and_exits_0():
    result = preflight({**os.environ, "DOCKER_HOST": NO_DAEMON})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = said(result.stdout)
    assert lines["sandbox=bwrap"].startswith("works")
    assert lines["sandbox=docker"].startswith("cannot run: cannot reach the Docker daemon")
    assert lines["advice"] == "use the default, sandbox=bwrap"
    assert lines["venv"].startswith(sys.prefix) and {"GPUs", "torch", "asset cache", "HF cache"} <= set(lines)


def test_where_user_namespaces_are_blocked_and_no_docker_it_says_what_to_ask_for_and_exits_1(tmp_path: Path):
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "DOCKER_HOST": NO_DAEMON}
    result = preflight(env)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = said(result.stdout)
    assert lines["sandbox=bwrap"].startswith("cannot run: this machine does not allow the namespaces")
    assert "setting up uid map: Permission denied" in lines["sandbox=bwrap"]
    assert lines["advice"].startswith("no confined sandbox can run here")
    for fix in ("kernel.unprivileged_userns_clone=1", "sandbox=docker", "sandbox=unconfined"):
        assert fix in lines["advice"]


def test_where_only_docker_works_it_advises_docker(monkeypatch, capsys):
    from mlrb import preflight as pf

    monkeypatch.setattr(pf, "bwrap_probe", lambda: (_ for _ in ()).throw(pf.ConfigError("sandbox=bwrap: blocked")))
    monkeypatch.setattr(pf, "docker_probe", lambda: "works (image mlrb-sandbox:latest)")
    assert pf.main([]) == 0
    lines = said(capsys.readouterr().out)
    assert lines["sandbox=bwrap"] == "cannot run: blocked"
    assert lines["advice"] == "use sandbox=docker (add it to every command)"
