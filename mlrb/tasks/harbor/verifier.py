"""A Harbor task's verifier as mlrb's judge: `tests/test.sh`, run after the agent stopped, on a
copy of its workspace, in a fresh sandbox of the run's kind (mlrb/scoring/runner.py runs the
command apart) where `/tests` holds the task's tests, read-only, and `/logs/verifier` is a
folder the harness has just made empty; the copy is there too, at the Dockerfile's WORKDIR.
The scorer then reads the reward from that folder alone (reward.json before reward.txt, as
Harbor reads them): nothing the agent left in its workspace, or at /logs/verifier in its own
sandbox, can be read as one.

A verifier that leaves no reward raises: the run's scoring then scores the control, the
task's own solution/solve.sh (mlrb/harness/control.py). If the solution's reward comes back, the
verifier works and the failure is the submission's (invalid, the reason named); if it fails
too, the task is broken (an infra error, not counted against the agent).

Nothing of the copy stands in for the verifier's own files or tools: links leading out of the copy
(to /tests, where the answers may be) are removed first, its Pythons start with no user site and
mlrb's own sitecustomize (verifier_site/: the working folder searched last, for module names
only), its HOME is a new folder of the harness's, not the copy. And a reward needs
pytest's own word where the tests use pytest: every pytest run writes a report to a folder of the
harness's (verifier_site/mlrb_pytest_report.py), and a reward above 0 that no finished report of
passing tests backs is not taken, as if no reward had been written (the control then says whose
fault it is). Code of the agent's that the verifier itself runs can still forge both: `forgeable`
says when the tests do that, for the run's tags."""

from __future__ import annotations

import ast
import importlib.machinery
import json
import math
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mlrb.sandbox.base import Mount, sandbox_environment
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.submission_command import SubmissionCommand
from mlrb.tasks.folder.scoring import remove_links_out, removed_note

TESTS, LOGS = "/tests", "/logs/verifier"
OUTPUT, EXIT, LINKS = "test-stdout.txt", ".test-sh-exit", ".links-removed"
SHOWN = "tests/test.sh"
# The harness's own folders in the verifier's sandbox: its HOME and pytest's reports (writable, new
# for each scoring), and its start-up files (read-only, from this package).
OWN, SITE = "/logs/mlrb", "/logs/mlrb-site"
REPORTS, HOME = "pytest", "home"
SITE_FILES = Path(__file__).with_name("verifier_site")


class VerifierFailed(RuntimeError):
    """The verifier left no usable reward: whose fault it is, the control says."""


@dataclass(frozen=True)
class HarborVerifier:
    timeout_s: float
    workdir: str = ""  # where the verifier also sees the copy ("": only at its own path)
    env: dict[str, str] = field(default_factory=dict)  # the task's [verifier] env
    tests: str = "tests"  # its tests in the assets' hidden/ (a step's: steps/<name>/tests)

    def command(self, copy: Path, assets: Path) -> SubmissionCommand:
        """tests/test.sh on the copy, in a sandbox where /logs/verifier is the harness's new, empty folder."""
        logs, own = logs_of(copy), own_of(copy)
        for folder in (logs, own / REPORTS, own / HOME):
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        # A link of the agent's to /tests/expected.txt would read as its own answer there.
        (logs / LINKS).write_text(removed_note(remove_links_out(copy)))
        where = self.workdir or str(copy.absolute())
        script = (
            f"cd {shlex.quote(where)} && /bin/bash {TESTS}/test.sh > {LOGS}/{OUTPUT} 2>&1; "
            f"echo $? > {LOGS}/{EXIT}; exit 0"
        )
        mounts = [
            Mount(assets.absolute() / "hidden" / self.tests, inside=TESTS),
            Mount(logs.absolute(), inside=LOGS, writable=True),
            Mount(own.absolute(), inside=OWN, writable=True),
            Mount(SITE_FILES, inside=SITE),
        ]
        if self.workdir and self.workdir != str(copy.absolute()):
            mounts.append(Mount(copy.absolute(), inside=self.workdir, writable=True))
        env = sandbox_environment(f"{OWN}/{HOME}", {**self.env, **trusted_python(where, str(copy.absolute()))})
        return SubmissionCommand(
            ["/bin/bash", "-c", script], env, f"`{SHOWN}`", self.timeout_s, mounts, on_agent_state=True
        )  # in Docker, on the agent's container as it left it

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        """The reward the verifier wrote, as the score; VerifierFailed when there is none, or
        when pytest's reports do not back it."""
        logs = logs_of(submission)
        rewards = read_rewards(logs)
        score = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
        if score is None:
            score = sum(rewards.values()) / len(rewards)
        runs = pytest_runs(own_of(submission) / REPORTS)
        problem = unbacked(score, runs, names_pytest(assets / "hidden" / self.tests))
        if problem:
            raise VerifierFailed(
                f"{SHOWN} wrote a reward of {score:g} that pytest does not back: {problem} ({ran(logs)})"
            )
        extra = {f"reward.{key}": value for key, value in rewards.items() if key != "reward"}
        return ScoreReport(valid=True, reason=f"reward written by {SHOWN}", score=float(score), metrics=extra)

    def score_unrun(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        """The judge's score when test.sh did not run apart: it runs only in a sandbox of its own."""
        raise VerifierFailed(f"{SHOWN} runs only in a sandbox of its own, through the run's scorer")


def trusted_python(where: str, copy: str) -> dict[str, str]:
    """What keeps the copy's files from standing in for the verifier's Python and pytest (see
    verifier_site/sitecustomize.py); no PYTHON* or PYTEST_* variable comes from anywhere else."""
    return {
        "PYTHONNOUSERSITE": "1",  # no ~/.local site-packages, wherever HOME is
        "PYTHONPATH": SITE,
        "MLRB_VERIFIER_COPY": os.pathsep.join(dict.fromkeys([where, copy])),
        "MLRB_PYTEST_REPORTS": f"{OWN}/{REPORTS}",
    }


def logs_of(submission: Path) -> Path:
    """The verifier's folder, beside the submission's copy in the scorer's working folder."""
    return submission.parent / "verifier"


def own_of(submission: Path) -> Path:
    """The harness's folder for the verifier (its HOME, pytest's reports), beside the logs."""
    return submission.parent / "verifier-harness"


def read_rewards(logs: Path) -> dict[str, float]:
    """reward.json (a number, or an object of numbers) before reward.txt (one number), as Harbor
    reads them; VerifierFailed naming what is wrong and test.sh's exit and last line."""
    json_file, text_file = logs / "reward.json", logs / "reward.txt"
    try:
        if json_file.is_file():
            raw = json.loads(json_file.read_text())
            rewards = raw if isinstance(raw, dict) else {"reward": raw}
            where = "reward.json"
        elif text_file.is_file():
            rewards, where = {"reward": float(text_file.read_text().strip())}, "reward.txt"
        else:
            raise VerifierFailed(f"{SHOWN} wrote no reward ({ran(logs)})")
    except (ValueError, OSError) as e:
        raise VerifierFailed(f"{SHOWN} wrote an unreadable reward ({type(e).__name__}: {e}; {ran(logs)})") from None
    bad = [
        key
        for key, value in rewards.items()
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    ]
    if bad or not rewards:
        raise VerifierFailed(f"{SHOWN} wrote a {where} that is not finite numbers ({ran(logs)})")
    return {str(key): float(value) for key, value in rewards.items()}


def ran(logs: Path) -> str:
    """How test.sh ended: its exit status and its last line of output (and the links removed before it ran)."""
    exit_file, output, links = logs / EXIT, logs / OUTPUT, logs / LINKS
    status = exit_file.read_text().strip() if exit_file.is_file() else "?"
    lines = (
        [line.strip() for line in output.read_text(errors="replace").splitlines() if line.strip()]
        if output.is_file()
        else []
    )
    removed = links.read_text() if links.is_file() else ""
    return f"test.sh exited {status}: {lines[-1][:300] if lines else '(no output)'}{removed}"


def pytest_runs(folder: Path) -> list[dict]:
    """The reports of the verifier's pytest runs (mlrb_pytest_report.py); one that cannot be read
    counts as a run that did not finish."""
    runs = []
    for file in sorted(folder.glob("pytest-*.json")) if folder.is_dir() else []:
        try:
            run = json.loads(file.read_text())
        except (OSError, ValueError):
            run = {}
        runs.append(run if isinstance(run, dict) else {})
    return runs


def names_pytest(tests: Path) -> bool:
    """Whether the task's tests use pytest: test.sh, or another shell script beside it, names it."""
    return any("pytest" in file.read_text(errors="replace") for file in tests.glob("*.sh") if file.is_file())


def unbacked(score: float, runs: list[dict], uses_pytest: bool) -> str:
    """Why pytest's reports do not back a reward of `score` ("" when they do, or when neither the
    tests nor a report say pytest ran). A reward above 0 needs every pytest run finished and a test
    passed; a reward of 1 or more (Harbor's full reward), also no test failed or errored."""
    if score <= 0 or not (uses_pytest or runs):
        return ""
    if not runs:
        return "no pytest run reported (a test.sh that replaces PYTHONPATH drops mlrb's report)"
    if any("exitstatus" not in run for run in runs):
        return "a pytest run ended before it finished"
    try:
        passed = sum(int(run["passed"]) for run in runs)
        failed = sum(int(run["failed"]) + int(run["errors"]) for run in runs)
    except (KeyError, TypeError, ValueError):
        return "a pytest report could not be read"
    if passed == 0:
        return "no test passed"
    if failed and score >= 1:
        return f"{failed} test(s) failed or errored"
    return ""


def forgeable(folder: Path) -> str:
    """Why the verifier of the Harbor task in `folder` runs code the agent wrote, which could then
    write the reward and pytest's report itself ("" when its tests show none): the scripts at the
    top of tests/ (test.sh, the test files) import a module that only the workspace has (not the
    tests' own, the standard library's or an installed one; or one of the agent's starting files),
    or name a .py or .sh file that is not the tests' own. Folders inside tests/ are the tests'
    libraries and data, not read."""
    tests = folder / "tests"
    held = {path.name for path in tests.rglob("*")} | {path.stem for path in tests.rglob("*.py")}
    starting = {path.name for path in (folder / "environment").glob("*")}
    starting |= {path.stem for path in (folder / "environment").glob("*.py")}
    found: list[str] = []
    for file in sorted(tests.glob("*")):
        if not file.is_file() or file.suffix not in (".sh", ".py"):
            continue
        text = file.read_text(errors="replace")
        named = {name for name in re.findall(r"[\w.-]+\.(?:py|sh)\b", text) if Path(name).name not in held}
        imported = {
            name
            for name in imported_modules(text)
            if name not in held and name not in sys.stdlib_module_names and (name in starting or not installed(name))
        }
        found += sorted(named | imported)
    return f"the tests run the workspace's {', '.join(dict.fromkeys(found))}" if found else ""


def imported_modules(source: str) -> set[str]:
    """The top-level modules a Python file imports by name (import statements, and importlib's
    import_module or __import__ with a literal name)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")
        ):
            names.add(node.args[0].value)
    return {name.partition(".")[0] for name in names if name}


def installed(name: str) -> bool:
    """Whether the harness's Python (the verifier's, on its PATH) has the module, apart from any
    working folder on its sys.path."""
    here = {"", os.getcwd()}
    return importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if p not in here]) is not None
