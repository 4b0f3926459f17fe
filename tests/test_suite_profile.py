"""benchmarks/suite_profile.py: every Python process a command starts samples its own stack, a fork
from the fork on, and a program started with a preexec_fn is not killed by the sampler's timer."""

from __future__ import annotations

import sys

import pytest

from benchmarks import suite_profile
from conftest import REPO

BUSY = """
import os, subprocess, sys

def spin(n):
    return sum(i * i for i in range(n))

spin(3_000_000)
if os.fork() == 0:
    spin(3_000_000)
    os._exit(0)
os.wait()
done = subprocess.run([sys.executable, "-c", "print(sum(i * i for i in range(3_000_000)) > 0)"],
                      preexec_fn=lambda: None, capture_output=True, text=True)  # CPU enough to be sampled
sys.exit(0 if done.stdout == "True\\n" else done.returncode or 1)
"""


@pytest.mark.fast
def test_a_process_its_fork_and_a_program_it_starts_are_each_sampled_and_reported(tmp_path, capsys):
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    out = tmp_path / "samples"
    assert suite_profile.profile_command([sys.executable, str(script)], out) == 0  # no process died of SIGPROF
    # A process writes its samples as it forks and as it ends: a file or two per process, named by its pid.
    forked = {f.name.split("-")[0]: f.read_text().splitlines()[1] for f in out.glob("*.txt")}
    assert sorted(forked.values()) == ["forked\tFalse", "forked\tFalse", "forked\tTrue"]
    _, below, _ = suite_profile.read(out, REPO)
    spun = below[f"{script}:spin"] * suite_profile.INTERVAL_S
    assert spun > 0.05, below  # both spins: seconds of CPU, sampled every 5 ms
    suite_profile.report(out, REPO, top=3)
    assert f"{script}:spin" in capsys.readouterr().out
