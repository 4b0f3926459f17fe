"""The processes that import large libraries and then work on (the scorer, the recording
process, whether a new interpreter or a fork of a sweep's recording server, and the warm
interpreter of the anchors' runs) keep those imports out of the cyclic garbage collector's reach:
its collections go through what the process makes afterwards, not through torch's or MLflow's
objects again. The collector is still on afterwards, so that what the process makes from then
on is collected as in any other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlrb.task_kit.warm_python import WarmPython

# The collector's state, as JSON on standard output: whether it is on, and how many objects it skips.
STATE = "import gc, json; print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))"
# The modules the processes below import, in place of torch and MLflow: quick, and made of objects.
IMPORTS = ["email.message", "http.client", "xml.dom.minidom"]


def state_after(code: str) -> tuple[bool, int]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    enabled, frozen = json.loads(result.stdout.strip().splitlines()[-1])
    return enabled, frozen


@pytest.mark.fast
def test_a_fresh_interpreter_freezes_nothing():
    assert state_after(STATE) == (True, 0)  # what the tests below are told apart from


@pytest.mark.fast
def test_the_scorer_keeps_its_imports_out_of_collections_and_collects_the_rest(tmp_path):
    request = tmp_path / "request.json"
    request.write_text("{}")  # written: the scorer's wait for it ends at once
    enabled, frozen = state_after(
        f"from pathlib import Path; from mlrb.scoring import worker; "
        f"worker.prepare({IMPORTS!r}, Path({str(request)!r})); {STATE}"
    )
    assert enabled and frozen > 10_000


@pytest.mark.fast
def test_the_recording_process_keeps_mlflow_out_of_collections_and_collects_the_rest():
    # Its serving loop replaced by a look at the collector: what it sees as it starts to serve.
    enabled, frozen = state_after(
        "import os; from mlrb.store import recording_process as process; "
        f"process.serve = lambda receiving, sending: exec({STATE!r}); "
        "reads, writes = os.pipe(); process.main([str(reads), str(writes)])"
    )
    assert enabled and frozen > 100_000  # MLflow's objects among them


@pytest.mark.fast
def test_a_script_forked_warm_has_the_server_s_imports_out_of_collections_and_collects_its_own(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "state.py").write_text(STATE.replace("print(", "open('state.json', 'w').write(") + "\n")
    environment = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8"}
    with WarmPython(str(Path(sys.executable).parent / "python"), environment, IMPORTS, tmp_path / "server") as server:
        assert server.ready
        assert server.run("python state.py", folder, environment) == (0, "")
    enabled, frozen = json.loads((folder / "state.json").read_text())
    assert enabled and frozen > 10_000


# A sweep's process that has imported MLflow starts its recording server; the process the server
# forks for a job shows the collector's state instead of recording.
SWEEP_SERVER = f"""
import os
import mlflow
from mlrb.store import recording_server
server = recording_server.start(lambda argv: exec({STATE!r}))
reads, writes = os.pipe()
served = recording_server.request(server.address, reads, writes)
print(served.stdout.read().decode().strip(), flush=True)
served.wait()
server.close()
"""


@pytest.mark.fast
def test_a_recording_process_a_sweep_s_server_forks_has_mlflow_out_of_collections_and_collects_its_own():
    enabled, frozen = state_after(SWEEP_SERVER)
    assert enabled and frozen > 100_000
