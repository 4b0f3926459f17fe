"""A newcomer's first contact, as they make it: a fresh clone, an empty HOME, and the README's
Quick start lines, read out of the clone's README (not copied here) and run exactly as written
from the clone's root.

What is cloned is this checkout's HEAD (commit your work to test it here). The clone's pip is
set up as the developer's (its cache, its PIP_* variables and its user configuration file, which
pip would look for in the empty HOME), and so is uv, which install.sh installs with (its cache):
it takes packages from where the developer's own install took them, a wheel folder or a mirror,
where a new user's would fetch them from PyPI. The test
is of mlrb's install and first run, not of the network; and PyPI's torch for Linux is its CUDA
build, with several gigabytes of NVIDIA's libraries, which CI would download at every run."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

SCORE_LINE = re.compile(r"^llm_merging/baseline/smoke/0: score (\d\.\d+) \(valid\); status ok; mlflow run (\w+)$", re.M)


def quick_start(readme: str) -> tuple[list[str], str]:
    """The commands of the Quick start's first ```bash block, and the section's text."""
    section = readme.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's Quick start has no ```bash block"
    commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c], section


def promised_spread(section: str) -> tuple[float, float]:
    """The default run's score as the Quick start states it: 'from LOW to HIGH' over kernel paths."""
    spread = re.search(r"from (\d\.\d+) to (\d\.\d+)", section)
    assert spread, "the README's Quick start does not say the default run's score ('scores from X to Y')"
    return float(spread.group(1)), float(spread.group(2))


def measured_spread() -> tuple[float, float]:
    """The default run's score over the kernel paths of the machines benchmarks/machine_spread.py measured:
    the default task's baseline, lowest and highest (its score; the baseline takes no seed)."""
    baseline = json.loads((REPO / "benchmarks" / "machine_spread.json").read_text())["tasks"]["llm_merging"]
    return baseline["spread"]["baseline"]["min"], baseline["spread"]["baseline"]["max"]


@pytest.mark.fast
def test_quick_start_reading():
    commands, section = quick_start((REPO / "README.md").read_text())
    assert commands[:2] == [
        "bash install.sh && .venv/bin/python -m mlrb",
        "bash install.sh --dev && .venv/bin/python -m pytest",
    ]
    # The range the README promises, and the newcomer's test holds a first run to, is the measured one.
    low, high = promised_spread(section)
    assert (low, high) == tuple(round(value, 4) for value in measured_spread())
    assert "benchmarks/machine_spread.py" in section


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh clone of this checkout, and an empty home for its user."""
    root = tmp_path_factory.mktemp("newcomer")
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(root / "mlrb")], check=True)
    (root / "home").mkdir()
    yield root / "mlrb", root / "home"
    shutil.rmtree(root, ignore_errors=True)  # its venv is gigabytes


@functools.cache
def developer_installers() -> dict[str, str]:
    """The developer's installers' set-up as environment variables, for a clone with an empty HOME:
    pip's (its cache, the PIP_* variables set here, and the user configuration file pip reads from
    the developer's HOME, the last of them where there are two: it takes precedence), which
    install.sh hands on to uv; and uv's cache, asked of the uv install.sh installed here (a venv
    from before uv: the clone's fills a cache of its own)."""
    pip = ["python3", "-m", "pip"]
    settings = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    settings.setdefault(
        "PIP_CACHE_DIR", subprocess.run([*pip, "cache", "dir"], capture_output=True, text=True).stdout.strip()
    )
    uv = REPO / ".venv" / "bin" / "uv"
    if os.environ.get("UV_CACHE_DIR"):
        settings["UV_CACHE_DIR"] = os.environ["UV_CACHE_DIR"]
    elif uv.exists():
        settings["UV_CACHE_DIR"] = subprocess.run(
            [str(uv), "cache", "dir"], capture_output=True, text=True
        ).stdout.strip()
    section, files = "", []  # `pip config debug`: a line per section ("user:"), its files indented under it
    for line in subprocess.run([*pip, "config", "debug"], capture_output=True, text=True).stdout.splitlines():
        section = line.rstrip(":") if not line.startswith(" ") else section
        found = re.fullmatch(r"  (\S.*), exists: True", line)
        if section == "user" and found:
            files.append(found.group(1))
    if files and "PIP_CONFIG_FILE" not in settings:
        settings["PIP_CONFIG_FILE"] = files[-1]
    return settings


def as_newcomer(command: str, clone: Path, home: Path, **extra: str) -> subprocess.CompletedProcess:
    """`command` in bash from the clone's root, with a new user's environment (and the developer's pip and uv set-up)."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **developer_installers(), **extra}
    if os.environ.get("CI"):
        env["CI"] = os.environ["CI"]
    return subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.system
def test_the_readme_quick_start_works_from_a_fresh_clone(clone):
    repo, home = clone
    commands, section = quick_start((repo / "README.md").read_text())
    install_and_run, install_and_test = commands[:2]
    result = as_newcomer(install_and_run, repo, home)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert_the_first_run_keeps_library_noise_in_its_log_file(repo, result)
    final = SCORE_LINE.findall(result.stdout)
    assert len(final) == 1, result.stdout[-2000:]
    score, run_id = float(final[0][0]), final[0][1]
    low, high = promised_spread(section)
    assert low <= score <= high, (
        f"the default run scored {score}; the README promises {low} to {high}, the range the measured machines' kernel "
        "paths gave (benchmarks/machine_spread.json): a CPU of another kind may score outside it; measure it there"
    )

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "llm_merging/baseline/smoke/0"
    assert (home / ".cache" / "mlrb" / "llm_merging").is_dir()  # built into the new user's cache

    # The command users type first, word for word, from the clone's root (`python` is the venv's,
    # as the README says), against a local stand-in for the Anthropic API.
    assert FIRST_COMMAND in (repo / "README.md").read_text()
    swept = sweep_of_three_seeds(repo, home)
    assert not swept["unfinished"], swept

    # The test command, minus the recursion: the line as written, pytest narrowed to a few quick
    # files by PYTEST_ADDOPTS (the whole suite is what CI runs from its own clone).
    quick = "tests/test_mount_order.py tests/test_lock.py -p no:cacheprovider"
    tested = as_newcomer(install_and_test, repo, home, PYTEST_ADDOPTS=quick)
    assert tested.returncode == 0, (tested.stdout + tested.stderr)[-4000:]
    closing = tested.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", closing) and not re.search(r"failed|error|skipped", closing), closing


def assert_the_first_run_keeps_library_noise_in_its_log_file(repo: Path, result: subprocess.CompletedProcess) -> None:
    """The first run builds the task's models and calibrates them with lm-eval, which print
    progress bars and warnings: the console shows mlrb's own lines, the run's log file the rest."""
    run_lines = result.stdout.split("mlrb installed in ", 1)[1].splitlines()[1:]  # after install.sh's last line
    noise = [line for line in run_lines[:-1] if "][mlrb." not in line]
    assert noise == [], f"the console shows more than mlrb's own lines: {noise[:5]}"
    for library_line in ("Running loglikelihood requests", "it/s]", "FutureWarning"):
        assert library_line not in result.stdout + result.stderr  # stderr holds pip's lines only
    (log,) = (repo / "outputs" / "runs").glob("*/mlrb.log")
    text = log.read_text()
    assert "Running loglikelihood requests" in text and "it/s]" in text  # lm-eval's progress bars
    assert "FutureWarning" in text  # a library's deprecation warning
    assert "building llm_merging assets" in text and "agent ended" in text  # mlrb's own lines too


FIRST_COMMAND = "python -m mlrb task=llm_merging agent=claude -m seed=1,2,3"


def sweep_of_three_seeds(repo: Path, home: Path) -> dict:
    """FIRST_COMMAND run as written: three FINISHED runs of the claude agent under one sweep parent."""
    from mlflow.tracking import MlflowClient

    from fake_llm_server import FakeLlmServer, reply, tool

    script = [
        reply(tool("bash", command="ls"), usage=(900, 30)),
        reply(tool("submit", summary="nothing"), usage=(950, 20)),
    ] * 3
    with FakeLlmServer(script) as server:
        result = as_newcomer(
            FIRST_COMMAND, repo, home, PATH=f"{repo / '.venv' / 'bin'}:{os.environ['PATH']}",
            ANTHROPIC_API_KEY="sk-ant-fake-for-tests", ANTHROPIC_BASE_URL=server.anthropic_url,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    assert len(server.requests) == 6
    client = MlflowClient(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"]
    # The store also holds the quick start's baseline run.
    children = [
        r for r in runs if r.data.tags.get("mlrb.agent") == "claude" and r.data.tags.get("mlrb.role") != "sweep"
    ]
    assert sorted(r.data.tags["mlrb.seed"] for r in children) == ["1", "2", "3"]
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    return {"unfinished": [r.info.run_name for r in children if r.info.status != "FINISHED"]}
