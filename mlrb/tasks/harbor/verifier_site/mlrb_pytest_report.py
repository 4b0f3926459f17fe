"""mlrb's record of one pytest run in a Harbor verifier (a pytest plugin, loaded through
sitecustomize.py here): how many tests passed, failed, errored or were skipped, and how pytest
ended, as JSON in $MLRB_PYTEST_REPORTS, a folder only the harness reads afterwards
(mlrb/tasks/harbor/verifier.py). The file is written as the run starts, without an end: a run cut
short (the agent's module ended the process on import) leaves it so, and backs no reward."""

import json
import os
import time

FOLDER = os.environ.get("MLRB_PYTEST_REPORTS", "")
counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
state = {"file": ""}


def write(**ending) -> None:
    if state["file"]:
        with open(state["file"], "w") as out:
            json.dump({**counts, **ending}, out)


def pytest_configure(config) -> None:
    if FOLDER and not hasattr(config, "workerinput"):  # pytest-xdist's workers report to their controller
        state["file"] = os.path.join(FOLDER, f"pytest-{os.getpid()}-{time.time_ns()}.json")
        write()


def pytest_collectreport(report) -> None:
    if report.failed:  # a test file that cannot be collected (an import that fails)
        counts["errors"] += 1


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        counts["failed" if report.when == "call" else "errors"] += 1
    elif report.skipped:
        counts["skipped"] += 1
    elif report.when == "call":
        counts["passed"] += 1


def pytest_sessionfinish(session, exitstatus) -> None:
    write(exitstatus=int(exitstatus))
