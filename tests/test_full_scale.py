"""Full scale, proven without the real models: every full-scale task config runs end to end
from a stand-in Hugging Face mirror (tests/hub_mirror.py: tiny models and datasets under the
real repository names, in the libraries' cache layouts), offline, through the real code
paths: prefetch's check, asset preparation from the cache, the starter, the baseline agent,
rule and lineage checks, and lm-eval scoring of lm-eval's own task definitions.

What is shortened by override, to keep it fast: the budget (smoke), lm-eval's `limit`, the
baseline commands of the training tasks (smaller models, fewer steps), the calibration
anchors (given, so asset build does not train the reference), and the device (CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import hub_mirror  # noqa: E402
import warm_start  # noqa: E402
from conftest import kept_mirror, run_cli  # noqa: E402

TASKS = ["baby_lm", "edge_llm_compression", "edge_llm_training", "llm_efficiency", "llm_merging", "math_reasoning",
         "mini_pile"]  # fmt: skip
EVAL_TASKS = ["mmlu", "blimp", "boolq", "cb", "copa", "multirc", "sglue_rte", "wic", "wsc"]
ADAPTERS = f"task.scales.full.assets.adapters=[{','.join(hub_mirror.ADAPTERS)}]"


def train_small(data: str) -> str:
    return (
        f"task.scales.full.baseline_command=python train_gpt2.py --data {data} --tokenizer $MLRB_DATA/tokenizer "
        "--output submission --layers 1 --heads 2 --width 32 --context 64 --batch-size 4 --max-steps 3 --threads 1"
    )


# Per task: what keeps the stand-in run short (see the module's docstring).
FAST = {
    "baby_lm": [train_small("$MLRB_DATA/data/train.jsonl")],
    "mini_pile": [train_small("$MLRB_DATA/data/train.jsonl")],
    "edge_llm_training": [
        train_small("$MLRB_DATA/data/c4_combined_dataset/train.jsonl $MLRB_DATA/data/alpaca_cleaned/train.jsonl")
    ],
    "math_reasoning": [
        "task.scales.full.assets.n_test=4",
        "task.scales.full.baseline_command=python formalize.py --model $MLRB_DATA/base_model "
        "--data $MLRB_DATA --output submission.jsonl --steps 2 --batch-size 4 --max-new-tokens 8",
    ],
    "llm_merging": [ADAPTERS],
    "edge_llm_compression": [],
    "llm_efficiency": [],
}


@pytest.fixture(scope="session")
def mirror(tmp_path_factory) -> Path:
    """This test process's own copy of the stand-in mirror (runs write beside its files: locks,
    prepared tables), copied from the one the test cache keeps for this mirror's code."""
    hf_home = tmp_path_factory.mktemp("mirror") / "hf_home"
    shutil.copytree(kept_mirror(EVAL_TASKS), hf_home, symlinks=True)
    return hf_home


def run(args, hf_home: Path, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    """`python -m ARGS` offline on the mirror, started warm (tests/warm_start.py): the Hugging Face
    libraries read HF_HOME when they are imported, which the warm process has not done."""
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for key in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)
    return warm_start.run(args[0], list(args[1:]), cwd, env, timeout)


def full_overrides(task: str, cache_dir: Path) -> list:
    common = [f"task={task}", "task.scale=full", "budget=smoke", f"paths.cache_dir={cache_dir}",
              "task.scales.full.eval.device=cpu", "task.scales.full.hardware.gpus=0"]  # fmt: skip
    if task != "math_reasoning":  # scored with BLEU: no lm-eval limit to set
        common.append("task.scales.full.eval.limit=2")
    common += ["task.scales.full.baseline_score=0.1", "task.scales.full.reference_score=0.9"]
    if task != "llm_merging":  # its calibration merges the adapters itself: no do-nothing command
        common.append("task.scales.full.do_nothing_command=")
    return common + FAST[task]


@pytest.mark.system
def test_prefetch_offline_reports_complete_then_missing(mirror, tmp_path):
    proc = run(["mlrb.prefetch", "task=llm_merging", "task.scale=full", ADAPTERS], mirror, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "llm_merging (full): complete" in proc.stdout
    proc = run(["mlrb.prefetch", "task=baby_lm,edge_llm_compression,edge_llm_training,llm_efficiency,math_reasoning,"
                "mini_pile", "task.scale=full"], mirror, tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for task in set(TASKS) - {"llm_merging"}:
        assert f"{task} (full): complete" in proc.stdout

    # A copy of the mirror without phi-2 and one MMLU subject: each missing item is one line, exit 1.
    partial = tmp_path / "partial"
    shutil.copytree(mirror, partial, symlinks=True)
    hub_mirror.remove(partial, "model", "microsoft/phi-2")
    shutil.rmtree(partial / "datasets" / "cais___mmlu" / "virology")
    proc = run(["mlrb.prefetch", "task=edge_llm_compression", "task.scale=full"], partial, tmp_path)
    assert proc.returncode == 1
    missing = [line for line in proc.stdout.splitlines() if line.startswith("missing:")]
    assert missing == [
        "missing: edge_llm_compression: model microsoft/phi-2, for task.scales.full.assets.base_model",
        "missing: edge_llm_compression: dataset cais/mmlu (config virology), for lm-eval mmlu",
    ]
    # A full-scale run refuses to start, in one line naming what is missing; nothing is recorded.
    proc = run(["mlrb", *full_overrides("edge_llm_compression", tmp_path / "cache")], partial, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "model microsoft/phi-2" in proc.stderr and "python -m mlrb.prefetch task=edge_llm_compression" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "cache").exists()


@pytest.mark.system
@pytest.mark.parametrize("task", TASKS)
def test_full_scale_run_from_the_mirror(mirror, tmp_path, task):
    proc = run(["mlrb", *full_overrides(task, tmp_path / "cache")], mirror, tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith(f"{task}/baseline/smoke/0:"))
    assert "status ok" in line and "(valid)" in line and "score " in line, line
    # The assets came from the mirror: the stand-ins' files, copied out of the cache.
    (built,) = (tmp_path / "cache" / task).glob("full-*/manifest.json")
    assert '"source": "hub"' in built.read_text()


@pytest.mark.fast
def test_sweep_asking_for_more_gpus_than_visible_is_refused_before_it_starts(tmp_path):
    proc = run_cli("-m", "seed=1,2", "launcher=local", "hydra.launcher.slots=2", "hydra.launcher.gpus_per_job=1",
                   cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=300)  # fmt: skip  # the machine shows one GPU
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "mlrb: error: launcher: 2 slots x 1 GPU(s) need 2 GPUs but 1 are visible ([0]); "
        "lower hydra.launcher.slots or set hydra.launcher.devices"
    )
    assert not (tmp_path / "mlruns").exists()  # no sweep run was opened, so none is left RUNNING


@pytest.mark.fast
def test_scorer_environment_reads_the_users_caches_offline_on_the_runs_gpus(tmp_path):
    hf_home = tmp_path / "hf"
    table = hf_home / "datasets" / "cais___mmlu" / "virology" / "0.0.0" / hub_mirror.REVISION
    table.mkdir(parents=True)
    (table / "dataset_info.json").write_text("{}")
    (hf_home / "hub").mkdir()
    work = tmp_path / "scoring"
    probe = f"""
import json, os
from mlrb.core.config import SandboxConfig
from mlrb.scoring.runner import scorer_environment, scorer_mounts
work = {str(work)!r}
from pathlib import Path
envs = {{kind + str(ids): scorer_environment(Path(work), SandboxConfig(kind=kind, gpu_ids=ids))
        for kind, ids in [("bwrap", None), ("bwrap", ["5"]), ("docker", None)]}}
mounts = {{str(m.host): m.writable for m in scorer_mounts(Path({str(tmp_path / "assets")!r}), Path(work))}}
print(json.dumps({{"envs": envs, "mounts": mounts}}))
"""

    def probe_with(devices: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_HOME=str(hf_home), CUDA_VISIBLE_DEVICES=devices)
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    found = probe_with("2,3")  # the launcher's allocation for this run
    env = found["envs"]["bwrapNone"]
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"
    assert env["HF_HUB_CACHE"] == str((hf_home / "hub").resolve())
    view = Path(env["HF_DATASETS_CACHE"])
    assert (
        view.parent == work and (view / "cais___mmlu" / "virology" / "0.0.0" / hub_mirror.REVISION).resolve() == table
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert found["envs"]["bwrap['5']"]["CUDA_VISIBLE_DEVICES"] == "5"  # sandbox.gpu_ids wins
    assert "CUDA_VISIBLE_DEVICES" not in found["envs"]["dockerNone"]  # a container numbers its GPUs from 0
    mounts = found["mounts"]
    assert mounts[str((hf_home / "hub").resolve())] is False and mounts[str((hf_home / "datasets").resolve())] is False
    assert probe_with("")["envs"]["bwrapNone"]["CUDA_VISIBLE_DEVICES"] == ""  # a job given no GPU scores on none


@pytest.mark.fast
def test_peak_memory_counts_the_models_own_tensors_not_what_was_there_before():
    import torch

    from mlrb.tasks.model_checks import PeakMemory

    model = torch.nn.Linear(256, 256)  # 256*256*4 + 256*4 bytes of weights
    unrelated = torch.zeros(4_000_000)  # 16 MB held by someone else (say a library's workspace)
    with PeakMemory(model, "cpu") as peak:
        with torch.no_grad():
            model(torch.ones(8, 256))
    assert peak.weight_bytes == 256 * 256 * 4 + 256 * 4
    # weights + the input and output activations (8 x 256 floats each), nothing of `unrelated`
    assert peak.weight_bytes < peak.peak_bytes <= peak.weight_bytes + 2 * 8 * 256 * 4
    assert peak.allocator_peak_bytes is None  # only measured on CUDA, for the record
    del unrelated
