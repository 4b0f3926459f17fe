"""benchmarks/suite_profile.py: every Python process a command starts samples its own stack, a fork
from the fork on, and a program started with a preexec_fn is not killed by the sampler's timer."""

from __future__ import annotations

import re
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


# A sample that lands while a process writes its counts (before a fork the timer is still on), each
# in a function not seen before: a stack new to the counts as they are being written.
SAMPLED_MID_WRITE = """
import builtins, itertools, signal, types
import sitecustomize as sampler

sampler.state["counts"][("a.py:f",)] += 1
landed = itertools.count()


class Landing:
    def __init__(self, file):
        self.file = file

    def write(self, text):
        code = types.SimpleNamespace(co_filename="b.py", co_name=f"g{next(landed)}")
        sampler.sample(signal.SIGPROF, types.SimpleNamespace(f_code=code, f_back=None))
        return self.file.write(text)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


sampler.open = lambda *args, **kwargs: Landing(builtins.open(*args, **kwargs))
sampler.stop()
sampler.write()  # what landed while the first counts were written, in a file of its own
"""


@pytest.mark.fast
def test_a_sample_that_lands_while_the_counts_are_written_is_kept_for_the_next_write(tmp_path):
    import os
    import subprocess

    out = tmp_path / "samples"
    env = {**os.environ, "PYTHONPATH": str(suite_profile.SAMPLER), "MLRB_PROFILE_DIR": str(out)}
    done = subprocess.run([sys.executable, "-c", SAMPLED_MID_WRITE], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    # One file per write (the last as the process ended): the counts as they were, then what landed
    # while each file was written.
    written = [f.read_text().splitlines()[2:] for f in sorted(out.glob("*.txt"), key=lambda f: f.name.split("-")[1])]
    assert written[0] == ["1\ta.py:f"], written
    assert written[1] and all(re.fullmatch(r"1\tb\.py:g\d+", line) for line in written[1]), written
