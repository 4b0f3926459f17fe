"""The online path of `python -m mlrb.prefetch`: the real huggingface_hub and datasets talk
HTTP (HF_ENDPOINT) to a stand-in Hub on loopback (tests/hub_server.py) that serves tiny
stand-ins (tests/hub_mirror.py) under the real repository names.

The task is mini_pile at full scale with two of its SuperGLUE evaluations, which covers
every kind of item prefetch fetches: a tokenizer (some files of a model repository), whole
models, a dataset's only config, and lm-eval datasets' named configs (one with a dot).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import hub_mirror  # noqa: E402
from hub_server import COMMIT, StandInHub  # noqa: E402

TASK = ["task=mini_pile", "task.scale=full", "task.scales.full.eval.tasks=[cb,wsc]"]
MINIPILE = "AlgorithmicResearchGroup/minipile"
ITEMS = [  # what prefetch names, in its order
    "model gpt2, for task.scales.full.assets.tokenizer",
    "model distilgpt2, for task.scales.full.known_checkpoints",
    "model gpt2, for task.scales.full.known_checkpoints",
    f"dataset {MINIPILE}, for task.scales.full.assets.dataset",
    "dataset aps/super_glue (config cb), for lm-eval cb, wsc",
    "dataset aps/super_glue (config wsc.fixed), for lm-eval cb, wsc",
]
# Real repositories hold more than a run uses (other weight formats); prefetch takes only its files.
NOT_FETCHED = {"pytorch_model.bin": b"a pickle, never to be fetched", "flax_model.msgpack": b"flax weights"}


ONE_HUB = pytest.mark.xdist_group("prefetch_hub")  # one process, so the hub starts once


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from mlrb.task_kit.hub import lm_eval_datasets

    served = tmp_path_factory.mktemp("served")
    for repo in ("gpt2", "distilgpt2"):
        hub_mirror.add_model(served, repo)
    configs, shape = hub_mirror.DATASETS[MINIPILE]
    hub_mirror.add_dataset(served, MINIPILE, configs, shape)
    hub_mirror.add_dataset(served, "aps/super_glue", lm_eval_datasets(["cb", "wsc"])["aps/super_glue"], rows=2)
    with StandInHub.from_mirror(served) as server:
        for repo in ("gpt2", "distilgpt2"):
            server.files[("model", repo)].update(NOT_FETCHED)
        yield server


def prefetch(args, hf_home: Path, hub: StandInHub, offline: bool = False) -> subprocess.CompletedProcess:
    """`python -m mlrb.prefetch ARGS` with a user's environment: HF_HOME, the Hub at the stand-in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}  # no token, no offline flags
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=hub.url)
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "mlrb.prefetch", *args], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


@pytest.mark.system
@ONE_HUB
def test_prefetch_downloads_everything_then_a_compute_node_finds_it_offline(hub, tmp_path):
    hf_home = tmp_path / "hf_home"  # an empty cache: nothing downloaded yet
    proc = prefetch(TASK, hf_home, hub)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fetching = [line for line in proc.stdout.splitlines() if line.startswith("mini_pile: fetching ")]
    assert fetching == [f"mini_pile: fetching {item} ({n}/6)" for n, item in enumerate(ITEMS, 1)]
    assert f"mini_pile (full): complete (6 items in {hf_home})" in proc.stdout
    assert "Traceback" not in proc.stderr
    asked = [path for _, path in hub.requests]
    assert any(p.startswith("/api/models/distilgpt2/revision/") for p in asked)  # it went through HTTP
    assert any(p.startswith("/datasets/aps/super_glue/resolve/") for p in asked)
    assert not [p for p in asked if p.endswith(tuple(NOT_FETCHED))], "fetched files a run never uses"
    # What landed in the cache is the served bytes, under the Hub's commit.
    snapshot = hf_home / "hub" / "models--distilgpt2" / "snapshots" / COMMIT
    assert (snapshot / "model.safetensors").read_bytes() == hub.files[("model", "distilgpt2")]["model.safetensors"]
    assert not (snapshot / "pytorch_model.bin").exists()

    # A compute node (offline, same HF_HOME): the check finds everything, and asks nothing of the Hub.
    asked_before = len(hub.requests)
    proc = prefetch(["--check", *TASK], hf_home, hub, offline=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"mini_pile (full): complete (6 items in {hf_home})" in proc.stdout
    assert "missing" not in proc.stdout + proc.stderr

    # ... and a full run's asset step (the task's `download`) and lm-eval's loader read it offline.
    probe = f"""
import json, sys
from pathlib import Path
from mlrb.prefetch import tasks_for
from mlrb.task_kit.hub import is_present, load_dataset
from mlrb.tasks.handling import hub_needs
(task,) = tasks_for(sys.argv[1:])
out = Path({str(tmp_path / "assets")!r})
params = {{k: v for k, v in dict(task.spec.assets).items() if k != "source"}}
facts = task.builder.makers["hub"](out, params)
print(json.dumps({{
    "present": {{item.describe(): is_present(item) for item in hub_needs(task)}},
    "rows": facts["rows"],
    "eval_rows": {{c: {{s: len(d) for s, d in load_dataset("aps/super_glue", c).items()}}
                  for c in ("cb", "wsc.fixed")}},
}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    found = subprocess.run([sys.executable, "-c", probe, *TASK], env=env, capture_output=True, text=True, timeout=600)
    assert found.returncode == 0, found.stderr[-4000:]
    result = json.loads(found.stdout.splitlines()[-1])
    assert result["present"] == {item: True for item in ITEMS}
    assert result["rows"] == {"train": 4, "validation": 4, "test": 4}  # the stand-in's rows per split
    assert result["eval_rows"] == {c: {"train": 2, "validation": 2} for c in ("cb", "wsc.fixed")}
    assets = tmp_path / "assets"
    served_gpt2 = hub.files[("model", "gpt2")]
    assert (assets / "public" / "tokenizer" / "tokenizer.json").read_bytes() == served_gpt2["tokenizer.json"]
    assert not (assets / "public" / "tokenizer" / "model.safetensors").exists()  # a tokenizer: files only
    assert sorted(p.name for p in assets.rglob("model.safetensors")) == ["model.safetensors"] * 2  # the checkpoints
    assert len(hub.requests) == asked_before, "offline, yet the Hub was asked"


@pytest.mark.system
@ONE_HUB
def test_items_the_hub_refuses_are_one_line_each_and_a_rerun_fetches_only_them(hub, tmp_path):
    hf_home = tmp_path / "hf_home"
    hub.fail.update({("model", "distilgpt2"): 500, ("dataset", "aps/super_glue"): 404})
    try:
        proc = prefetch(TASK, hf_home, hub)
    finally:
        hub.fail.clear()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlrb.prefetch: error: ")]
    assert errors == [
        f"mlrb.prefetch: error: mini_pile: cannot fetch {ITEMS[1]}: the Hub answered 500 Internal Server Error "
        f"to GET {hub.url}/api/models/distilgpt2/revision/main",
        f"mlrb.prefetch: error: mini_pile: cannot fetch {ITEMS[4]}: DatasetNotFoundError: "
        "Dataset 'aps/super_glue' doesn't exist on the Hub or cannot be accessed.",
        f"mlrb.prefetch: error: mini_pile: cannot fetch {ITEMS[5]}: DatasetNotFoundError: "
        "Dataset 'aps/super_glue' doesn't exist on the Hub or cannot be accessed.",
    ]
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing:")]
    assert missing == [f"missing: mini_pile: {ITEMS[i]}" for i in (1, 4, 5)]  # the others were fetched
    assert "mini_pile (full): 3 of 6 missing" in proc.stdout
    assert proc.stderr.rstrip().endswith("mlrb.prefetch: 3 item(s) missing; see above")

    # Once the Hub answers again, the same command fetches only what is missing.
    proc = prefetch(TASK, hf_home, hub)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fetching = [line for line in proc.stdout.splitlines() if line.startswith("mini_pile: fetching ")]
    assert fetching == [f"mini_pile: fetching {ITEMS[i]} ({n}/3)" for n, i in enumerate((1, 4, 5), 1)]
    assert "mini_pile (full): complete (6 items" in proc.stdout


@pytest.mark.fast
def test_an_unreachable_hub_is_one_line_and_nothing_is_tried(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}  # online, as a node that forgot the flag
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_ENDPOINT=endpoint)
    proc = subprocess.run([sys.executable, "-m", "mlrb.prefetch", *TASK], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"mlrb.prefetch: error: cannot reach the Hugging Face Hub at {endpoint} (ConnectError: [Errno 111] Connection "
        "refused); nothing fetched. Without internet, HF_HUB_OFFLINE=1 checks the cache only",
        "mlrb.prefetch: 6 item(s) missing; run this again on a machine with internet (HF_HUB_OFFLINE unset)",
    ]  # no item tried, so none of the libraries' retries (about 20 s per dataset)
    assert [line for line in proc.stdout.splitlines() if line.startswith("missing:")] == [
        f"missing: mini_pile: {item}" for item in ITEMS
    ]
