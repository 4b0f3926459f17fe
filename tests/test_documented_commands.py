"""Every command README.md and docs/ show, checked the way the mark before its block says.

Each ```bash block of README.md and docs/**/*.md has an HTML comment on the line just before
its opening fence saying how it is checked (docs/development.md, "Commands in the docs are
tested", documents the convention):

    <!-- check: run -->                    run as written, in bash; each command must exit 0
    <!-- check: serve PORT -->             started as written, must answer HTTP on PORT
    <!-- check: validate -->               every job of its sweep composes and passes mlrb's pre-check
    <!-- check: elsewhere FILE: REASON -->  another test, CI or a benchmark runs it; FILE must exist
                                           (a test by its topic: `report` is tests/test_report.py)

So the pages themselves say how each command is checked, and a block without a mark fails.
`run` blocks run in a fresh folder whose PATH starts with this venv's bin (`python` is the
venv's, as the README says) and where `.venv` is this venv; the tests set only environment
variables (the asset cache, model endpoints that point at a local stand-in, a server's worker count),
never the words.
`python -m mlrb...` starts warm there (tests/warm_start.py, `python_on_path`): a fork of a process
that has made its imports, as the other tests' commands start; tests/test_newcomer.py and
tests/test_packaging.py run the first commands in new interpreters, from a fresh clone and a wheel.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import warm_start
from conftest import REPO, mlflow_client, reference_hook, tasks_hook
from fake_llm_server import FakeLlmServer, reply, tool
from test_docker_sandbox import docker_problem

VENV = Path(sys.prefix)
MARK = re.compile(r"<!-- check: (run|serve (\d+)|validate|elsewhere ([^\s:]+)(?::\s*(.*?))?) -->")


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    mark: str  # the mark's text after "check: ", or "" when there is none
    text: str  # the block's text, as written
    shown: list  # the lines of a ```text block right after it: what it prints

    @property
    def kind(self) -> str:
        return self.mark.split()[0] if self.mark else ""

    @property
    def commands(self) -> list:
        """One per command line: continuations joined, comments and extra spaces dropped."""
        found = []
        for line in self.text.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+", " ", re.sub(r"\s+#\s.*$", "", line)).strip()
            if line:
                found.append(line)
        return found

    @property
    def prints_only(self) -> bool:
        """Commands that print a config or help and run nothing: quick, and checked apart."""
        return all("--cfg" in c or "--help" in c for c in self.commands)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list:
    """README.md, then the site's pages in its nav's order (the order run blocks run in): mkdocs.yml's
    nav with the task pages its hook adds (by name, shared pages last), each read from its source,
    mlrb/tasks/NAME/page.md."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    task_pages = tasks_hook().task_pages()
    tasks_hook().fill_nav(nav, task_pages)
    sources = {page.site_path: str(page.source.relative_to(REPO)) for page in task_pages}

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from walk(value)
            else:
                yield sources.get(value, f"docs/{value}")

    generated = {f"docs/{page}" for page in (reference_hook().CONFIGS, reference_hook().COMMANDS)}  # no source file
    listed = [page for page in walk(nav) if page not in generated]
    # a page left out of the nav still has its blocks checked (mkdocs --strict fails it anyway)
    rest = sorted(
        str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md") if str(p.relative_to(REPO)) not in listed
    )
    return ["README.md"] + listed + rest


def blocks_of(page: str) -> list:
    lines = (REPO / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"\s*```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        if fence.group(1) == "bash":
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            # the block's own indentation (a block in a list item) off, its lines' inner indentation kept:
            # a here-document writes a Python file as the page shows it
            body = textwrap.dedent("\n".join(line.rstrip() for line in lines[i + 1 : end])) + "\n"
            # what it prints: a ```text block after it, with at most a blank line between
            after = end + 1 + (end + 1 < len(lines) and not lines[end + 1].strip())
            shown = []
            if after < len(lines) and lines[after].strip() == "```text":
                close = next(j for j in range(after + 1, len(lines)) if lines[j].strip() == "```")
                shown = [line.strip() for line in lines[after + 1 : close] if line.strip()]
            found.append(Block(page, i + 1, mark.group(1) if mark else "", body, shown))
        i = end + 1
    return found


BLOCKS = [block for page in pages() for block in blocks_of(page)]


def of_kind(kind: str) -> list:
    return [b for b in BLOCKS if b.kind == kind]


def as_run(command: str) -> str:
    """A command as the shell runs it from a clone's root, its venv on PATH: `.venv/bin/X` is `X`."""
    return re.sub(r"^\.venv/bin/", "", command)


def help_commands() -> list:
    out = subprocess.run([sys.executable, "-m", "mlrb", "--help"], capture_output=True, text=True, cwd=REPO).stdout
    found = [
        re.sub(r"\s+#.*$", "", line).strip() for line in out.splitlines() if line.strip().startswith("python -m mlrb")
    ]
    found += [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Results: ")]
    return [re.sub(r"\s+", " ", c) for c in found]


def checked_by(where: str) -> Path:
    """The file an `elsewhere` mark names: a path from the repository's root (`.ci/run`,
    `benchmarks/overhead.py`), or a test by its topic (`report` for tests/test_report.py), so that
    the pages researchers read name no test file."""
    return REPO / where if "/" in where or "." in where else REPO / "tests" / f"test_{where}.py"


@pytest.mark.fast
def test_every_bash_block_has_a_mark():
    assert len(BLOCKS) > 20  # the pages were found
    unmarked = [f"{b}" for b in BLOCKS if not b.mark]
    assert not unmarked, f"```bash blocks without a <!-- check: ... --> mark on the line before: {unmarked}"
    for block in of_kind("elsewhere"):
        where, why = MARK.fullmatch(f"<!-- check: {block.mark} -->").group(3, 4)
        assert checked_by(where).is_file(), f"{block}: {where}, which the mark says runs it, does not exist"
        assert why, f"{block}: say after '{where}:' how it runs there, or why not here"
    for block in of_kind("serve"):
        assert len(block.commands) == 1, f"{block}: a serve block holds one command"


@pytest.mark.fast
def test_commands_quoted_in_the_prose_are_in_a_marked_block():
    """`python -m mlrb ...` or `bash ...` in the text must be part of a checked block, or of the help."""
    checked = [c for b in BLOCKS for c in b.commands] + help_commands()
    missing = []
    for page in pages():
        for quoted in re.findall(r"`((?:python -m mlrb|bash )[^`]*)`", (REPO / page).read_text()):
            quoted = re.sub(r"\s+", " ", quoted)
            if not any(quoted in command for command in checked):
                missing.append(f"{page}: {quoted}")
    assert not missing, f"commands quoted in the text but in no marked block: {missing}"


@pytest.mark.fast
def test_the_helps_commands_are_in_marked_blocks():
    """`python -m mlrb --help` shows commands too: each must be in a page's checked block."""
    checked = {c for b in BLOCKS for c in b.commands}
    assert not sorted(set(help_commands()) - checked), "commands --help shows that no page's block checks"


@pytest.mark.fast
def test_the_readme_quick_start_and_session():
    """The two install lines first (tests/test_newcomer.py runs them), then the researcher's runs."""
    readme = [b for b in BLOCKS if b.page == "README.md"]
    assert readme[0].commands == ["bash install.sh && .venv/bin/python -m mlrb",
                                  "bash install.sh --dev && .venv/bin/python -m pytest"]  # fmt: skip
    commands = [c for b in readme if b.kind in ("run", "serve") for c in b.commands]
    assert "python -m mlrb task=llm_merging agent=claude -m seed=1,2,3" in commands
    assert "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db" in commands


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / ".venv").symlink_to(VENV)
    return tmp_path


def shell(command: str, cwd: Path, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """The commands exactly as written, in bash, `python` being this venv's: `python -m mlrb...`
    started warm, as a fork of a process that has made its imports (tests/warm_start.py)."""
    full_env = warm_start.python_on_path({**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", **(env or {})})
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def assert_prints_what_is_shown(block: Block, stdout: str) -> None:
    """Each shown line equals a line printed (ends' spaces aside), `...` standing for any text."""
    printed = [line.strip() for line in stdout.splitlines()]
    for shown in block.shown:
        pattern = re.compile(".*".join(re.escape(part) for part in shown.split("...")))
        assert any(pattern.fullmatch(line) for line in printed), (
            f"{block}: printed no line like {shown!r}:\n{stdout[-3000:]}"
        )


def run_block(block: Block, cwd: Path, env: dict | None = None) -> None:
    # `set -e`: each command must succeed, not only the last
    result = shell("set -e\n" + block.text, cwd, env)
    assert result.returncode == 0, f"{block}\n{block.text}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert_prints_what_is_shown(block, result.stdout)


@pytest.mark.fast
@pytest.mark.parametrize("block", [b for b in of_kind("run") if b.prints_only], ids=str)
def test_printing_blocks_work_as_written(block, workdir):
    result = shell("set -e\n" + block.text, workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()
    assert_prints_what_is_shown(block, result.stdout)
    assert not (workdir / "mlruns").exists() and not (workdir / "outputs").exists()  # nothing ran


@pytest.mark.fast
def test_each_tasks_page_prints_its_full_scale_setup():
    """Each task's page has a checked block printing that task's full-scale config."""
    tasks = [page for page in tasks_hook().task_pages() if page.competition is not None]  # not the shared pages
    assert tasks
    for task in tasks:
        page = str(task.source.relative_to(REPO))
        printing = [c for b in BLOCKS if b.page == page and b.kind == "run" and b.prints_only for c in b.commands]
        assert f"python -m mlrb --cfg job --resolve task={task.title} task.scale=full" in printing, page


@pytest.mark.fast
@pytest.mark.parametrize("block", of_kind("validate"), ids=str)
def test_the_gpu_cluster_sweep_validates(block, monkeypatch):
    from mlrb.cli import check_jobs, parse_command_line
    from mlrb.core.config import register_schema
    from mlrb.sweep import load_profile

    # an agent's key is checked with its config; a fake one, as the run blocks get (the pages say where the real one goes)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-documented")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-documented")
    register_schema()
    for command in block.commands:
        assert command.startswith("python -m mlrb "), command
        args = parse_command_line(command.split()[3:]).args
        check_jobs(args)  # raises on a bad job
        assert args.multirun and len([o for o in args.overrides if "seed=" in o]) == 1
        cluster = re.search(r"hydra\.launcher\.cluster=(\S+)", command)
        if cluster:
            assert load_profile(cluster.group(1))["partition"]


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class Serving:
    """The server of one serve block's command at a time, started as written. A block whose command
    is the one already serving (the same program, arguments and port: `.venv/bin/mlflow` is the
    venv's `mlflow`) is answered by it rather than started again."""

    def __init__(self, workdir: Path):
        self.workdir, self.key, self.server = workdir, None, None

    def serve(self, block: Block) -> int:
        port = int(block.mark.split()[1])
        key = (as_run(block.commands[0]), port)
        if key != self.key:
            self.stop()
            assert free(port), f"port {port} is taken: {block}'s command needs it"
            # One server process where MLflow starts four (each about 3 CPU s of imports): the words as
            # written, the worker count from the environment, as a user may set it.
            env = {**os.environ, "PATH": f"{VENV / 'bin'}:{os.environ['PATH']}", "MLFLOW_WORKERS": "1"}
            self.server = subprocess.Popen(["bash", "-c", f"exec {block.commands[0]}"], cwd=self.workdir, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)  # fmt: skip
            self.key = key
        return port

    def answers(self, block: Block, port: int) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    assert answer.status == 200
                    return
            except OSError:
                assert self.server.poll() is None and time.monotonic() < deadline, (
                    f"{block}: nothing answered on {port}"
                )
                time.sleep(1)

    def stop(self) -> None:
        if self.server is not None:
            os.killpg(self.server.pid, 15)
            self.server.wait(timeout=60)
            self.server = self.key = None


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("serving")
    (workdir / ".venv").symlink_to(VENV)
    servers = Serving(workdir)
    yield servers
    servers.stop()


@pytest.mark.integration
@pytest.mark.xdist_group("documented_ports")  # the blocks' fixed ports: one test at a time
@pytest.mark.parametrize("block", of_kind("serve"), ids=str)
def test_serving_blocks_answer_on_their_port(block, serving):
    serving.answers(block, serving.serve(block))


SUBMIT = reply(tool("submit", summary="nothing to hand in"), usage=(500, 10))


def needs_docker(block: Block) -> bool:
    return any("sandbox=docker" in c for c in block.commands)


@pytest.mark.system
@pytest.mark.xdist_group("documented_ports")  # port 8000, as the docs' openai_compatible command says
def test_the_documented_runs_work_as_written(workdir, built_cache):
    """Every other "run" block, README first, then the pages in nav order, into one store: a
    later block's report reads the runs before it, and a sweep skips what an earlier one finished."""
    runs = [b for b in of_kind("run") if not b.prints_only]
    without_docker = docker_problem()
    assert free(8000), "port 8000 is taken: the documented openai_compatible command needs it"
    with FakeLlmServer([SUBMIT] * 40) as vendor, FakeLlmServer([SUBMIT] * 5, port=8000):
        env = {
            "MLRB_CACHE_DIR": str(built_cache),
            "ANTHROPIC_BASE_URL": vendor.anthropic_url, "OPENAI_BASE_URL": vendor.openai_url,
            "ANTHROPIC_API_KEY": "sk-ant-documented", "OPENAI_API_KEY": "sk-documented",
            "CUDA_VISIBLE_DEVICES": "0,1",
        }  # fmt: skip
        for block in runs:
            if without_docker and needs_docker(block):
                continue  # the rest still runs; the test skips at the end (a skip fails under CI)
            run_block(block, workdir, env)
    client = mlflow_client(workdir)
    finished = [r for r in client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])
                if r.info.status == "FINISHED" and r.data.tags.get("mlrb.role") != "sweep"]  # fmt: skip
    # Each block's runs; a sweep skips a job whose config already has a FINISHED run (the README's
    # budget sweep runs only its 1h jobs; the tutorial's claude sweep is the README's, all skipped; its
    # baseline sweep runs seeds 1-3, so the configs page's `-m seed=1,2,3` runs none; of
    # `-m seed=1,2,3,4` only seed 4 is new). A single run always runs.
    expected = ["claude/smoke/1", "claude/smoke/2", "claude/smoke/3", "claude/1h/1", "claude/1h/2", "claude/1h/3",
                "baseline/smoke/0", "baseline/smoke/1", "baseline/smoke/2", "baseline/smoke/3",  # the tutorial
                "baseline/smoke/0", "baseline/smoke/3", "baseline/1h/0",
                "claude/smoke/0", "claude/smoke/0", "gpt4o/smoke/0", "openai_compatible/smoke/0", "claude/1h/0",
                "baseline/smoke/0",
                "baseline/smoke/4", "baseline/smoke/1", "baseline/smoke/2"]  # fmt: skip
    if without_docker:
        expected.remove("baseline/smoke/0")  # the docker sandbox's run
    assert sorted(r.info.run_name for r in finished) == sorted(f"llm_merging/{name}" for name in expected)
    assert {r.data.params["sandbox.kind"] for r in finished} == ({"bwrap"} if without_docker else {"bwrap", "docker"})
    # (a plumbing run logs its own scale's params, not tiny's)
    assert sum(r.data.params.get("task.scales.tiny.hardware.gpus") == "1" for r in finished) == 2
    assert (workdir / "reports" / "summary.md").exists() and (workdir / "reports" / "report.html").exists()
    assert (workdir / "reports" / "merging" / "summary.md").exists()
    if without_docker:
        pytest.skip(f"every run block ran but `python -m mlrb sandbox=docker`, which needs Docker: {without_docker}")
