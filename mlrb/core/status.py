"""How a run ended: the one vocabulary the harness writes (the `mlrb.status` tag)
and the report reads. See docs/reports.md, "How runs count".

Who is to blame decides how a run counts:

- the agent's doing (`ok`, `invalid`, `no_submission`, `budget_exhausted`,
  `agent_error`): an *attempt*; it enters every mean and rate, a run without a
  valid submission as a failure that counts as doing nothing (mlrb/analysis/counting.py);
- not the agent's doing (`infra_error`, `killed`): kept out of every mean and rate,
  and run again when its sweep is launched again.
"""

from __future__ import annotations

import enum
from typing import Final


class MlflowStatus:
    """MLflow's own run statuses (mlflow.entities.RunStatus), spelt here so that comparing
    them needs no import of mlflow."""

    RUNNING: Final = "RUNNING"
    SCHEDULED: Final = "SCHEDULED"
    FINISHED: Final = "FINISHED"
    FAILED: Final = "FAILED"
    KILLED: Final = "KILLED"
    UNFINISHED: Final = (RUNNING, SCHEDULED)


class Status(str, enum.Enum):  # noqa: UP042 (StrEnum would change str(status) and f-strings)
    OK = "ok"  # the agent submitted, and its submission is valid
    INVALID = "invalid"  # it submitted something that breaks the task's rules or cannot be loaded or scored
    NO_SUBMISSION = "no_submission"  # it said it was done but left nothing where the task expects it
    BUDGET_EXHAUSTED = "budget_exhausted"  # a limit stopped it; its workspace was scored as it was
    AGENT_ERROR = "agent_error"  # its model or API failed it after retries; its workspace was scored
    INFRA_ERROR = "infra_error"  # the harness or the machine failed
    KILLED = "killed"  # interrupted (a signal, Ctrl-C, a pre-empted or timed-out job)

    def __str__(self) -> str:
        return self.value

    @property
    def is_attempt(self) -> bool:
        """Whether the run counts: the agent had its chance and the scorer had its say."""
        return self not in (Status.INFRA_ERROR, Status.KILLED)

    @property
    def mlflow_status(self) -> str:
        """The MLflow run status it is recorded with. Runs that do not count are not
        FINISHED, so a re-launched sweep (which skips FINISHED runs) runs them again."""
        return {Status.INFRA_ERROR: MlflowStatus.FAILED, Status.KILLED: MlflowStatus.KILLED}.get(
            self, MlflowStatus.FINISHED
        )


def of_run(agent_ending: Status, collected: bool, valid: bool) -> Status:
    """A scored run's status. How the agent stopped says most, when a limit or a failure
    stopped it (whether its workspace held a valid submission is the `mlrb.valid` tag);
    when it submitted, what it submitted decides."""
    if agent_ending != Status.OK:
        return Status(agent_ending)
    if not collected:
        return Status.NO_SUBMISSION
    return Status.OK if valid else Status.INVALID


def parse(value: str) -> Status:
    """A recorded tag's status. Runs recorded before this vocabulary said "submitted"."""
    return Status.OK if value == "submitted" else Status(value)
