"""Anytime scores: what a run's workspace scored after each of its steps, and when
and at what cost, as the metrics from which the report draws its anytime curves.

`python -m mlrb.rescore RUN_ID --all-steps` logs them to the run afterwards, and a run with
`scoring.every_steps` / `every_minutes` during itself (mlrb/harness/step_scoring.py), at MLflow step N for
the workspace after the agent's step N:

- `anytime.valid`: 1 when the workspace then held a valid submission, else 0;
- `anytime.score`, `anytime.normalised_score`: its raw and normalised score (valid only);
- `anytime.counted_normalised_score`: what it counts as in means (mlrb/analysis/counting.py): doing
  nothing when it was not valid or scored worse than doing nothing;
- `anytime.wall_s`: seconds from the agent's start to the step's end, on its clock;
- `anytime.usd`: what the run's model calls had cost by the step's end.

Step 0 is the starting files, before the agent's first step: no submission yet, so it counts
as doing nothing (by definition of that anchor; it is not scored). Pure arithmetic on the
run's trajectory and snapshot lines: no MLflow, no scoring here.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlrb.analysis import counting
from mlrb.core.tags import Metric

VALID, SCORE, NORMALISED = Metric.ANYTIME_VALID, Metric.ANYTIME_SCORE, Metric.ANYTIME_NORMALISED
COUNTED, WALL_S, USD = Metric.ANYTIME_COUNTED, Metric.ANYTIME_WALL_S, Metric.ANYTIME_USD
METRICS = (VALID, SCORE, NORMALISED, COUNTED, WALL_S, USD)
ANCHORS = Metric.ANCHORS  # the run's metrics that normalise and count


def step_metrics(
    valid: bool,
    score: float | None,
    anchors: dict[str, float | None],
    higher_is_better: bool,
    normalisation: str,
    wall_s: float | None,
    usd: float | None,
) -> dict[str, float]:
    """The anytime metrics of one step's workspace, scored (or not) as the run's own was."""
    valid = valid and score is not None
    metrics: dict[str, float | None] = {VALID: float(valid), WALL_S: wall_s, USD: usd}
    if valid:
        assert score is not None
        metrics[SCORE] = score
        metrics[NORMALISED] = counting.normalise(
            score,
            anchors.get(Metric.BASELINE_SCORE),
            anchors.get(Metric.REFERENCE_SCORE),
            higher_is_better,
            normalisation,
        )
    metrics[COUNTED] = counting.count(valid, score, anchors, higher_is_better, normalisation).normalised
    return {name: value for name, value in metrics.items() if value is not None}


def step_ends(trajectory: Sequence[dict], steps: Sequence[dict]) -> dict[int, tuple[float | None, float]]:
    """step -> (seconds from the agent's start to the step's end, dollars spent by then), for each
    snapshot line in `steps`, from the run's trajectory lines (mlrb/run_files/trajectory.py).

    The wall time is the agent's clock when the snapshot was taken (the line's `agent_s`: it
    stands still while the harness scores mid-run). Lines without it: from the trajectory's
    `start` line (the agent's start) to the snapshot's `time`, or, for a line from before times
    were kept, to the step's last trajectory line. The dollars are the model calls'
    (`model_call` lines' `cost_usd`) of that step and the ones before it."""
    start = next((line["time"] for line in trajectory if line.get("event") == "start"), None)
    last_line: dict[int, float] = {}
    calls: list[tuple[int, float]] = []
    for line in trajectory:
        step = line.get("step")
        if not isinstance(step, int):
            continue
        last_line[step] = max(last_line.get(step, line["time"]), line["time"])
        if line.get("event") == "model_call":
            calls.append((step, float(line.get("cost_usd") or 0.0)))
    ends: dict[int, tuple[float | None, float]] = {}
    for entry in steps:
        step = entry["step"]
        end = entry.get("time", last_line.get(step))
        wall = entry.get("agent_s")
        if wall is None and start is not None and end is not None:
            wall = max(0.0, end - start)
        ends[step] = (wall, sum(usd for at, usd in calls if at <= step))
    return ends
