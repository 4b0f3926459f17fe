"""The GPU checks, as one command for a machine with a CUDA GPU and mlrb installed with a
CUDA build of torch (`MLRB_TORCH=... bash install.sh`):

    .venv/bin/python -m benchmarks.gpu_check [--tasks a,b] [--parts tiny,pinning,full]
        [--gpu 0] [--work DIR] [--out gpu_check.json]

Four parts. The first three run as a user runs it (`python -m mlrb ...` in a subprocess, the
baseline agent, the default bwrap sandbox, HF_HUB_OFFLINE=1), read back from each run's MLflow store:

- tiny: every tiny task twice, its evaluation on `cpu` then on `cuda`
  (`task.scales.tiny.eval.device`, and `hardware.gpus=1` so the sandboxes see the GPU's
  device nodes), on GPU `--gpu` (CUDA_VISIBLE_DEVICES, as a launcher sets it). The same
  submission's scores should agree (float kernels differ: printed to 4 places, and the
  difference), both valid or both invalid; for the memory-limited tasks the measured peak
  (the submission's own tensors) and its verdict should be the same on both devices, the
  CUDA allocator's peak is printed for the record.
- pinning: `edge_llm_compression` tiny with its evaluation on `cuda` but the run given no
  GPU (CUDA_VISIBLE_DEVICES=""), as a sweep's job that asked for none: its scorer must not
  reach a GPU (no `cuda_allocator_peak_mb` recorded: it failed or fell back to the CPU),
  where the same run given GPU `--gpu` records one.
- full: every full-scale task from the stand-in mirror (tests/hub_mirror.py; the shortened
  overrides of tests/test_full_scale.py) with its evaluation on `cuda`: status ok, valid.
- devices: a bwrap sandbox for a run given GPU `--gpu` (its first), as a run's: inside, the
  /dev/nvidia* nodes must be that GPU's and the control nodes only, torch must see exactly one
  GPU, and the same after the command sets CUDA_VISIBLE_DEVICES to every GPU of the node.

`--device cpu` puts `cpu` where `cuda` would be: a dry run of the script itself on a
machine without a GPU (its tiny part then compares cpu with cpu, pinning and devices are skipped).

Assets are built into `--cache-dir` (default `--work`/cache) and kept, as is the mirror:
run the parts in several calls where one command may only run so long. Prints one table
per part and writes every figure to `--out`. Exits 1, naming each, when a check fails: a run
not ok, cpu and device disagreeing on validity or on the score by more than `--tolerance`,
the pinning run reaching the GPU, a full-scale run not ok and valid, a sandbox with another
GPU's node or torch seeing other than one GPU in it. tests/test_gpu_check.py runs the dry run
and feeds `failed_checks` mismatching results; tests/test_sandbox_gpus.py runs the devices part
on a GPU node it makes (device nodes and the driver's /proc files, no torch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = ["llm_merging", "llm_efficiency", "edge_llm_compression", "math_reasoning", "baby_lm", "mini_pile",
         "edge_llm_training"]  # fmt: skip
PARTS = ("tiny", "pinning", "full", "devices")
MEMORY_METRICS = ("peak_memory_mb", "weight_memory_mb", "cuda_allocator_peak_mb")
# How far the device's score may be from the cpu's: float kernels differ, so an item or two
# on a near tie may flip (llm_merging's tiny test set: 240 items, 0.004 each). The tiny tasks'
# scores are shares in [0, 1]; math_reasoning's BLEU is on 0-100 and gets 100 times this.
TOLERANCE = 0.01


def mlrb_run(overrides: list[str], folder: Path, env: dict[str, str], timeout_s: int = 3600) -> dict:
    """`python -m mlrb OVERRIDES` recording into folder/mlruns; what its run recorded."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "mlrb", *overrides, f"tracking.dir={folder / 'mlruns'}",
            f"hydra.run.dir={folder / 'run'}"]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - started
    (folder / "output.log").write_text(proc.stdout + proc.stderr)
    record = {"exit": proc.returncode, "wall_s": round(wall, 1), "log": str(folder / "output.log")}
    if not (folder / "mlruns" / "mlflow.db").exists():
        record["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return record
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlruns' / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments, order_by=["attribute.start_time DESC"], max_results=1)
    tags, metrics = run.data.tags, run.data.metrics
    record.update(
        status=tags.get("mlrb.status"), valid=tags.get("mlrb.valid"), score=metrics.get("score"),
        score_time_s=metrics.get("score_time_s"), reason=tags.get("mlrb.invalid_reason") or tags.get("mlrb.error"),
        **{name: metrics[name] for name in MEMORY_METRICS if name in metrics},
    )  # fmt: skip
    return record


def cell(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tiny_part(tasks: list[str], device: str, gpu: str, work: Path, cache: Path, env: dict[str, str]) -> dict:
    results: dict = {}
    print(f"\ntiny tasks, evaluation on cpu and on {device} (GPU {gpu}):", flush=True)
    print(f"  {'task':22s} {'status cpu/' + device:>22s} {'score cpu':>10s} {'score ' + device:>11s} "
          f"{'diff':>9s} {'peak MB cpu/' + device:>20s} {'allocator MB':>13s}")  # fmt: skip
    for task in tasks:
        runs = {}
        for label, on in (("cpu", "cpu"), ("device", device)):
            overrides = [f"task={task}", f"paths.cache_dir={cache}", f"task.scales.tiny.eval.device={on}"]
            if on == "cuda":
                overrides.append("task.scales.tiny.hardware.gpus=1")
            runs[label] = mlrb_run(overrides, work / "tiny" / task / label, {**env, "CUDA_VISIBLE_DEVICES": gpu})
        cpu, other = runs["cpu"], runs["device"]
        scores = (cpu.get("score"), other.get("score"))
        diff = abs(scores[0] - scores[1]) if None not in scores else None
        peaks = f"{cell(cpu.get('peak_memory_mb'), 2)}/{cell(other.get('peak_memory_mb'), 2)}"
        print(f"  {task:22s} {cell(cpu.get('status')) + '/' + cell(other.get('status')):>22s} "
              f"{cell(cpu.get('score')):>10s} {cell(other.get('score')):>11s} {cell(diff, 6):>9s} {peaks:>20s} "
              f"{cell(other.get('cuda_allocator_peak_mb'), 2):>13s}", flush=True)  # fmt: skip
        for on, record in runs.items():
            if record.get("status") != "ok":
                print(f"    {on}: {record.get('status') or 'exit ' + str(record['exit'])}: {record.get('reason') or ''}"
                      f" (log: {record['log']})")  # fmt: skip
        results[task] = {**runs, "score_difference": diff}
    return results


def pinning_part(gpu: str, work: Path, cache: Path, env: dict[str, str]) -> dict:
    task = "edge_llm_compression"
    overrides = [f"task={task}", f"paths.cache_dir={cache}", "task.scales.tiny.eval.device=cuda",
                 "task.scales.tiny.hardware.gpus=1"]  # fmt: skip
    given = mlrb_run(overrides, work / "pinning" / "given", {**env, "CUDA_VISIBLE_DEVICES": gpu})
    none = mlrb_run(overrides, work / "pinning" / "none", {**env, "CUDA_VISIBLE_DEVICES": ""})
    kept_off = "cuda_allocator_peak_mb" not in none and "cuda_allocator_peak_mb" in given
    print(f"\npinning ({task}, evaluation on cuda): given GPU {gpu}: {given.get('status')}, allocator peak "
          f"{cell(given.get('cuda_allocator_peak_mb'), 2)} MB; given none: {none.get('status')}, allocator peak "
          f"{cell(none.get('cuda_allocator_peak_mb'), 2)} MB ({none.get('reason') or 'no reason recorded'}): "
          f"{'the scorer reached no GPU' if kept_off else 'CHECK: not as expected'}")  # fmt: skip
    return {"given": given, "none": none, "scorer_kept_off_the_gpu": kept_off}


def full_part(tasks: list[str], device: str, gpu: str, work: Path, env: dict[str, str]) -> dict:
    from tests import hub_mirror, test_full_scale

    hf_home = work / "hf_home"
    if not (hf_home / "hub").is_dir():
        print("\nbuilding the stand-in mirror...", flush=True)
        hub_mirror.build_mirror(hf_home, test_full_scale.EVAL_TASKS)
    full_env = {**env, "HF_HOME": str(hf_home), "CUDA_VISIBLE_DEVICES": gpu}
    for key in ("HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        full_env.pop(key, None)
    results = {}
    print(f"\nfull-scale stand-ins, evaluation on {device} (GPU {gpu}):", flush=True)
    for task in tasks:
        cpu_only = ("task.scales.full.eval.device=", "task.scales.full.hardware.gpus=")
        overrides = [o for o in test_full_scale.full_overrides(task, work / "full-cache") if not o.startswith(cpu_only)]
        overrides += [f"task.scales.full.eval.device={device}",
                      f"task.scales.full.hardware.gpus={1 if device == 'cuda' else 0}"]  # fmt: skip
        record = mlrb_run(overrides, work / "full" / task, full_env)
        print(f"  {task:22s} {cell(record.get('status')):>14s} valid {cell(record.get('valid')):5s} "
              f"score {cell(record.get('score'))} scoring {cell(record.get('score_time_s'), 1)} s "
              f"wall {record['wall_s']} s {record.get('reason') or ''}", flush=True)  # fmt: skip
        results[task] = record
    return results


# Run in the sandbox: its GPU device nodes, its CUDA_VISIBLE_DEVICES and (torch_inside) torch's GPU count.
DEVICE_PROBE = """
import glob, json, os, sys
count = None
if sys.argv[1] == "1":
    import torch
    count = torch.cuda.device_count()
print(json.dumps({"nodes": sorted(glob.glob("/dev/nvidia*")), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "torch": count}))
"""


def devices_part(gpu: str, work: Path, torch_inside: bool = True) -> dict:
    """A bwrap sandbox for a run given GPU `gpu` (CUDA_VISIBLE_DEVICES, as a launcher sets it)
    whose task asks for one: which /dev/nvidia* it has, and how many GPUs torch sees there, as
    is and asking for every GPU of the node. The node is mlrb.sandbox.gpus.DEV and DRIVER."""
    from mlrb.core.config import SandboxConfig
    from mlrb.sandbox import gpus
    from mlrb.sandbox.base import Limits
    from mlrb.sandbox.bwrap import BwrapSandbox

    workspace = work / "devices" / "workspace"
    (workspace / "data").mkdir(parents=True, exist_ok=True)
    (workspace / "probe.py").write_text(DEVICE_PROBE)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        view = gpus.run_gpus(1, None, os.environ, gpus.DEV, gpus.DRIVER)
        sandbox = BwrapSandbox(SandboxConfig(), workspace, workspace / "data", "gpu-check-devices", Limits(gpus=1))
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    every = ",".join(str(i) for i in range(len(gpus.driver_gpus(gpus.DRIVER))))
    seen = {}
    try:
        for label, prefix in (("", ""), ("_asking_for_all", f"export CUDA_VISIBLE_DEVICES={every}; ")):
            result = sandbox.exec(f"{prefix}python probe.py {int(torch_inside)}", timeout_s=300)
            if result.exit_code != 0:
                raise RuntimeError(f"the devices probe failed in the sandbox: {result.stderr.strip()[-500:]}")
            seen[label] = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        sandbox.close()
    found = {
        "gpu": gpu,
        "expected": sorted(f"/dev/{node.name}" for node in view.nodes),
        "host": sorted(f"/dev/{node.name}" for node in gpus.DEV.glob("nvidia*")),
        "visible": seen[""]["visible"],
        **{f"inside{label}": probe["nodes"] for label, probe in seen.items()},
        **{f"torch_devices{label}": probe["torch"] for label, probe in seen.items()},
    }
    others = sorted(set(found["host"]) - set(found["inside"]))
    print(f"\ndevices (a bwrap sandbox given GPU {gpu}): inside {' '.join(found['inside']) or 'none'}; "
          f"absent {' '.join(others) or 'none'}; CUDA_VISIBLE_DEVICES={found['visible']}; torch sees "
          f"{cell(found['torch_devices'])} GPU(s), {cell(found['torch_devices_asking_for_all'])} asking for all",
          flush=True)  # fmt: skip
    return found


def devices_failures(found: dict) -> list[str]:
    failed = []
    for label, shown, asking in (("", "", ""), ("_asking_for_all", " (asking for every GPU)", " asking for every GPU")):
        inside, expected = found[f"inside{label}"], found["expected"]
        failed += [f"devices: the sandbox for GPU {found.get('gpu', '0')} has {node}{shown}"
                   for node in inside if node not in expected]  # fmt: skip
        failed += [f"devices: the sandbox lacks {node}{shown}" for node in expected if node not in inside]
        count = found.get(f"torch_devices{label}")
        if count is not None and count != 1:
            failed.append(f"devices: torch in the sandbox sees {count} GPU(s){asking}, not 1")
    if found.get("visible") != "0":
        failed.append(f"devices: CUDA_VISIBLE_DEVICES in the sandbox is {found.get('visible')!r}, not '0'")
    return failed


def failed_checks(results: dict, tolerance: float = TOLERANCE) -> list[str]:
    """One line for each check the results fail; empty when the device agrees with the cpu."""
    failed = []
    for task, runs in results.get("tiny", {}).items():
        for side in ("cpu", "device"):
            if runs[side].get("status") != "ok":
                failed.append(
                    f"tiny {task} on {side}: status {runs[side].get('status') or 'exit ' + str(runs[side].get('exit'))}"
                )
        cpu, device = runs["cpu"], runs["device"]
        if cpu.get("valid") != device.get("valid"):
            failed.append(f"tiny {task}: valid {cpu.get('valid')} on cpu, {device.get('valid')} on the device")
        allowed = tolerance * (100 if task == "math_reasoning" else 1)
        diff = runs.get("score_difference")
        if cpu.get("score") is not None or device.get("score") is not None:
            if diff is None or diff > allowed:
                failed.append(f"tiny {task}: score {cell(cpu.get('score'))} on cpu, {cell(device.get('score'))} "
                              f"on the device (difference {cell(diff, 6)} > {allowed})")  # fmt: skip
    pinning = results.get("pinning")
    if pinning is not None and not pinning["scorer_kept_off_the_gpu"]:
        failed.append("pinning: a run given no GPU reached one (or the run given one recorded no allocator peak)")
    for task, record in results.get("full", {}).items():
        if record.get("status") != "ok" or record.get("valid") != "True":
            failed.append(f"full {task}: status {record.get('status')}, valid {record.get('valid')}")
    if "devices" in results:
        failed += devices_failures(results["devices"])
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: all seven)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run without a GPU")
    parser.add_argument("--gpu", default="0", help="the GPU the runs are given (CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--work", default="gpu_check", help="runs, asset cache and mirror (kept between calls)")
    parser.add_argument("--cache-dir", default=None, help="tiny tasks' asset cache (default: WORK/cache)")
    parser.add_argument("--out", default=None, help="write every figure here as JSON")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest score difference cpu/device")
    args = parser.parse_args()
    tasks, parts = args.tasks.split(","), args.parts.split(",")
    for name, chosen, valid in (("--tasks", tasks, TASKS), ("--parts", parts, PARTS)):
        unknown = sorted(set(chosen) - set(valid))
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)}; valid: {', '.join(valid)}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error(
                f"--device cuda: torch {torch.__version__} sees no CUDA GPU here (use --device cpu to dry-run)"
            )
    work = Path(args.work).resolve()
    cache = Path(args.cache_dir).resolve() if args.cache_dir else work / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)

    results: dict = {"device": args.device, "gpu": args.gpu}
    if args.device == "cuda":
        results["gpu_name"] = torch.cuda.get_device_name(int(args.gpu.split(",")[0]))
        print(f"GPU {args.gpu}: {results['gpu_name']}, torch {torch.__version__}")
    if "tiny" in parts:
        results["tiny"] = tiny_part(tasks, args.device, args.gpu, work, cache, env)
    if "pinning" in parts:
        if args.device == "cuda":
            results["pinning"] = pinning_part(args.gpu, work, cache, env)
        else:
            print("\npinning: skipped (--device cpu: there is no GPU to keep a run off)")
    if "full" in parts:
        results["full"] = full_part(tasks, args.device, args.gpu, work, env)
    if "devices" in parts:
        if args.device == "cuda":
            results["devices"] = devices_part(args.gpu.split(",")[0], work)
        else:
            print("\ndevices: skipped (--device cpu: there is no GPU device node to keep from a run)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    failed = failed_checks(results, args.tolerance)
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
