"""mlrb's runs, read out of the tracking store as plain rows.

Each row says what became of its run (`kind`): its recorded status (mlrb/core/status.py;
see docs/reports.md, "How runs count"), or, for a run with none yet, `running` or `crashed`.

- an *attempt* is a run whose status is the agent's doing (ok, invalid,
  no_submission, budget_exhausted, agent_error): the agent had its chance and the
  scorer had its say. It scored when its workspace held a valid submission; in means
  it counts as its run recorded (`counted_score`, mlrb/analysis/counting.py): one without a
  valid submission, or scoring worse than doing nothing, as doing nothing;
- everything else is not the agent's doing and is never counted as a score:
  infrastructure errors, killed runs, runs still going, and runs left RUNNING by a
  process that died (crashed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlrb.core.messages import duration, first_line_of
from mlrb.core.retries import with_retries
from mlrb.core.status import MlflowStatus, Status, parse
from mlrb.core.tags import SWEEP_ROLE, Metric, Tag

# Runs without an outcome yet (they have no status): the report's own two states.
RUNNING = "running"
CRASHED = "crashed"
# Whether the agent could reach what it should not (the two are never pooled).
CONFINED, UNCONFINED = "confined", "unconfined"

ATTEMPTS = tuple(s.value for s in Status if s.is_attempt)
NOT_COUNTED = (Status.INFRA_ERROR.value, Status.KILLED.value, CRASHED, RUNNING)
# Why a run did not score, most telling first (an `ok` run always scored).
CAUSES = tuple(
    s.value
    for s in (
        Status.BUDGET_EXHAUSTED,
        Status.INVALID,
        Status.NO_SUBMISSION,
        Status.AGENT_ERROR,
        Status.INFRA_ERROR,
        Status.KILLED,
    )
) + (CRASHED, RUNNING)

# The param that names an LLM agent's model: runs of one agent with two models never pool.
MODEL_PARAM = "agent.options.model"
WALL_TIME_PARAM = "budget.wall_time_s"
HIGHER_IS_BETTER_PARAM = "task.higher_is_better"
# Every param the report and compare read of a run (classify, to_row): the store sends only these.
READ_PARAMS = (WALL_TIME_PARAM, MODEL_PARAM, HIGHER_IS_BETTER_PARAM)

# A run with no parent sweep still RUNNING this long after its budget ran out is
# taken for crashed: assets, scoring and recording never take that long.
STALE_AFTER_BUDGET_S = 3 * 3600


@dataclass
class Filters:
    experiments: list[str] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    budgets: list[str] = field(default_factory=list)
    scales: list[str] = field(default_factory=list)
    sweep_ids: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [
            f"{label} {', '.join(values)}"
            for label, values in (
                ("experiment", self.experiments),
                ("task", self.tasks),
                ("agent", self.agents),
                ("budget", self.budgets),
                ("scale", self.scales),
                ("sweep", self.sweep_ids),
            )
            if values
        ]
        return "; ".join(parts) or "none"

    def keep(self, row: RunRow) -> bool:
        checks = (
            (self.tasks, row.task),
            (self.agents, row.agent),
            (self.budgets, row.budget),
            (self.scales, row.scale),
            (self.sweep_ids, row.sweep_id),
        )
        return all(not wanted or value in wanted for wanted, value in checks)


# The kinds of a run's dollars (RunRow.cost): the model API's, its compute's (mlrb/core/compute.py), their sum.
COSTS = ("api", "compute", "total")
COST_NAMES = {"api": "API $", "compute": "compute $", "total": "total $"}


@dataclass
class RunRow:
    run_id: str
    name: str
    experiment: str
    task: str
    agent: str
    budget: str
    scale: str
    seed: str
    sweep_id: str
    mlflow_status: str
    kind: str
    detail: str
    valid: bool = False  # the scorer judged its submission valid
    start_time_ms: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    budget_wall_time_s: float | None = None
    sandbox: str = "?"
    # "confined" or "unconfined": the two are never pooled (an unconfined agent could read the answers).
    confinement: str = "?"
    # The task assets' fingerprint: runs on different assets are not pooled either.
    assets: str = ""
    # What its normalised score means (Task.normalised_as); runs recorded before the tag: "gap".
    normalised_as: str = "gap"
    # The LLM agent's model (the `agent.options.model` param; "" for scripted agents).
    model: str = ""
    # The ids of the rules its task states but nothing enforces (tag mlrb.unenforced_rules);
    # None: recorded before runs recorded them, so unknown.
    unenforced_rules: tuple[str, ...] | None = None
    # Why its submission was not valid, how the agent stopped, and where its run folder was
    # (tags mlrb.invalid_reason, mlrb.agent_message, mlrb.stop_reason, mlrb.run_dir): "" when unsaid.
    invalid_reason: str = ""
    agent_message: str = ""
    stop_reason: str = ""
    run_dir: str = ""
    # The run's own id (tag mlrb.run_id: its record's, its run folder's); "" for a run recorded before it.
    own_id: str = ""
    # A run at a plumbing scale (tag mlrb.plumbing): it measures nothing, so no mean includes it.
    plumbing: bool = False
    # Its review's verdict (tag mlrb.review: clean, suspicious, tampering, or error when the review
    # failed) and its findings (mlrb.review_findings); None: recorded before runs were reviewed.
    review: str | None = None
    review_findings: int | None = None
    # Its task's direction (param task.higher_is_better): what a failure counts as is worked out
    # again from it and the anchors (report/flagged.py).
    higher_is_better: bool = True
    # The MLflow experiment's id, for the run's address in the UI.
    experiment_id: str = ""
    # Why a comparison leaves it out whatever it scored ("": it is not): a flagged run under
    # `mlrb.compare --flagged exclude` (report/flagged.py).
    left_out: str = ""

    @property
    def is_attempt(self) -> bool:
        return self.kind in ATTEMPTS

    @property
    def group(self) -> tuple:
        """What never pools: runs of one group are alike in all of these."""
        return (self.task, self.scale, self.agent, self.model, self.budget, self.sandbox, self.confinement, self.assets)

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)

    def cost(self, kind: str) -> float | None:
        """Its dollars of one KIND (COSTS): the model API's (cost_usd), its compute's at the config's
        prices (compute_usd), or their sum; None when it recorded none of them."""
        api, compute = self.metric(Metric.COST_USD), self.metric(Metric.COMPUTE_USD)
        if kind == "api":
            return api
        if kind == "compute":
            return compute
        return None if api is None and compute is None else (api or 0.0) + (compute or 0.0)

    @property
    def scored(self) -> bool:
        """An attempt with a valid submission: it has a score."""
        return self.is_attempt and self.valid

    @property
    def score(self) -> float | None:
        """The raw score: only a valid submission has one."""
        return self.metric(Metric.SCORE) if self.scored else None

    @property
    def normalised(self) -> float | None:
        """The raw normalised score (0 = the baseline, 100 = the reference): only a valid submission has one."""
        return self.metric(Metric.NORMALISED_SCORE) if self.scored else None

    @property
    def counted_score(self) -> float | None:
        """What the attempt counts as in means (mlrb/analysis/counting.py): its score, or the do-nothing
        anchor's when it has no valid one or one worse than doing nothing. None for runs that
        are not attempts, for tasks without a do-nothing anchor, and for runs recorded before
        runs recorded it."""
        return self.metric(Metric.COUNTED_SCORE) if self.is_attempt else None

    @property
    def counted_normalised(self) -> float | None:
        """The counted score on the normalised scale."""
        return self.metric(Metric.COUNTED_NORMALISED_SCORE) if self.is_attempt else None

    @property
    def success(self) -> float | None:
        """MLAgentBench's success (more than 10% over the baseline); an attempt
        without a valid submission is a failure, when the baseline is known."""
        if self.scored:
            return self.metric(Metric.SUCCESS)
        if self.is_attempt and self.metric(Metric.BASELINE_SCORE):
            return 0.0
        return None


def classify(run: Any, parent_status: str | None, now_s: float) -> tuple:
    """(kind, detail, valid) of one MLflow run of the harness; detail says why a run did not score."""
    tags, status = run.data.tags, run.info.status
    mlrb_status = tags.get(Tag.STATUS, "")
    if status in MlflowStatus.UNFINISHED:
        started = (run.info.start_time or 0) / 1000
        age = duration(now_s - started) if started else "unknown time"
        if parent_status and parent_status not in MlflowStatus.UNFINISHED:
            return CRASHED, f"left {status} since {age} ago; its sweep has ended ({parent_status})", False
        budget_s = float(run.data.params.get(WALL_TIME_PARAM) or 0)
        if not parent_status and started and now_s - started > budget_s + STALE_AFTER_BUDGET_S:
            return CRASHED, f"left {status} since {age} ago, long past its budget: its process is gone", False
        return RUNNING, f"started {age} ago", False
    if status == MlflowStatus.KILLED or mlrb_status == Status.KILLED:
        return Status.KILLED.value, first_line_of(tags.get(Tag.ERROR, "")) or "interrupted (KILLED)", False
    if status == MlflowStatus.FAILED or mlrb_status == Status.INFRA_ERROR:
        error = first_line_of(tags.get(Tag.ERROR, "")) or "run FAILED without an error message"
        return Status.INFRA_ERROR.value, error, False
    if tags.get(Tag.VALID) is None:
        return Status.INFRA_ERROR.value, "run finished without a recorded outcome (no mlrb.valid tag)", False
    try:
        kind = parse(mlrb_status)
    except ValueError:
        return Status.INFRA_ERROR.value, f"run finished with an unknown status '{mlrb_status}'", False
    valid = tags[Tag.VALID] == "True"
    reason = first_line_of(tags.get(Tag.INVALID_REASON, "")) or "no reason recorded"
    if kind == Status.OK and not valid:  # recorded before the status said so ("submitted")
        kind = Status.NO_SUBMISSION if reason.startswith("no submission") else Status.INVALID
    if valid:
        return kind.value, "", True
    if kind == Status.BUDGET_EXHAUSTED:
        return kind.value, f"stopped at the {tags.get(Tag.STOP_REASON) or '?'} limit; {reason}", False
    if kind == Status.AGENT_ERROR:
        return kind.value, first_line_of(tags.get(Tag.AGENT_MESSAGE, "")) or reason, False
    return kind.value, reason, False


def to_row(run: Any, experiment: str, parent_status: str | None, now_s: float) -> RunRow:
    tags, params = run.data.tags, run.data.params
    kind, detail, valid = classify(run, parent_status, now_s)
    wall = params.get(WALL_TIME_PARAM)
    return RunRow(
        run_id=run.info.run_id,
        name=run.info.run_name or run.info.run_id,
        experiment=experiment,
        task=tags.get(Tag.TASK, "?"),
        agent=tags.get(Tag.AGENT, "?"),
        budget=tags.get(Tag.BUDGET, "?"),
        scale=tags.get(Tag.SCALE, "?"),
        seed=tags.get(Tag.SEED, ""),
        sweep_id=tags.get(Tag.SWEEP_ID, ""),
        mlflow_status=run.info.status,
        kind=kind,
        detail=detail,
        valid=valid,
        start_time_ms=run.info.start_time,
        metrics=dict(run.data.metrics),
        budget_wall_time_s=float(wall) if wall not in (None, "", "None") else None,
        sandbox=tags.get(Tag.SANDBOX, "?"),
        confinement=confinement(tags),
        assets=tags.get(Tag.ASSETS_FINGERPRINT, ""),
        normalised_as=tags.get(Tag.NORMALISED_AS, "gap"),
        model=params.get(MODEL_PARAM) or "",
        unenforced_rules=rule_ids(tags.get(Tag.UNENFORCED_RULES)),
        invalid_reason=tags.get(Tag.INVALID_REASON, ""),
        agent_message=tags.get(Tag.AGENT_MESSAGE, ""),
        stop_reason=tags.get(Tag.STOP_REASON, ""),
        run_dir=tags.get(Tag.RUN_DIR, ""),
        own_id=tags.get(Tag.RUN_ID, ""),
        plumbing=tags.get(Tag.PLUMBING) == "true",
        review=tags.get(Tag.REVIEW),
        review_findings=findings_count(tags.get(Tag.REVIEW_FINDINGS)),
        higher_is_better=params.get(HIGHER_IS_BETTER_PARAM, "True") != "False",
        experiment_id=run.info.experiment_id,
    )


def findings_count(tag: str | None) -> int | None:
    try:
        return None if tag is None else int(tag)
    except ValueError:
        return None


def rule_ids(tag: str | None) -> tuple[str, ...] | None:
    """The tag's comma-separated ids; None for a run recorded before the tag existed."""
    return None if tag is None else tuple(i for i in tag.split(",") if i)


def confinement(tags: dict[str, str]) -> str:
    """From the run's tag; runs recorded before there was one: docker confined, local not."""
    confined = tags.get(Tag.CONFINED) or {"docker": "true", "local": "false"}.get(tags.get(Tag.SANDBOX, ""), "")
    return {"true": CONFINED, "false": UNCONFINED}.get(confined, "?")


def all_runs(client: Any, experiment_ids: Sequence[str], filter_string: str = "") -> list[Any]:
    """Every active run of these experiments, page by page (a server's pages a few at a time), with
    the params the report reads (a server with mlrb's run search sends only those)."""
    from mlrb.store.run_search import search_all

    return search_all(client, experiment_ids, filter_string, params=READ_PARAMS)


def tag_filter(filters: Filters) -> str:
    """Narrow the search in the store when a filter names one value (the rest is done here)."""
    pairs = [
        (Tag.TASK, filters.tasks),
        (Tag.AGENT, filters.agents),
        (Tag.BUDGET, filters.budgets),
        (Tag.SCALE, filters.scales),
        (Tag.SWEEP_ID, filters.sweep_ids),
    ]
    clauses = [f"tags.`{key}` = '{values[0]}'" for key, values in pairs if len(values) == 1 and "'" not in values[0]]
    return " AND ".join(clauses)


@dataclass
class Selection:
    rows: list[RunRow]
    sweep_parents: dict[str, Any]  # sweep id -> its parent run (for the sweeps the rows belong to)


def load(client: Any, experiments: dict[str, str], filters: Filters, now_s: float | None = None) -> Selection:
    """The harness's runs (not sweep parents) of these experiments (id -> name) that pass the filters."""
    now_s = time.time() if now_s is None else now_s
    runs = all_runs(client, list(experiments), tag_filter(filters))
    parents_by_id = {r.info.run_id: r for r in runs if r.data.tags.get(Tag.ROLE) == SWEEP_ROLE}
    missing = {
        r.data.tags[Tag.PARENT_RUN_ID]
        for r in runs
        if r.data.tags.get(Tag.PARENT_RUN_ID) and r.data.tags[Tag.PARENT_RUN_ID] not in parents_by_id
    }
    for parent_id in missing:  # filtered out of the search above (their tags differ), or in another experiment
        try:
            parents_by_id[parent_id] = with_retries(client.get_run, parent_id)
        except Exception:
            pass  # a deleted parent: its children are still reported
    rows = []
    for run in runs:
        tags = run.data.tags
        if tags.get(Tag.ROLE) == SWEEP_ROLE or Tag.TASK not in tags:
            continue
        parent = parents_by_id.get(tags.get(Tag.PARENT_RUN_ID, ""))
        row = to_row(
            run,
            experiments.get(run.info.experiment_id, run.info.experiment_id),
            parent.info.status if parent else None,
            now_s,
        )
        if filters.keep(row):
            rows.append(row)
    sweeps = {
        p.data.tags.get(Tag.SWEEP_ID, ""): p
        for p in parents_by_id.values()
        if p.data.tags.get(Tag.SWEEP_ID) in {r.sweep_id for r in rows}
    }
    return Selection(rows=rows, sweep_parents=sweeps)
