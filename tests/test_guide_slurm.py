"""The how-to guide docs/how-to/slurm-claude-code.md, run as its page writes it: on the one-node SLURM
cluster (launchers/slurm/setup_single_node.sh), Claude Code's real program against the scripted model
API (tests/fake_llm_server.py), logging to an MLflow server on loopback.

The page's first block sets the site's values (`export NAME=...`); the test gives those names its own
values instead and runs every other block as written, in order, from the page, so the page and this
test cannot drift. The full-scale sweep is checked as the command checks it before submitting (every
job composed and pre-checked): it needs GPUs and the real models."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from fake_llm_server import FakeLlmServer, reply, tool
from test_documented_commands import VENV, Block, assert_prints_what_is_shown, blocks_of, shell
from test_sweeps import own_slurm_jobs, slurm_problem
from test_tracking_server import free_port

pytestmark = [pytest.mark.system, pytest.mark.skipif(bool(slurm_problem()), reason=slurm_problem() or "slurm ok")]

PAGE = "docs/how-to/slurm-claude-code.md"
KEY = "sk-ant-guide-slurm-real-key-777"
SEEDS = 5  # the page's seed=1,2,3,4,5
MERGE = 'python merge.py --data "$MLRB_DATA" --output submission'


def site_block(blocks: list[Block]) -> Block:
    (block,) = [b for b in blocks if b.commands and all(c.startswith("export ") for c in b.commands)]
    return block


def site_names(block: Block) -> list[str]:
    return [re.match(r"export (\w+)=", c).group(1) for c in block.commands]


def one_node_profile(path: Path) -> Path:
    """The one-node cluster's profile, shipped with mlrb, where the page's user keeps theirs."""
    from mlrb.sweep import PROFILES_DIR

    path.write_text((PROFILES_DIR / "local_single_node.yaml").read_text())
    return path


class MlflowServer:
    """The lab's tracking server's stand-in: the venv's `mlflow server` on a loopback port (the lab's
    PostgreSQL behind it is the tracking-server guide's, checked with the server's own tests)."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = folder / "server.log"
        command = [str(VENV / "bin" / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                   "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1"]  # fmt: skip
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)  # fmt: skip

    def wait(self, timeout: float = 240) -> None:
        from mlrb.store.tracking_server import ServeError, wait_until_healthy

        try:
            wait_until_healthy(self.uri, self.process, timeout_s=timeout)
        except ServeError as e:
            raise AssertionError(f"{e}: {self.log.read_text()[-3000:]}") from None

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)


def shell_values(blocks: list[Block]) -> dict[str, str]:
    """The page's plain assignments (`NAME=value` lines, not exported), in order, each expanded by the
    ones before: what a reader's shell holds when they reach the sweep."""
    values: dict[str, str] = {}
    for block in blocks:
        for command in block.commands:
            if match := re.fullmatch(r"([A-Z][A-Z0-9_]*)=(\S+)", command):
                values[match.group(1)] = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), m.group(0)),
                                                match.group(2))  # fmt: skip
    return values


def validate(block: Block, env: dict, values: dict, monkeypatch) -> None:
    """What the command does before it submits: every job of each sweep composed and pre-checked."""
    from mlrb.cli import check_jobs, parse_command_line
    from mlrb.core.config import register_schema
    from mlrb.sweep import load_profile

    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "MLFLOW_TRACKING_URI", "MLRB_CACHE_DIR", "CLUSTER"):
        monkeypatch.setenv(name, env[name])
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    register_schema()
    for command in block.commands:
        if command.split("=", 1)[0] in values:
            continue  # an assignment
        words = shlex.split(os.path.expandvars(command))
        assert words[:3] == ["python", "-m", "mlrb"], command
        args = parse_command_line(words[3:]).args
        check_jobs(args)  # raises on a bad job
        assert args.multirun and "task.scale=full" in args.overrides and "seed=1,2,3,4,5" in args.overrides
        (cluster,) = [o.split("=", 1)[1] for o in args.overrides if o.startswith("hydra.launcher.cluster=")]
        assert load_profile(cluster)["partition"] == "debug"


def test_the_slurm_guide_runs_as_written(tmp_path, built_cache, monkeypatch):
    blocks = blocks_of(PAGE)
    site = site_block(blocks)
    assert blocks[0] is site, "the site's values come first: every other block uses them"
    # Every block is this test's but three a cluster alone can run, each checked by its own test:
    # the install on shared storage, the compute node's check (srun) and the full-scale models' fetch.
    others = [b for b in blocks if not b.mark.startswith("elsewhere guide_slurm:")]
    assert [b.mark.split(":")[0] for b in others] == [
        "elsewhere newcomer",
        "elsewhere preflight",
        "elsewhere full_scale",
    ], [str(b) for b in others]
    assert "bash install.sh" in others[0].text and "MLRB_TORCH=" in others[0].text
    assert "python -m mlrb.preflight" in others[1].text
    assert all(c.startswith(("export HF_HOME", "python -m mlrb.prefetch")) or "=" in c for c in others[2].commands)
    values = shell_values(blocks)
    assert values["A"] and values["B"] and len(values["SIX"].split(",")) == 6
    blocks = [b for b in blocks if b not in others]
    sweeps = [b for b in blocks if any(c.startswith("python -m mlrb -m launcher=slurm") for c in b.commands)]
    trial, full = sweeps
    assert f"seed={','.join(str(s) for s in range(1, SEEDS + 1))}" in trial.commands[0]

    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(VENV)
    server = MlflowServer(tmp_path)
    # Each run of Claude Code: one Bash call that merges, then its last word. The runs go one at a time
    # (each job asks for both of the node's CPUs), so each gets its two turns in order.
    script = [reply(tool("Bash", command=MERGE, description="merge the experts"), usage=(3000, 60)),
              reply(text="Merged the experts into submission/.", usage=(3200, 20))] * SEEDS  # fmt: skip
    try:
        with FakeLlmServer(script) as model:
            server.wait()
            env = {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": model.anthropic_url,
                   "MLFLOW_TRACKING_URI": server.uri, "MLRB_CACHE_DIR": str(built_cache),
                   "CLUSTER": str(one_node_profile(tmp_path / "my_cluster.yaml"))}  # fmt: skip
            assert sorted(site_names(site)) == sorted(env), "the page's site values are the ones this test sets"
            for block in blocks:
                if block is site:
                    continue
                if block is full:
                    validate(block, env, values, monkeypatch)
                    continue
                result = shell("set -e\n" + block.text, work, env, timeout=1800)
                assert result.returncode == 0, (
                    f"{block}\n{block.text}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
                )
                assert_prints_what_is_shown(block, result.stdout)
                if block is trial:  # step 7: the same command again finishes only what is missing: nothing
                    again = shell("set -e\n" + block.text, work, env, timeout=600)
                    assert again.returncode == 0, again.stderr[-3000:]
                    skipped = [line for line in again.stdout.splitlines() if line.endswith("), skipped")]
                    assert len(skipped) == SEEDS and "finished before" in skipped[0], again.stdout[-3000:]
        requests = model.requests
    finally:
        server.stop()
        for job in own_slurm_jobs(work):
            subprocess.run(["scancel", job])

    # The page's profile was the user's own (step 3 left it), and the jobs ran through SLURM.
    assert yaml.safe_load((tmp_path / "my_cluster.yaml").read_text())["partition"] == "debug"
    assert list(work.rglob("*_log.out")), "the jobs ran through SLURM (sbatch) via submitit"
    # The model API got the real key from the proxy, for each of Claude Code's calls.
    assert len(requests) == 2 * SEEDS and {r["headers"]["x-api-key"] for r in requests} == {KEY}
    assert {r["body"]["model"] for r in requests} == {"claude-sonnet-5"}
    # The runs are on the lab's server, one per seed, each valid; the key is in none of them.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    children = [r for r in runs if r.data.tags.get("mlrb.role") != "sweep"]
    assert sorted(r.info.run_name for r in children) == [f"llm_merging/claude_code/smoke/{s}" for s in range(1, 6)]
    for run in children:
        assert run.info.status == "FINISHED" and run.data.tags["mlrb.valid"] == "True", run.data.tags
        assert run.data.tags["mlrb.models_used"] == "claude-sonnet-5"
    assert (work / "reports" / "claude_code" / "report.html").is_file()
    recorded = b"".join(p.read_bytes() for p in [*work.rglob("*"), *tmp_path.glob("artifacts/**/*")] if p.is_file())
    assert KEY.encode() not in recorded
