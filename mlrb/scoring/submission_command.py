"""The submission's own code, as a task asks the scorer to run it before scoring (an MLRC method's
test phase): a value the task makes and mlrb/scoring/runner.py runs, in a sandbox of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SubmissionCommand:
    """The submission's own code, run on its copy before the copy is scored, where the task's
    hidden files cannot be seen."""

    argv: list[str]  # run in the copy
    env: dict[str, str]
    shown: str  # how a failure names it, e.g. "`python main.py -m my_method -p test`"
    timeout_s: float
    # More it sees (mlrb.sandbox.base.Mount): a Harbor verifier's /tests and its empty /logs/verifier.
    mounts: list[Any] = field(default_factory=list)
    # Run on what the agent left of its sandbox beyond the workspace, where the run's sandbox kept
    # it (a Harbor verifier: Docker's kept container), when scoring the run's own submission.
    on_agent_state: bool = False
