"""Every command the README and `python -m mlrb --help` show, run exactly as written.

The commands are read out of README.md's ```bash blocks and the help text, and each
must have an entry below saying how it is checked, so a command added to the
README without a check fails here. They run in a bash shell in a fresh folder whose
PATH starts with this venv's bin (`python` is the venv's, as the README says) and
where `.venv` is this venv; the tests set only environment variables (the asset
cache, and model endpoints that point at a local stand-in), never the words.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, mlflow_client
from fake_llm_server import FakeLlmServer, reply, tool
from test_docker_sandbox import docker_problem

VENV = Path(sys.prefix)

# How each documented command is checked:
#   "fast": run as written, must exit 0 (prints only);
#   "run": run as written (slow), must exit 0 and leave a FINISHED run in ./mlruns;
#   "serve": started as written, must answer HTTP on its port, then stopped;
#   "checked": its every job is composed and validated by mlrb's own pre-check (needs
#              what this machine lacks), with the reason;
#   "elsewhere": run as written by another test or by CI, named.
CHECKS = {
    "python -m mlrb --help": ("fast", ""),
    "python -m mlrb --cfg job --resolve task.scale=full": ("fast", ""),
    "python -m mlrb --cfg job --resolve task=<key> task.scale=full": ("fast", "each task key"),
    "python -m mlrb": ("run", ""),
    "python -m mlrb task=<key>": ("elsewhere", "tests/test_<task>.py: each task's baseline run (conftest.baseline_run)"),
    "python -m mlrb task=llm_merging agent=baseline seed=3": ("run", ""),
    "python -m mlrb -m seed=1,2,3": ("run", ""),
    "python -m mlrb budget=1h task.scales.tiny.eval.limit=20": ("run", ""),
    "ANTHROPIC_API_KEY=... python -m mlrb task=llm_merging agent=claude": ("run", "ANTHROPIC_BASE_URL: local stand-in"),
    "OPENAI_API_KEY=... python -m mlrb task=llm_merging agent=gpt4o": ("run", "OPENAI_BASE_URL: local stand-in"),
    "python -m mlrb agent=openai_compatible agent.options.base_url=http://127.0.0.1:8000/v1 agent.options.model=NAME": (
        "run", "a local stand-in listens on 127.0.0.1:8000"),  # fmt: skip
    "python -m mlrb agent=claude agent.options.model=NEWER-MODEL agent.options.price_input_per_mtok=3 budget=1h": (
        "run", "ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL: local stand-in"),  # fmt: skip
    "python -m mlrb sandbox=docker": ("run", "needs Docker"),
    "python -m mlrb -m seed=1,2,3,4 hydra.launcher.slots=2": ("run", ""),
    "python -m mlrb -m seed=1,2 task.scales.tiny.hardware.gpus=1 hydra.launcher.slots=2 hydra.launcher.gpus_per_job=1": (
        "run", "CUDA_VISIBLE_DEVICES=0,1: two GPU ids to share out (the tiny run computes on CPU)"),  # fmt: skip
    "python -m mlrb task=llm_merging agent=claude -m seed=1,2,3": (
        "elsewhere", "tests/test_cli.py runs it as written against a local Anthropic stand-in"),  # fmt: skip
    "python -m mlrb -m task=llm_merging agent=claude seed=1,2,3": (
        "elsewhere", "tests/test_cli.py: Hydra is handed the same command line as for the one above"),  # fmt: skip
    "python -m mlrb --config-dir DIR task=my_merging": ("elsewhere", "tests/test_user_config.py, with a real folder for DIR"),
    "python -m mlrb -m launcher=slurm tracking=server tracking.uri=http://mlflow-host:5000 budget=1h,24h seed=1,2,3": (
        "elsewhere", "tests/test_sweeps.py runs SLURM sweeps; tests/test_tracking_server.py sweeps through a server"),  # fmt: skip
    "python -m mlrb -m launcher=slurm hydra.launcher.cluster=example_gpu_cluster tracking=server tracking.uri=http://mlflow-host:5000 budget=24h seed=1,2,3": (
        "checked", "needs a GPU cluster with the profile's partition and account, and a tracking server"),  # fmt: skip
    "sudo apt-get install -y postgresql": ("elsewhere", ".ci/run installs Debian's PostgreSQL (as root, no sudo)"),
    "sudo -u postgres createuser --createdb --pwprompt mlrb": (
        "elsewhere", ".ci/run creates the role (with psql, no prompt) that tests/test_tracking_server.py uses"),  # fmt: skip
    "PGPASSWORD=... python -m mlrb.tracking serve --backend-store-uri postgresql://mlrb@localhost/mlflow --artifacts-destination /shared/mlflow-artifacts --port 5000": (
        "elsewhere", "tests/test_tracking_server.py starts it on a test database, a loopback port and a temporary folder"),  # fmt: skip
    "python -m mlrb.tracking serve": ("elsewhere", "tests/test_tracking_server.py, with a test database and port"),
    "mlflow server --backend-store-uri postgresql://mlrb@localhost/mlflow --artifacts-destination /shared/mlflow-artifacts --host 0.0.0.0 --port 5000 --allowed-hosts mlflow-host,mlflow-host:5000,localhost:5000": (
        "elsewhere", "python -m mlrb.tracking serve runs it (tests/test_tracking_server.py); needs a host named mlflow-host"),  # fmt: skip
    "python -m mlrb.report --tracking-uri http://mlflow-host:5000 --sweep 935e10cdca64 --html": (
        "elsewhere", "tests/test_tracking_server.py reads a real sweep from a real server with --tracking-uri"),  # fmt: skip
    ".venv/bin/mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db": ("serve", "5000"),
    "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db": ("serve", "5000"),
    ".venv/bin/python -m mlrb.report --html": ("run", "after the runs above"),
    "python -m mlrb.report": ("run", "after the runs above"),
    "python -m mlrb.report --sweep 935e10cdca64 --html": ("elsewhere", "tests/test_report.py, with a real sweep's id"),
    "python -m mlrb.report --task llm_merging --agent claude,gpt4o --budget 1h --out reports/merging": (
        "run", "after the runs above"),  # fmt: skip
    "bash install.sh && .venv/bin/python -m mlrb": ("elsewhere", "tests/test_packaging.py installs the package afresh; .ci/run"),
    "bash install.sh --dev && .venv/bin/python -m pytest": ("elsewhere", ".ci/run on a fresh clone"),
    "bash install.sh --dev": ("elsewhere", ".ci/run on a fresh clone"),
    ".venv/bin/python -m pytest": ("elsewhere", ".ci/run (this test is part of it)"),
    '.venv/bin/python -m pytest -m "not slow"': ("elsewhere", ".ci/run runs the whole suite"),
    ".venv/bin/ruff check mlrb": ("elsewhere", ".ci/run runs it before the tests"),
    ".venv/bin/mypy": ("elsewhere", ".ci/run runs it before the tests"),
    ".venv/bin/python benchmarks/sweep_scaling.py": ("elsewhere", "the numbers the README quotes come from it"),
    ".venv/bin/python benchmarks/overhead.py": ("elsewhere", "the numbers the README quotes come from it"),
    ".venv/bin/python benchmarks/calibration.py --seeds 5 --out calibration.json": (
        "elsewhere", "builds every task's assets and reruns its anchors per seed (an hour here); tests/test_calibration_table.py checks the README quotes its output"),  # fmt: skip
    ".venv/bin/python benchmarks/calibration.py --seeds 3 --tasks llm_merging,edge_llm_compression": (
        "elsewhere", "made benchmarks/calibration.json; tests/test_calibration_table.py checks the README quotes it"),  # fmt: skip
    ".venv/bin/python benchmarks/calibration.py --vary assets --seeds 5 --out calibration_assets.json": (
        "elsewhere", "builds every task's assets per seed (hours here); made benchmarks/calibration_assets.json, which tests/test_calibration_table.py checks the README quotes"),  # fmt: skip
    ".venv/bin/python benchmarks/calibration.py --tasks llm_efficiency --set assets.num_layers=3 --out trial.json": (
        "elsewhere", "builds five llm_efficiency designs (20 minutes here); tests/test_calibration_table.py checks what --set sets and refuses"),  # fmt: skip
    ".venv/bin/python benchmarks/gpu_check.py --out gpu_check.json": (
        "elsewhere", "needs a CUDA GPU; tests/test_gpu_check.py runs its dry run (--device cpu) and its refusal here"),  # fmt: skip
    ".venv/bin/python benchmarks/build_times.py": (
        "elsewhere", "builds all seven tasks' assets (a quarter of an hour here); the numbers the README quotes come from it"),  # fmt: skip
    "python -m mlrb task=folder task.path=/path/to/house-price task.higher_is_better=false agent=claude": (
        "elsewhere", "tests/test_folder_tasks.py runs it with tests/folder_tasks/house-price-mini and a local stand-in"),  # fmt: skip
    "python -m mlrb task=folder task.path=/path/to/mlrc-task task.scales.folder.reference_score=0.62": (
        "elsewhere", "tests/test_folder_tasks.py runs it with tests/folder_tasks/mlrc-mini"),  # fmt: skip
    "python -m mlrb.rescore RUN_ID --step 3": ("elsewhere", "tests/test_folder_tasks.py rescores steps of its runs"),
    "bash docker/build.sh": ("elsewhere", ".ci/run rebuilds the image with it"),
    "bash launchers/slurm/setup_single_node.sh": ("elsewhere", ".ci/run starts the cluster with it"),
    "python -m mlrb.prefetch task=baby_lm task.scale=full": (
        "elsewhere", "tests/test_prefetch_online.py runs prefetch online against a stand-in Hub on loopback (HF_ENDPOINT); "
                     "tests/test_full_scale.py offline for every task against a stand-in mirror"),  # fmt: skip
    "python -m mlrb.prefetch task.scale=full": (
        "elsewhere", "tests/test_full_scale.py: every task's prefetch against a stand-in mirror (offline); "
                     "tests/test_prefetch_online.py the online path against a stand-in Hub"),  # fmt: skip
    "python -m mlrb.prefetch task=llm_merging task.scale=full task.scales.full.assets.adapters=[org/a,org/b]": (
        "elsewhere", "tests/test_full_scale.py, with the stand-in mirror's adapters for org/a,org/b"),  # fmt: skip
    "HF_HUB_OFFLINE=1 python -m mlrb.prefetch task=baby_lm task.scale=full": (
        "elsewhere", "tests/test_full_scale.py runs it offline against a stand-in mirror"),  # fmt: skip
}


def readme_commands() -> list:
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+", " ", re.sub(r"\s+#\s.*$", "", line)).strip()
            if line:
                commands.append(line)
    # commands quoted in the text, `python -m mlrb ...` and `bash ...`
    commands += [re.sub(r"\s+", " ", c) for c in re.findall(r"`((?:python -m mlrb|bash )[^`]*)`", text)]
    return commands


def help_commands() -> list:
    out = subprocess.run([sys.executable, "-m", "mlrb", "--help"], capture_output=True, text=True, cwd=REPO).stdout
    found = [re.sub(r"\s+#.*$", "", line).strip() for line in out.splitlines() if line.strip().startswith("python -m mlrb")]
    found += [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Results: ")]
    return found


def test_every_documented_command_has_a_check():
    documented = set(readme_commands()) | set(help_commands())
    unchecked = sorted(documented - set(CHECKS))
    assert not unchecked, f"documented commands without a check in this file: {unchecked}"
    stale = sorted(set(CHECKS) - documented)
    assert not stale, f"checks for commands no longer documented: {stale}"
    for command, (kind, why) in CHECKS.items():
        assert kind in ("fast", "run", "serve", "checked", "elsewhere"), command
        assert kind in ("fast", "run", "serve") or why, f"{command}: say why it is not run here"


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / ".venv").symlink_to(VENV)
    return tmp_path


def shell(command: str, cwd: Path, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """The command exactly as written, in bash, `python` being this venv's."""
    full_env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("command", [c for c, (kind, _) in CHECKS.items() if kind == "fast" and "<key>" not in c])
def test_printing_commands_work_as_written(command, workdir):
    result = shell(command, workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()
    assert not (workdir / "mlruns").exists() and not (workdir / "outputs").exists()  # nothing ran


@pytest.mark.parametrize("task", ["llm_merging", "llm_efficiency", "edge_llm_compression", "math_reasoning", "baby_lm",
                                  "mini_pile", "edge_llm_training"])  # fmt: skip
def test_each_tasks_full_scale_setup_prints(task, workdir):
    result = shell(f"python -m mlrb --cfg job --resolve task={task} task.scale=full", workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"name: {task}" in result.stdout and "scale: full" in result.stdout


def test_the_gpu_cluster_sweep_validates(monkeypatch):
    from mlrb.cli import parse_command_line, precheck
    from mlrb.config import register_schema
    from mlrb.sweep import load_profile

    (command,) = [c for c, (kind, _) in CHECKS.items() if kind == "checked"]
    args = parse_command_line(command.split()[3:])
    register_schema()
    precheck(args)  # raises on a bad job
    assert args.multirun and len([o for o in args.overrides if "seed=" in o]) == 1
    assert load_profile("example_gpu_cluster")["partition"] == "gpu"


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("command", [c for c, (kind, _) in CHECKS.items() if kind == "serve"])
def test_the_mlflow_ui_command_serves_the_store(command, workdir):
    assert free(5000), "port 5000 is taken: the documented `mlflow ui` command needs it"
    env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}"}
    server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=workdir, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:5000/health", timeout=5) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow ui did not start"
                time.sleep(1)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)


SUBMIT = reply(tool("submit", summary="nothing to hand in"), usage=(500, 10))


@pytest.mark.slow
def test_the_documented_runs_work_as_written(workdir, built_cache):
    """Every "run" command, in the order the README shows them, into one store; then the reports on it."""
    runs = [c for c, (kind, _) in CHECKS.items() if kind == "run"]
    if docker_problem():  # a skip fails under CI, where Docker runs
        pytest.skip(f"`python -m mlrb sandbox=docker` needs Docker: {docker_problem()}")
    assert free(8000), "port 8000 is taken: the documented openai_compatible command needs it"
    with FakeLlmServer([SUBMIT] * 20) as vendor, FakeLlmServer([SUBMIT] * 5, port=8000):
        env = {
            "MLRB_CACHE_DIR": str(built_cache),
            "ANTHROPIC_BASE_URL": vendor.anthropic_url, "OPENAI_BASE_URL": vendor.openai_url,
            "ANTHROPIC_API_KEY": "sk-ant-documented", "CUDA_VISIBLE_DEVICES": "0,1",
        }  # fmt: skip
        for command in runs:
            result = shell(command, workdir, env)
            assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    client = mlflow_client(workdir)
    finished = [r for r in client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
                if r.info.status == "FINISHED" and r.data.tags.get("mlrb.role") != "sweep"]  # fmt: skip
    # Each command's runs; a sweep skips a job whose config already has a FINISHED run (seed 3 of
    # `-m seed=1,2,3` ran as `seed=3` before it; of `-m seed=1,2,3,4` only seed 4 is new).
    expected = ["baseline/smoke/0", "baseline/smoke/3", "baseline/smoke/1", "baseline/smoke/2", "baseline/1h/0",
                "claude/smoke/0", "gpt4o/smoke/0", "openai_compatible/smoke/0", "claude/1h/0", "baseline/smoke/0",
                "baseline/smoke/4", "baseline/smoke/1", "baseline/smoke/2"]  # fmt: skip
    assert sorted(r.info.run_name for r in finished) == sorted(f"llm_merging/{name}" for name in expected)
    assert {r.data.params["sandbox.kind"] for r in finished} == {"bwrap", "docker"}
    assert sum(r.data.params["task.scales.tiny.hardware.gpus"] == "1" for r in finished) == 2
    assert (workdir / "reports" / "summary.md").exists() and (workdir / "reports" / "report.html").exists()
    assert (workdir / "reports" / "merging" / "summary.md").exists()
