"""python -m mlrb.export harbor TASK [--scale SCALE] --out DIR: one of mlrb's packaged tasks as a
Harbor task folder (Terminal-Bench's harness):

- `instruction.md`: the agent's prompt as mlrb renders it (mlrb/harness/instructions.py), for a
  workspace at /app that also holds the task's data ($MLRB_DATA=/app);
- `task.toml`: the scale's limits (agent and verifier time, cpus, memory, gpus) in the field
  names of Harbor's own TaskConfig;
- `environment/`: a Dockerfile FROM the project's sandbox image, and the agent's starting files:
  the task's starter files and its *public* assets, copied to /app;
- `tests/`: the judge, which Harbor copies in only after the agent stopped: the task's hidden
  assets, a pristine copy of the public ones, the task's config, the mlrb package that holds
  the scorer, and `test.sh`, which scores /app with it and writes /logs/verifier/reward.json;
- `solution/solve.sh`: the scale's baseline command (the normalised scale's 0).

The assets are those of mlrb's asset cache (built there first when they are not). Bad input is
one line on stderr, exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

PROG = "python -m mlrb.export harbor"
WORKDIR = "/app"  # the workspace in the image; $MLRB_DATA too
BASE_IMAGE = "mlrb-sandbox:latest"  # mlrb/conf/sandbox/docker.yaml's image
JUDGE = "judge"  # tests/judge: the mlrb package the verifier imports
ASSETS = "assets"  # tests/assets/{public,hidden}: what the scorer reads
BUILD_TIMEOUT_S = 600.0

TEST_SH = """#!/bin/bash
# Harbor's verifier for mlrb's task {task} ({scale} scale): scores the workspace ({workdir}) with
# mlrb's own judge (tests/judge, the mlrb package that exported it), on the held-out assets in
# tests/assets, and writes /logs/verifier/reward.json: "reward" the score (0 when the submission
# is invalid), "valid" 1 or 0. A scorer that fails writes no reward (the verifier is broken).
# It needs a Python with mlrb's libraries (torch, transformers, peft, lm-eval): $MLRB_PYTHON, else
# the one that exported it (mlrb's Docker sandbox mounts it), else python3 on the PATH.
set -euo pipefail
TESTS="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
PYTHON="${{MLRB_PYTHON:-{python}}}"
command -v "$PYTHON" > /dev/null 2>&1 || PYTHON=python3
SCRATCH="$(mktemp -d)"
mkdir -p /logs/verifier
cd {workdir}
HF_HOME="$SCRATCH/hf_home" HF_DATASETS_CACHE="$SCRATCH/hf_datasets" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$TESTS/{judge}" \\
    "$PYTHON" "$TESTS/score.py" "$TESTS" "{workdir}" "$SCRATCH" /logs/verifier
"""

SCORE_PY = '''"""Scores the workspace with mlrb's judge of the task: python score.py TESTS WORKSPACE SCRATCH LOGS."""

import json
import sys
from pathlib import Path

from mlrb.core import registry
from mlrb.core.config import TaskConfig

tests, workspace, scratch, logs = map(Path, sys.argv[1:5])
config = TaskConfig(**json.loads((tests / "task.json").read_text()))
task = registry.load_task(config)
report = task.judge.score(workspace / config.submission, tests / "assets", scratch)
facts = report.to_dict()
(logs / "score_report.json").write_text(json.dumps(facts, indent=2, default=float))
reward = float(report.score) if report.valid and report.score is not None else 0.0
(logs / "reward.json").write_text(json.dumps({"reward": reward, "valid": int(bool(report.valid))}))
print(f"valid: {report.valid} ({report.reason}); score: {report.score}")
'''

SOLVE_SH = """#!/bin/bash
# The baseline of mlrb's task {task} ({scale} scale): the normalised score's 0.
# No dollar-brace variables here: mlrb's Harbor route reads this file into its config (an interpolation there).
set -eo pipefail
[ -e {marker} ] || cd {workdir}  # Harbor's workspace, unless this is run in one already
[ -n "$MLRB_DATA" ] || export MLRB_DATA={workdir}
{command}
"""


class BadInput(Exception):
    """One line for the user: a bad value and what would be valid."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("task", help="a packaged task's name, e.g. llm_merging")
    p.add_argument("--scale", default=None, help="the task's scale (its default scale unless given), e.g. tiny")
    p.add_argument("--out", type=Path, required=True, help="the task folder to write (new, or an empty folder)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="mlrb's asset cache the assets come from (default: paths.cache_dir, ~/.cache/mlrb)",
    )
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        check_out(args.out)
        cfg = composed(args.task, args.scale)
        from mlrb.core.config import ConfigError

        try:
            from mlrb.core import registry

            task = registry.load_task(cfg.task)
            if task.setup.check_config:
                task.setup.check_config()
        except ConfigError as e:
            raise BadInput(str(e)) from None
    except BadInput as e:
        print(f"mlrb.export harbor: error: {e}", file=sys.stderr)
        return 2
    from mlrb.harness.assets import prepare

    assets = prepare(task, args.cache_dir or Path(cfg.paths.cache_dir)).path
    write_folder(task, cfg, assets, args.out)
    print(
        f"{args.out}: Harbor task {task.name} ({task.scale} scale), public assets in environment/, "
        f"hidden in tests/ (from {assets})"
    )
    return 0


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file: give a new folder, or an empty one")
    if out.is_dir() and any(out.iterdir()):
        raise BadInput(f"--out {out} is a folder that is not empty: give a new folder, or an empty one")


def composed(name: str, scale: str | None) -> Any:
    """The run's config for `task=NAME [task.scale=SCALE]`, as `python -m mlrb` composes it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlrb.core import registry
    from mlrb.core.config import CONF_DIR, ConfigError, register_schema, to_typed

    packaged = sorted(set(registry.task_folders()) - registry.folder_loaders())
    if name not in packaged:
        raise BadInput(f"unknown task '{name}': the packaged tasks are {', '.join(packaged)}")
    register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="mlrb_export"):
            raw = compose(config_name="config", overrides=[f"task={name}"])
            scales = list(raw.task.scales)
            if scale is not None and scale not in scales:
                raise BadInput(f"task {name} has no scale '{scale}': its scales are {', '.join(scales)}")
            if scale is not None:
                raw.task.scale = scale
            return to_typed(raw)
    except ConfigError as e:
        raise BadInput(str(e)) from None
    finally:
        GlobalHydra.instance().clear()


def write_folder(task: Any, cfg: Any, assets: Path, out: Path) -> None:
    """The whole folder, written beside OUT and moved there at the end: nothing half-written."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(staging, task, cfg, assets)
        if out.is_dir():
            out.rmdir()  # empty (checked)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def fill(folder: Path, task: Any, cfg: Any, assets: Path) -> None:
    import dataclasses

    import mlrb
    from mlrb.harness import instructions

    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    env = folder / "environment"
    env.mkdir()
    starter, public = task.start.files(assets), assets / "public"
    entries: dict[str, Path] = {}
    for source in (starter, public):
        for item in sorted(source.iterdir()) if source.is_dir() else []:
            if item.name in ("__pycache__",) or item.name in entries:
                continue
            entries[item.name] = item
    for name, item in entries.items():
        if item.is_dir():
            shutil.copytree(item, env / name, ignore=skip)
        else:
            shutil.copy2(item, env / name)
    copies = "\n".join(f"COPY {name} {WORKDIR}/{name}" for name in entries)
    (env / "Dockerfile").write_text(
        f"# mlrb's task {task.name} ({task.scale} scale), exported by `{PROG}`: the project's sandbox image\n"
        f"# (bash docker/build.sh) with the task's starter files and public assets as the workspace.\n"
        f"FROM {BASE_IMAGE}\nWORKDIR {WORKDIR}\n{copies}\nENV MLRB_DATA={WORKDIR}\n"
    )

    budget = dataclasses.replace(cfg.budget, wall_time_s=float(task.start.time_limit_s))
    prompt = instructions.render(task, budget, WORKDIR, WORKDIR)
    prompt = prompt.removesuffix(instructions.clock_note(WORKDIR))  # no harness writes the clock file
    (folder / "instruction.md").write_text(prompt)
    (folder / "task.toml").write_text(task_toml(task, cfg))

    tests = folder / "tests"
    tests.mkdir()
    shutil.copytree(public, tests / ASSETS / "public", ignore=skip)
    shutil.copytree(assets / "hidden", tests / ASSETS / "hidden", ignore=skip)
    shutil.copytree(Path(mlrb.__file__).parent, tests / JUDGE / "mlrb", ignore=skip)
    (tests / "task.json").write_text(json.dumps(task.scorer_config(), indent=2))
    (tests / "score.py").write_text(SCORE_PY)
    test_sh = TEST_SH.format(task=task.name, scale=task.scale, workdir=WORKDIR, python=sys.executable, judge=JUDGE)
    write_script(tests / "test.sh", test_sh)

    marker = next(iter(entries), "submission")
    solve = SOLVE_SH.format(
        task=task.name, scale=task.scale, marker=marker, workdir=WORKDIR, command=task.baseline_command().strip()
    )
    (folder / "solution").mkdir()
    write_script(folder / "solution" / "solve.sh", solve)


def write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def task_toml(task: Any, cfg: Any) -> str:
    """task.toml in the field names of Harbor's TaskConfig (harbor.models.task.config)."""
    hw = task.hardware
    environment: dict[str, Any] = {"build_timeout_sec": BUILD_TIMEOUT_S}
    if hw.cpus:
        environment["cpus"] = int(hw.cpus)
    if hw.memory_gb:
        environment["memory_mb"] = int(round(float(hw.memory_gb) * 1024))
    if hw.gpus:  # none: left out (Harbor's default; mlrb's reader takes only a positive count)
        environment["gpus"] = int(hw.gpus)
    if hw.gpu_type:
        environment["gpu_types"] = [str(hw.gpu_type)]
    environment["network_mode"] = "public" if task.rules.network else "no-network"
    tables = {
        "metadata": {"source": "mlrb", "mlrb_task": task.name, "mlrb_scale": task.scale, "title": task.start.title},
        "verifier": {"timeout_sec": float(task.judge.timeout_s)},
        "agent": {"timeout_sec": float(task.start.time_limit_s)},
        "environment": environment,
    }
    lines = ['schema_version = "1.1"']
    for name, values in tables.items():
        lines += ["", f"[{name}]"] + [f"{key} = {toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these characters
