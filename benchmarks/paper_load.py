"""What the harness itself costs under a paper-scale load, compressed in time: a day of an agent's
work (a venv of many small files, data shards, checkpoint shards rewritten every few steps, hundreds
of steps, a model call each) run through the real harness (`python -m mlrb`, the default bwrap
sandbox, the SQLite store) against the project's scripted model server (tests/fake_llm_server.py).

    .venv/bin/python -m benchmarks.paper_load [--scale 1.0] [--steps 200] [--out benchmarks/paper_load.json]

The agent is Claude, scripted: its first call writes tools/step.py and runs its step 1; each later
call runs `python tools/step.py N`, which does step N's work: step 1 installs the venv (many small
files), steps 2.. write the data shards, every `--ckpt-every` steps the checkpoint shards are
rewritten in place (opened for writing, as torch.save does) with new content, every 5th step a line
is appended to a log; the other steps change nothing (an agent reading, thinking). The last runs the
task's train.py (its submission) and submits. Sizes scale with `--scale` (1.0: about 1.5 GB of
workspace and 2.6 GB of checkpoints written over the run); the output says the scale.

The task is the project's cheapest real one (tests/folder_tasks/house-price-mini), whose submission
is the whole workspace: every file the agent writes is needed for scoring, so the snapshot store keeps
every version of every file.

Printed, per step (from each snapshot's line: what taking it cost the harness) and in total: the
harness's wall and CPU time, its peak memory (the largest process of the run's tree outside the
sandbox, as benchmarks/overhead.py measures it), the snapshot store's and the record's size against
the workspace's and against the bytes the agent wrote that are still needed (each content a step's
workspace holds, once), what was uploaded to the store, and the run's overhead against the agent's
own time. The figures go to `--out` with where and how they were measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

from benchmarks import results as results_page
from benchmarks.overhead import measure
from tests.fake_llm_server import FakeLlmServer, reply, tool

REPO = Path(__file__).resolve().parent.parent
TASK = ("task=folder", f"task.path={REPO / 'tests' / 'folder_tasks' / 'house-price-mini'}")
SOURCES = ("benchmarks/paper_load.py", "mlrb/run_files/snapshots.py", "mlrb/run_files/workspace.py", "mlrb/run.py")
MIB = 1 << 20

# The agent's work, one step at a time (its sizes filled in): deterministic per step and scale.
STEP_SCRIPT = """
import os, random, sys
step, last = int(sys.argv[1]), {steps}
VENV_FILES, DATA_SHARDS, DATA_BYTES = {venv_files}, {data_shards}, {data_bytes}
CKPT_SHARDS, CKPT_BYTES, CKPT_EVERY = {ckpt_shards}, {ckpt_bytes}, {ckpt_every}

def write(path, chunks, mode="wb"):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, mode) as f:  # in place: the file's inode is kept, as torch.save keeps it
        for chunk in chunks:
            f.write(chunk)

def blob(seed, size):  # random bytes, 16 MiB at a time
    rng = random.Random(repr(seed))
    for at in range(0, size, 1 << 24):
        yield rng.randbytes(min(1 << 24, size - at))

if step == 1:  # a venv: many small files
    for i in range(VENV_FILES):
        write(f"venv/lib/pkg{{i % 200}}/mod{{i}}.py", [(f"# module {{i}}\\n" * (1 + i % 60)).encode()])
if 2 <= step < 2 + DATA_SHARDS:
    write(f"data/shard-{{step - 2}}.bin", blob(("data", step), DATA_BYTES))
if step % CKPT_EVERY == 0:  # training wrote a new checkpoint over the old one
    for shard in range(CKPT_SHARDS):
        write(f"ckpt/model-{{shard}}.bin", blob(("ckpt", step, shard), CKPT_BYTES))
if step % 5 == 0:
    write("logs/train.log", [f"step {{step}} loss {{1 / step:.4f}}\\n".encode()], "ab")
"""


def sizes(scale: float) -> dict[str, int]:
    return {"venv_files": max(100, int(20_000 * scale)), "data_shards": 4, "data_bytes": int(320 * MIB * scale),
            "ckpt_shards": 2, "ckpt_bytes": int(128 * MIB * scale)}  # fmt: skip


def script(steps: int, shape: dict[str, int]) -> list[dict]:
    """The scripted model's turns: one bash call a step, then a submit."""
    code = textwrap.dedent(STEP_SCRIPT.format(steps=steps, **shape))
    first = f"mkdir -p tools && cat > tools/step.py <<'PYEOF'\n{code}PYEOF\npython tools/step.py 1"
    turns = [reply(tool("bash", command=first, timeout_s=900))]
    for step in range(2, steps):
        turns.append(reply(tool("bash", command=f"python tools/step.py {step}", timeout_s=900)))
    turns.append(reply(tool("bash", command=f"python tools/step.py {steps} && python train.py", timeout_s=900)))
    turns.append(reply(tool("submit", summary="trained")))
    return turns


def written_bytes(steps: int, shape: dict[str, int]) -> int:
    """The bytes the agent writes over the run (every version of every file)."""
    venv = sum(len(f"# module {i}\n".encode()) * (1 + i % 60) for i in range(shape["venv_files"]))
    data = min(shape["data_shards"], max(0, steps - 1)) * shape["data_bytes"]
    ckpt = (steps // shape["ckpt_every"]) * shape["ckpt_shards"] * shape["ckpt_bytes"]
    return venv + data + ckpt


def du(path: Path) -> int:
    """Bytes PATH takes on disk (blocks, as du counts; a hard link counted once)."""
    seen, total = set(), 0
    for folder, _, names in os.walk(path):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.paper_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="sizes x this (1.0: about 4 GB of writes)")
    p.add_argument("--steps", type=int, default=200, help="the agent's steps (one model call each)")
    p.add_argument("--ckpt-every", type=int, default=25, help="the checkpoint is rewritten every N steps")
    p.add_argument("--data-gib", type=float, default=None,
                   help="the data shards' total size in GiB, written once (default: 1.25 x --scale): a large "
                        "workspace without as many checkpoint bytes")  # fmt: skip
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it (default: a temporary one)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "paper_load.json")
    args = p.parse_args()
    if args.steps < 3 or args.scale <= 0 or args.ckpt_every < 1 or (args.data_gib is not None and args.data_gib <= 0):
        p.error(f"--steps must be 3 or more, --scale and --data-gib above 0, --ckpt-every 1 or more; got {args.steps}, "
                f"{args.scale}, {args.data_gib}, {args.ckpt_every}")  # fmt: skip
    from mlrb.run_files import snapshots

    measured = results_page.provenance(sources=SOURCES)
    shape = {**sizes(args.scale), "ckpt_every": args.ckpt_every}
    if args.data_gib is not None:
        shape["data_bytes"] = int(args.data_gib * (1 << 30) / shape["data_shards"])
    wrote = written_bytes(args.steps, shape)
    print(f"paper load at scale {args.scale}: {args.steps} steps, a venv of {shape['venv_files']} files, "
          f"{shape['data_shards']} data shards of {shape['data_bytes'] // MIB} MiB, {shape['ckpt_shards']} checkpoint "
          f"shards of {shape['ckpt_bytes'] // MIB} MiB rewritten every {args.ckpt_every} steps: "
          f"{gib(wrote)} written by the agent", flush=True)  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "ANTHROPIC_API_KEY": "sk-ant-paper-load"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with (
        tempfile.TemporaryDirectory(prefix="mlrb-paper-load-") as tmp,
        FakeLlmServer(script(args.steps, shape)) as server,
    ):
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        env["ANTHROPIC_BASE_URL"] = server.anthropic_url
        run_dir = root / "run"
        argv = [sys.executable, "-m", "mlrb", *TASK, "agent=claude", f"tracking.dir={root / 'mlruns'}",
                f"hydra.run.dir={run_dir}", f"budget.max_steps={args.steps + 5}", "budget.wall_time_s=86400",
                "budget.max_input_tokens=null", "budget.max_output_tokens=null", "budget.max_usd=null",
                "sandbox.disk_gb=1000", "resume=false"]  # fmt: skip
        wall, peak_mib, tree_mib, cpu = measure(argv, root, env)
        calls = len(server.requests)
        steps = snapshots.load_steps(run_dir / "snapshots")
        lines = [json.loads(line) for line in (run_dir / "snapshots" / snapshots.STEPS).read_text().splitlines()]
        needed = sum(snapshots.needed(run_dir / "snapshots").values())
        store = du(run_dir / "snapshots")
        work = du(run_dir / "workspace")
        record = sum(du(run_dir / name) if (run_dir / name).is_dir() else (run_dir / name).stat().st_size
                     for name in ("record.jsonl", "record", "trajectory.jsonl") if (run_dir / name).exists())  # fmt: skip
        uploaded = du(root / "mlruns") - sum(f.stat().st_size for f in (root / "mlruns").glob("*.db*"))
        metrics = run_metrics(run_dir)

    took = [line.get("took_s", 0.0) for line in lines]
    took_cpu = [line.get("took_cpu_s", 0.0) for line in lines]
    unchanged = [line.get("took_s", 0.0) for prev, line in zip(lines, lines[1:], strict=False)
                 if line["tree"] == prev["tree"] and line["deleted"] == prev["deleted"]]  # fmt: skip
    agent_s = metrics.get("agent_time_s", 0.0)
    # The snapshots are taken after each step on the agent's clock: the harness's, not the agent's, work
    work_s = agent_s - sum(took)
    unchanged_cpu = [line.get("took_cpu_s", 0.0) for prev, line in zip(lines, lines[1:], strict=False)
                     if line["tree"] == prev["tree"] and line["deleted"] == prev["deleted"]]  # fmt: skip
    print(f"\n{'step':>5} {'took s':>8} {'cpu s':>7}  changed")
    for prev, line in zip([None, *lines], lines, strict=False):
        same = prev is not None and line["tree"] == prev["tree"]
        if not same or line is lines[-1] or line["step"] % 25 == 0:
            print(f"{line['step']:5d} {line.get('took_s', 0):8.3f} {line.get('took_cpu_s', 0):7.3f}  "
                  f"{'no' if same else 'yes'}")  # fmt: skip
    figures = {
        "scale": args.scale, "data_gib": args.data_gib, "steps": len(steps), "model_calls": calls, "shape": shape,
        "agent_wrote_bytes": wrote, "needed_bytes": needed, "store_bytes": store, "workspace_bytes": work,
        "record_bytes": record, "uploaded_bytes": uploaded,
        "store_over_needed": round(store / needed, 3) if needed else None,
        "run_wall_s": round(wall, 1), "agent_time_s": round(agent_s, 1),
        "overhead_s": round(wall - agent_s, 1), "agent_work_s": round(work_s, 1),
        "harness_s": round(wall - work_s, 1), "harness_peak_mib": round(peak_mib),
        "tree_peak_mib": round(tree_mib), "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "snapshot_s_total": round(sum(took), 1), "snapshot_cpu_s_total": round(sum(took_cpu), 1),
        "unchanged_step_s": {"median": round(statistics.median(unchanged), 3), "max": round(max(unchanged), 3),
                             "cpu_median": round(statistics.median(unchanged_cpu), 3),
                             "count": len(unchanged)} if unchanged else None,
        "changed_step_s_max": round(max(took), 2),
        "stage_s": {k.split(".", 1)[1]: round(v, 1) for k, v in metrics.items() if k.startswith("stage_time_s.")},
    }  # fmt: skip
    print(f"\ntotal: {len(steps)} steps, {calls} model calls; the run {wall:.0f} s, the agent's clock {agent_s:.0f} s, "
          f"of which the snapshots {sum(took):.0f} s wall ({sum(took_cpu):.0f} s CPU): the agent's own work "
          f"{work_s:.0f} s, the harness's {wall - work_s:.0f} s ({(wall - work_s) / max(work_s, 1e-9):.2f}x the agent's)")  # fmt: skip
    if unchanged:
        print(f"a step that changed nothing: median {statistics.median(unchanged):.3f} s "
              f"({statistics.median(unchanged_cpu):.3f} s CPU), max {max(unchanged):.3f} s "
              f"({len(unchanged)} steps) in a workspace of {gib(work)} (target < 1 s)")  # fmt: skip
    print(f"snapshot store {gib(store)} against {gib(needed)} still needed: {store / max(needed, 1):.2f}x (target <= 1.2x); "
          f"the agent wrote {gib(wrote)}, its workspace holds {gib(work)}")  # fmt: skip
    print(f"record {record / MIB:.1f} MiB; uploaded to the store {uploaded / MIB:.1f} MiB (record.snapshots=small)")
    print(f"the run's stages (s): {', '.join(f'{k} {v}' for k, v in figures['stage_s'].items())}")
    print(f"harness peak memory {peak_mib:.0f} MiB (target < 1024 MiB); CPU s by process: "
          f"{', '.join(f'{k} {v:.1f}' for k, v in cpu.items())}")  # fmt: skip
    args.out.write_text(json.dumps({"measured": measured, "figures": figures}, indent=2) + "\n")
    print(f"written to {args.out}")


def run_metrics(run_dir: Path) -> dict[str, float]:
    """The run's last value of each metric, from its record."""
    from mlrb.store import record

    return {name: history[-1][1] for name, history in record.fold(record.read(run_dir))["metrics"].items()}


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def paper_load_section(bench_dir: Path) -> str:
    data = results_page.load(bench_dir, "paper_load.json")
    f = data["figures"]
    gib = 1024**3
    unchanged = f["unchanged_step_s"]
    rows = [
        ["workspace at the end", f"{f['workspace_bytes'] / gib:.2f} GiB", ""],
        ["bytes the agent wrote, still needed for scoring", f"{f['needed_bytes'] / gib:.2f} GiB", ""],
        ["snapshot store", f"{f['store_bytes'] / gib:.2f} GiB ({f['store_over_needed']:.2f}x needed)", "at most 1.2x"],
        [
            "a step that changed nothing",
            f"median {unchanged['median']:.2f} s, worst {unchanged['max']:.2f} s ({unchanged['count']} steps)",
            "under 1 s",
        ],  # fmt: skip
        ["the harness's peak memory", f"{f['harness_peak_mib']} MiB", "under 1 GiB"],
        ["uploaded to the tracking store", f"{f['uploaded_bytes'] / 1024**2:.0f} MiB", ""],
        ["the run's record", f"{f['record_bytes'] / 1024**2:.1f} MiB", ""],
        ["snapshots, all steps", f"{f['snapshot_s_total']:.0f} s ({f['snapshot_cpu_s_total']:.0f} s CPU)", ""],
    ]
    shape = f["shape"]
    data_option = f" --data-gib {f['data_gib']:g}" if f.get("data_gib") else ""
    return "\n\n".join([
        f"A day of paper-scale work compressed in time, through the real harness (bwrap, SQLite store): "
        f"{f['steps']} steps and {f['model_calls']} model calls against a scripted model server, a venv of "
        f"{shape['venv_files']:,} files, {shape['data_shards']} data shards of {shape['data_bytes'] / 1024**2:.0f} MiB and "
        f"{shape['ckpt_shards']} checkpoint shards of {shape['ckpt_bytes'] / 1024**2:.0f} MiB rewritten every "
        f"{shape['ckpt_every']} steps (scale {f['scale']:g}; `--scale` grows it, `--data-gib` the data alone).",
        "Measured with:",
        results_page.commands(f"-m benchmarks.paper_load{data_option} --out benchmarks/paper_load.json"),
        "Output: `benchmarks/paper_load.json`.",
        results_page.table(["what", "figure", "target"], rows),
        results_page.provenance_table([("`paper_load.json`", data.get("measured"))]),
    ])  # fmt: skip


SECTION = results_page.Section(
    "A day of paper-scale work", order=36, reads=("paper_load.json",), render=paper_load_section,
    sources=SOURCES[1:],
)  # fmt: skip


if __name__ == "__main__":
    main()
