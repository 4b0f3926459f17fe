"""A task run as several steps in one environment (Task.steps: a Harbor task's [[steps]]), in one
run: the agent is given step 1's prompt, and when it ends, the step's own judge scores what it
left; then step 2's prompt, in the same workspace and sandbox, and so on. The budget is the run's,
spanning the steps: what one step leaves of it is the next one's.

Between steps, the scoring is the harness's time, off the agent's clock, with what the agent left
running held still: the workspace is copied out and, in Docker, the agent's container kept as it
is (Sandbox.keep_state_now), and the step's verifier runs on them in a fresh sandbox of its own,
so it is never in the agent's sandbox, before or after. The last step reached is scored by the
run's own scoring, after the agent's end, as a task of one step is.

A step's reward under its min_reward ends the run there, as Harbor ends a trial; so does a step
whose verifier gives no reward. The run's score is the trial's reward as Harbor computes it
(Task.step_reward): "mean" over the steps scored, or "final", the last step's; a step the run
never reached because its budget ran out (or its agent failed) counts 0, since Harbor would have
given it its own time. Each step's reward is the metric task_step_reward at the step's number.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlrb.agents.base import Agent, AgentContext, AgentOutcome
from mlrb.core.budget import Budget
from mlrb.core.config import SandboxConfig
from mlrb.core.status import Status
from mlrb.core.tags import Metric, Tag
from mlrb.run_files import workspace
from mlrb.sandbox.base import Sandbox
from mlrb.scoring.report import ScoreReport
from mlrb.scoring.runner import ScorerError, score_submission
from mlrb.tasks.base import Task

log = logging.getLogger(__name__)

STEPS_DIR = "steps"  # in the run folder: steps/<k>-<name>/, each step's prompt and its scoring
MIN_REWARD, STEP_FAILED = "min_reward", "step_not_scored"  # the stop reasons of a run ended at a step


@dataclasses.dataclass
class StepsRun:
    """One run's steps: the agent's part (`run`), then what the run's own scoring needs (`scored_task`,
    `decided`) and makes of its report (`trial_report`)."""

    task: Task
    render: Callable[[Task], str]  # a step's task -> the prompt the agent is given
    recorder: Any
    run_dir: Path
    asset_path: Path
    work: Path
    sandbox_cfg: SandboxConfig
    sandbox: Sandbox
    budget: Budget
    rewards: list[float | None] = dataclasses.field(default_factory=list)  # the steps scored, in order
    reached: int = 0  # the step the agent was last given (1, 2, ...)
    current: Task | None = None  # that step's task
    ended_early: str = ""  # why the run ended at a step before its last, having scored it ("": it did not)
    not_scored: str = ""  # a step before the last whose verifier gave no reward: why

    @property
    def count(self) -> int:
        return len(self.task.steps)

    def run(self, agent: Agent, context: AgentContext) -> AgentOutcome:
        """The agent through the steps in turn; how it ended in the last step it was given."""
        outcome = AgentOutcome(Status.OK, None, "")
        for k, step in enumerate(self.task.steps, 1):
            step_task = step.task()
            self.reached, self.current = k, step_task
            prompt = self.render(step_task)
            self.recorder.log_text(prompt, f"{STEPS_DIR}/{k}-{step.name}/instructions.md")
            log.info("step %d of %d (%s) begins", k, self.count, step.name)
            outcome = agent.run(dataclasses.replace(context, task=step_task, instructions=prompt))
            if k == self.count or outcome.status != Status.OK:
                return outcome  # scored by the run's own scoring, after the agent's end
            report = self.score_now(k, step.name, step_task)
            if not report.valid:
                self.not_scored = f"step {k} ({step.name}) was not scored: {report.reason}"
                return AgentOutcome(Status.OK, STEP_FAILED, f"the run ended at {self.not_scored}")
            self.rewards.append(report.score)
            self.log_reward(k, report.score)
            short = short_of(rewards_of(report), dict(step.min_reward))
            if short:
                self.ended_early = (
                    f"step {k} of {self.count} ({step.name}): {short}, so the run ended there, as Harbor ends the trial"
                )
                log.warning("%s", self.ended_early)
                return AgentOutcome(Status.OK, MIN_REWARD, f"{outcome.message} ({self.ended_early})".strip())
        return outcome

    def score_now(self, k: int, name: str, step_task: Task) -> ScoreReport:
        """Step K's verifier on what the agent left, the agent held still meanwhile and off its clock."""
        folder = self.run_dir / STEPS_DIR / f"{k}-{name}"
        notes = workspace.Notes(f"step {k}'s submission")
        with self.budget.paused():
            self.sandbox.keep_state_now()
            workspace.collect(self.work, step_task.rules.submission, folder / "submission", notes)
            try:
                report = score_submission(
                    step_task,
                    folder / "submission",
                    self.asset_path,
                    folder / "scoring",
                    self.sandbox_cfg,
                    self.recorder.run_id,
                    on_agent_state=True,
                )
            except ScorerError as e:  # no control here: the step's verifier on the agent's state failed
                report = ScoreReport.invalid(f"its scoring failed: {e}")
            finally:
                shutil.rmtree(folder / "submission", ignore_errors=True)
        for line in notes.lines():
            log.warning("%s", line)
        (folder / "score_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=float))
        log.info(
            "step %d of %d (%s): %s",
            k,
            self.count,
            name,
            f"reward {report.score:g}" if report.valid and report.score is not None else report.reason,
        )
        return report

    def log_reward(self, k: int, reward: float | None) -> None:
        if reward is not None:
            self.recorder.log_metrics({Metric.TASK_STEP_REWARD: reward}, step=k)

    # ---- the run's own scoring ------------------------------------------------------------

    def scored_task(self) -> Task:
        """The task whose judge scores the run's end: the last step reached (the whole task, with its
        control, when that is the last step)."""
        if self.current is None or self.reached == self.count:
            return self.task
        return self.current

    def decided(self) -> ScoreReport | None:
        """The run's report when its end needs no more scoring: it ended at a step already scored
        (min_reward) or at one whose verifier gave no reward."""
        if self.not_scored:
            return dataclasses.replace(ScoreReport.invalid(self.not_scored), metrics=self.metrics(len(self.rewards)))
        if self.ended_early:
            return self.trial_report(None)
        return None

    def trial_report(self, last: ScoreReport | None) -> ScoreReport:
        """The run's report: the trial's reward from the steps' rewards, with LAST (the run's own
        scoring of the last step reached; None: none was needed) among them."""
        rewards = list(self.rewards)
        if last is not None:
            if not last.valid:  # the run's last step is not scored: the run is invalid, as a task of one step's
                return dataclasses.replace(last, metrics={**last.metrics, **self.metrics(len(rewards))})
            rewards.append(last.score)
            self.log_reward(self.reached, last.score)
        scored = len(rewards)
        if not self.ended_early and len(rewards) < self.count:  # steps never reached: 0 (fail closed)
            self.ended_early = (
                f"the run ended in step {self.reached} of {self.count} (its budget or its agent); "
                "the steps after it count 0"
            )
            rewards += [0.0] * (self.count - len(rewards))
        score = trial_reward(rewards, self.task.step_reward)
        if score is None:
            return ScoreReport.invalid("no step of the task was scored")
        over = f"{len(rewards)} steps" if self.task.step_reward == "mean" else "the last step"
        reason = f"Harbor's trial reward ({self.task.step_reward} of the steps' rewards, over {over})"
        base = last if last is not None else ScoreReport(valid=True, reason="", score=score)
        return dataclasses.replace(base, score=score, reason=reason, metrics={**base.metrics, **self.metrics(scored)})

    def metrics(self, scored: int) -> dict[str, float]:
        return {Metric.TASK_STEPS_SCORED: float(scored)}

    def tags(self) -> dict[str, str]:
        return {Tag.STEPS_ENDED_EARLY: self.not_scored or self.ended_early}


def rewards_of(report: ScoreReport) -> dict[str, float]:
    """A step's rewards by key: the reward, and the other keys its verifier wrote (reward.<key> metrics)."""
    found = {
        key.removeprefix("reward."): float(value) for key, value in report.metrics.items() if key.startswith("reward.")
    }
    return {**found, "reward": float(report.score) if report.score is not None else 0.0}


def short_of(rewards: dict[str, float], least: dict[str, float]) -> str:
    """Which of a step's rewards is under its min_reward, in words ("" when none is): a key the
    verifier did not write counts as 0."""
    for key, threshold in least.items():
        got = rewards.get(key, 0.0)
        if not got >= threshold:
            return f"its {key} {got:g} is under its min_reward {threshold:g}"
    return ""


def trial_reward(rewards: list[float | None], strategy: str) -> float | None:
    """Harbor's trial reward from the steps' rewards in order: "final", the last step's; "mean",
    the mean over the steps with a reward. None when no step has one."""
    given = [reward for reward in rewards if reward is not None]
    if not given:
        return None
    if strategy == "final":
        return rewards[-1]
    return sum(given) / len(given)
