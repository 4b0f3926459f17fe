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
too, the task is broken (an infra error, not counted against the agent)."""

from __future__ import annotations

import json
import math
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlrb.sandbox.base import Mount, sandbox_environment
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.submission_command import SubmissionCommand

TESTS, LOGS = "/tests", "/logs/verifier"
OUTPUT, EXIT = "test-stdout.txt", ".test-sh-exit"
SHOWN = "tests/test.sh"


class VerifierFailed(RuntimeError):
    """The verifier left no usable reward: whose fault it is, the control says."""


@dataclass(frozen=True)
class HarborVerifier:
    timeout_s: float
    workdir: str = ""  # where the verifier also sees the copy ("": only at its own path)

    def command(self, copy: Path, assets: Path) -> SubmissionCommand:
        """tests/test.sh on the copy, in a sandbox where /logs/verifier is the harness's new, empty folder."""
        logs = logs_of(copy)
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        where = self.workdir or str(copy.absolute())
        script = (f"cd {shlex.quote(where)} && bash {TESTS}/test.sh > {LOGS}/{OUTPUT} 2>&1; "
                  f"echo $? > {LOGS}/{EXIT}; exit 0")  # fmt: skip
        mounts = [Mount(assets.absolute() / "hidden" / "tests", inside=TESTS),
                  Mount(logs.absolute(), inside=LOGS, writable=True)]  # fmt: skip
        if self.workdir and self.workdir != str(copy.absolute()):
            mounts.append(Mount(copy.absolute(), inside=self.workdir, writable=True))
        env = sandbox_environment(where)
        return SubmissionCommand(["/bin/bash", "-c", script], env, f"`{SHOWN}`", self.timeout_s, mounts)

    def score(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        """The reward the verifier wrote, as the score; VerifierFailed when there is none."""
        logs = logs_of(submission)
        rewards = read_rewards(logs)
        score = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
        if score is None:
            score = sum(rewards.values()) / len(rewards)
        extra = {f"reward.{key}": value for key, value in rewards.items() if key != "reward"}
        return ScoreReport(valid=True, reason=f"reward written by {SHOWN}", score=float(score), metrics=extra)

    def score_unrun(self, submission: Path, assets: Path, work_dir: Path) -> ScoreReport:
        """The judge's score when test.sh did not run apart: it runs only in a sandbox of its own."""
        raise VerifierFailed(f"{SHOWN} runs only in a sandbox of its own, through the run's scorer")


def logs_of(submission: Path) -> Path:
    """The verifier's folder, beside the submission's copy in the scorer's working folder."""
    return submission.parent / "verifier"


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
    bad = [key for key, value in rewards.items()
           if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)]  # fmt: skip
    if bad or not rewards:
        raise VerifierFailed(f"{SHOWN} wrote a {where} that is not finite numbers ({ran(logs)})")
    return {str(key): float(value) for key, value in rewards.items()}


def ran(logs: Path) -> str:
    """How test.sh ended: its exit status and its last line of output."""
    exit_file, output = logs / EXIT, logs / OUTPUT
    status = exit_file.read_text().strip() if exit_file.is_file() else "?"
    lines = [line.strip() for line in output.read_text(errors="replace").splitlines() if line.strip()] \
        if output.is_file() else []  # fmt: skip
    return f"test.sh exited {status}: {lines[-1][:300] if lines else '(no output)'}"
