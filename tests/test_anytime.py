"""Anytime curves (issue 38): each step of a run scored afterwards from its snapshots
(`python -m mlrb.rescore RUN_ID --all-steps`), and the report's best-so-far curves, fixed-budget
table and time to the first valid submission.

The arithmetic on made-up runs (fast); the report's section from a SQLite store filled through
MlflowClient with the metrics rescoring logs; and one real run of a scripted Claude whose score
rises at known steps, rescored and reported."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import scipy.stats

from conftest import run_module
from mlrb.analysis import anytime
from mlrb.report.curves import GroupCurves, Point, RunCurve, band, budgets_table, curve_of, last_per_step
from mlrb.report.runs import RunRow
from mlrb.rescore import chosen_steps
from mlrb.store import record
from mlrb.tasks.attempt_rules import Rules

ANCHORS = {"do_nothing_score": 0.2, "baseline_score": 0.5, "reference_score": 0.7}
FLOOR = -150.0  # doing nothing (0.2) on the 0.5 -> 0.7 scale


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---- a step's metrics ---------------------------------------------------------------------------


@pytest.mark.fast
def test_a_step_counts_as_the_run_would_count_it():
    def metrics(valid, score, anchors=ANCHORS, higher_is_better=True):
        return anytime.step_metrics(valid, score, anchors, higher_is_better, "gap", 12.0, 0.5)

    good = metrics(True, 0.6)
    assert good == {"anytime.valid": 1.0, "anytime.score": 0.6, "anytime.normalised_score": pytest.approx(50.0),
                    "anytime.counted_normalised_score": pytest.approx(50.0), "anytime.wall_s": 12.0,
                    "anytime.usd": 0.5}  # fmt: skip
    # No valid submission: no score, counted as doing nothing.
    assert metrics(False, None) == {"anytime.valid": 0.0, "anytime.counted_normalised_score": pytest.approx(FLOOR),
                                    "anytime.wall_s": 12.0, "anytime.usd": 0.5}  # fmt: skip
    # Valid but worse than doing nothing: its own score kept, counted as doing nothing.
    worse = metrics(True, 0.1)
    assert worse["anytime.normalised_score"] == pytest.approx(-200.0)
    assert worse["anytime.counted_normalised_score"] == pytest.approx(FLOOR)
    # Lower is better (an error): the normalised scale still rises with quality.
    error = {"do_nothing_score": 9.0, "baseline_score": 5.0, "reference_score": 1.0}
    assert metrics(True, 3.0, error, False)["anytime.counted_normalised_score"] == pytest.approx(50.0)
    # A task without a do-nothing anchor has no counted score (as the run's own).
    assert "anytime.counted_normalised_score" not in metrics(True, 0.6, {**ANCHORS, "do_nothing_score": None})


@pytest.mark.fast
def test_a_step_ends_at_its_snapshot_and_has_spent_its_calls_and_the_earlier_ones():
    trajectory = [
        {"time": 100.0, "event": "start"},
        {"time": 101.0, "event": "model_call", "step": 1, "cost_usd": 0.01},
        {"time": 103.0, "event": "tool_result", "step": 1},
        {"time": 104.0, "event": "model_call", "step": 2, "cost_usd": 0.02},
        {"time": 110.0, "event": "tool_result", "step": 2},
        {"time": 111.0, "event": "end"},
    ]
    steps = [{"step": 1, "time": 103.5}, {"step": 2}]  # step 2's line is from before snapshots kept their time
    ends = anytime.step_ends(trajectory, steps)
    assert ends[1] == (pytest.approx(3.5), pytest.approx(0.01))
    assert ends[2] == (pytest.approx(10.0), pytest.approx(0.03))  # its last trajectory line
    assert anytime.step_ends(trajectory[1:], steps)[1] == (None, pytest.approx(0.01))  # no start: no wall time


@pytest.mark.fast
def test_every_nth_step_and_always_the_last():
    entries = [{"step": n} for n in range(1, 8)]
    assert [e["step"] for e in chosen_steps(entries, None)] == [1, 2, 3, 4, 5, 6, 7]
    assert [e["step"] for e in chosen_steps(entries, 3)] == [3, 6, 7]
    assert [e["step"] for e in chosen_steps(entries, 7)] == [7]
    assert [e["step"] for e in chosen_steps(entries, 10)] == [7]


# ---- curves across seeds -------------------------------------------------------------------------


def row(seed: int, agent: str = "claude", limit: float | None = 100.0) -> RunRow:
    return RunRow(run_id=f"{agent}-{seed}", name=f"t/{agent}/smoke/{seed}", experiment="t", task="t", agent=agent,
                  budget="smoke", scale="tiny", seed=str(seed), sweep_id="", mlflow_status="FINISHED", kind="ok",
                  detail="", valid=True, budget_wall_time_s=limit, sandbox="bwrap", confinement="confined")  # fmt: skip


def run(seed: int, steps: list[tuple[float, bool, float]], agent: str = "claude") -> RunCurve:
    """A run from (wall seconds, valid, counted) per step 1, 2, ...; step 0 done nothing; $1 per step."""
    points = [Point(0, 0.0, 0.0, False, FLOOR)]
    points += [Point(i, wall, float(i), valid, counted) for i, (wall, valid, counted) in enumerate(steps, 1)]
    return RunCurve(row(seed, agent), points)


@pytest.mark.fast
def test_the_best_so_far_holds_its_best_and_a_finished_run_keeps_it():
    a = run(1, [(10, False, FLOOR), (20, True, 40.0), (30, True, 10.0), (40, True, 60.0)])
    assert [a.best_at("step", s) for s in range(5)] == [FLOOR, FLOOR, 40.0, 40.0, 60.0]  # step 3's 10 is no best
    assert a.best_at("step", 9) == 60.0  # past its last step: its final best
    assert [a.best_at("wall_s", t) for t in (0, 19.9, 20, 35)] == [FLOOR, FLOOR, 40.0, 40.0]
    assert a.best_at("usd", 2.5) == 40.0
    assert a.first_valid_s() == 20
    assert run(2, [(10, False, FLOOR)]).first_valid_s() == math.inf


@pytest.mark.fast
def test_the_curve_is_the_mean_over_seeds_with_a_95_percent_t_interval():
    runs = [
        run(1, [(10, True, 20.0), (50, True, 70.0)]),
        run(2, [(15, False, FLOOR), (30, True, 30.0)]),
        run(3, [(5, True, 50.0)]),  # ended after one step
    ]
    curve = GroupCurves(runs).series("step")
    assert [x for x, *_ in curve] == [0, 1, 2]
    expected = {0: [FLOOR] * 3, 1: [20.0, FLOOR, 50.0], 2: [70.0, 30.0, 50.0]}
    for x, n, mean, low, high in curve:
        values = expected[x]
        assert n == 3 and mean == pytest.approx(sum(values) / 3)
        if len(set(values)) > 1:  # scipy's t interval of the mean
            want = scipy.stats.t.interval(0.95, 2, loc=mean, scale=scipy.stats.sem(values))
            assert (low, high) == (pytest.approx(want[0], rel=1e-6), pytest.approx(want[1], rel=1e-6))
    # Against wall time: a point wherever any run's best may change.
    assert [x for x, *_ in GroupCurves(runs).series("wall_s")] == [0, 5, 10, 15, 30, 50]
    assert band([7.0]) == (7.0, None, None)  # one run: no interval


@pytest.mark.fast
def test_the_fixed_budget_table_and_the_time_to_the_first_valid_submission():
    runs = [
        run(1, [(5, True, 10.0), (60, True, 30.0)]),
        run(2, [(40, True, 20.0), (105, True, 50.0)]),  # its last step ended past the 100 s limit: counted at it
        run(3, [(20, False, FLOOR), (90, False, FLOOR)]),  # never valid
    ]
    g = GroupCurves(runs)
    assert g.at_fraction(0.1)[:2] == (3, pytest.approx((10.0 + FLOOR + FLOOR) / 3))
    assert g.at_fraction(0.5)[:2] == (3, pytest.approx((10.0 + 20.0 + FLOOR) / 3))
    assert g.at_fraction(1.0)[:2] == (3, pytest.approx((30.0 + 50.0 + FLOOR) / 3))
    assert g.first_valid() == (40, 2, 3)  # the median of 5 s, 40 s and never
    table = budgets_table([g])
    assert table.headers == ["task", "agent", "runs", "time limit", "at 10% of it", "at 50% of it", "at 100% of it",
                             "first valid submission (median)"]  # fmt: skip
    cells = table.rows[0]
    assert cells[:4] == ["t", "claude", "3", "100 s"]
    assert cells[6].startswith(f"{(30.0 + 50.0 + FLOOR) / 3:.1f} [") and cells[6].endswith("] (n=3)")
    assert cells[7] == "40 s (2 of 3 runs had one)"
    # Half the runs never had one: the median is never.
    never = GroupCurves(runs + [run(4, [(30, False, FLOOR)])])
    assert budgets_table([never]).rows[0][7] == "never (2 of 4 runs had one)"
    # No time limit recorded: no fixed-budget values.
    assert GroupCurves([RunCurve(row(1, limit=None), runs[0].points)]).at_fraction(0.5) == (0, None, None, None)


@pytest.mark.fast
def test_a_step_rescored_again_keeps_its_later_value_and_uncounted_steps_leave_the_run_out():
    history = [SimpleNamespace(step=1, timestamp=5, value=2.0), SimpleNamespace(step=1, timestamp=9, value=3.0),
               SimpleNamespace(step=0, timestamp=7, value=1.0)]  # fmt: skip
    assert last_per_step(history) == {0: 1.0, 1: 3.0}
    valid = {0: 0.0, 1: 1.0}
    assert curve_of(row(1), {anytime.VALID: valid, anytime.COUNTED: {0: FLOOR}}) is None
    curve = curve_of(row(1), {anytime.VALID: valid, anytime.COUNTED: {0: FLOOR, 1: 5.0}, anytime.WALL_S: {1: 3.0}})
    assert curve is not None and curve.points[1] == Point(1, 3.0, None, True, 5.0)


@pytest.mark.fast
def test_rescore_s_bad_input_is_one_line(tmp_path, capsys):
    from mlrb import rescore

    cases = {
        ("abc", "--every", "0"): "--every takes a number of steps of 1 or more, not 0",
        ("abc", "--all-steps", "--tracking-dir", str(tmp_path)): f"no tracking store at {tmp_path / 'mlflow.db'} (",
    }
    for args, message in cases.items():
        with pytest.raises(SystemExit) as exit:
            rescore.main(list(args))
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit.value.code == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"mlrb.rescore: error: {message}"), lines


# ---- scoring during the run ---------------------------------------------------------------------------


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.fast
def test_the_budget_s_clock_stands_still_while_paused():
    from mlrb.core.budget import Budget
    from mlrb.core.config import BudgetConfig

    clock = Clock()
    budget = Budget(BudgetConfig(name="t", wall_time_s=100, max_steps=5), clock=clock)
    clock.now += 30
    with budget.paused():
        clock.now += 500  # the harness scoring the workspace: not the agent's time
    clock.now += 10
    assert budget.elapsed_s() == 40 and budget.remaining_s() == 60 and budget.exhausted() is None


class Recorder:
    run_id = "r1"

    def __init__(self):
        self.logged: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics, step=0):
        self.logged[step] = metrics


@pytest.mark.fast
def test_scoring_during_the_run_is_due_by_steps_or_minutes_off_the_agent_s_clock(tmp_path, monkeypatch):
    """StepScoring on a real snapshot store, its scorer replaced by one that takes 60 s of the
    harness's time: the steps whose turn it is are scored once per distinct workspace, logged
    with the agent's clock (the scoring not counted) and its dollars, and the run's own score
    ends the curve."""
    from mlrb.core.budget import Budget
    from mlrb.core.config import BudgetConfig, SandboxConfig, ScoringConfig
    from mlrb.harness import step_scoring
    from mlrb.run_files import snapshots, workspace
    from mlrb.scoring.report import ScoreReport
    from mlrb.tasks.base import Setup

    clock = Clock()
    scored = []

    def score_submission(task, submission, assets, work_dir, sandbox, run_id):
        scored.append((submission / "answer.txt").read_text())
        clock.now += 60
        return ScoreReport(True, "ok", float((submission / "answer.txt").read_text()))

    monkeypatch.setattr(step_scoring, "score_submission", score_submission)
    task = SimpleNamespace(spec=SimpleNamespace(plumbing=False), anchors=SimpleNamespace(read=lambda assets: ANCHORS),
                           rules=Rules("submission"), higher_is_better=True, setup=Setup())  # fmt: skip
    start, work = tmp_path / "start", tmp_path / "work"
    start.mkdir()
    before = workspace.prepare(start, work)
    store = snapshots.StepSnapshots(tmp_path / "snapshots")

    def run(cfg: ScoringConfig, answers: list[str | None]) -> tuple[Recorder, Budget]:
        """A run of 100 s and $0.50 a step; an answer (None: none) written at each step."""
        recorder, budget = Recorder(), Budget(BudgetConfig(name="t", wall_time_s=3600, max_steps=10), clock=clock)
        during = step_scoring.StepScoring(cfg, task, tmp_path, work, start, store.root, SandboxConfig(), recorder,
                                          tmp_path / "run", budget)  # fmt: skip
        for step, answer in enumerate(answers, 1):
            clock.now += 100
            budget.usd += 0.5
            if answer is not None:
                (work / "submission").mkdir(exist_ok=True)
                (work / "submission" / "answer.txt").write_text(answer)
            during.after(store.take(step, work, before, budget.elapsed_s()))
        during.ended(len(answers), ScoreReport(True, "ok", 0.65), budget.summary())
        return recorder, budget

    off, _ = run(ScoringConfig(), ["0.6"])
    assert off.logged == {} and scored == []
    by_steps, budget = run(ScoringConfig(every_steps=2), [None, "0.6", "0.6", "0.7"])
    # Steps 2 and 4 were due; 60 s of scoring each, yet the agent's clock moved 100 s a step only.
    assert scored == ["0.6", "0.7"] and budget.elapsed_s() == 400
    assert sorted(by_steps.logged) == [0, 2, 4]
    assert by_steps.logged[0] == {anytime.VALID: 0.0, anytime.COUNTED: pytest.approx(FLOOR), anytime.WALL_S: 0.0,
                                  anytime.USD: 0.0}  # fmt: skip
    assert by_steps.logged[2] == {anytime.VALID: 1.0, anytime.SCORE: 0.6, anytime.NORMALISED: pytest.approx(50.0),
                                  anytime.COUNTED: pytest.approx(50.0), anytime.WALL_S: 200.0, anytime.USD: 1.0}  # fmt: skip
    # The last step: the run's own score (0.65), at the agent's time and dollars when it ended.
    assert by_steps.logged[4][anytime.SCORE] == 0.65 and by_steps.logged[4][anytime.WALL_S] == 400
    # Every 5 minutes of the agent's clock: steps 3 and 6 (300 s, then 300 s after); step 6 left
    # step 3's workspace, scored once.
    scored.clear()
    by_minutes, _ = run(ScoringConfig(every_minutes=5), ["0.55", None, None, None, None, None, "0.7"])
    assert sorted(by_minutes.logged) == [0, 3, 6, 7] and scored == ["0.55"]
    assert by_minutes.logged[3][anytime.SCORE] == by_minutes.logged[6][anytime.SCORE] == 0.55


@pytest.mark.fast
def test_the_scoring_intervals_are_checked_before_anything_runs():
    from conftest import compose_config
    from mlrb.core.config import ConfigError

    assert compose_config("scoring.every_steps=5").scoring.every_steps == 5
    for override, message in (("scoring.every_steps=0", "scoring.every_steps must be positive, got 0"),
                              ("scoring.every_minutes=-1", "scoring.every_minutes must be positive, got -1")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            compose_config(override)


# ---- the report, from a store -------------------------------------------------------------------


SWEEP_ID = "a11713e5eed0"


def fill(root: Path) -> None:
    """A sweep of two agents x 3 seeds on one task, each run rescored step by step: claude valid from
    step 1 and better at step 3; gpt4o valid from step 2 (seed 3 never). Wall time 100 s per step,
    $0.01 per step; the time limit 600 s. A third agent's run has no anytime metrics."""
    import shutil

    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from conftest import empty_store

    (root / "mlruns").mkdir(parents=True)
    shutil.copyfile(empty_store(), root / "mlruns" / "mlflow.db")
    client = MlflowClient(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")
    experiment = client.create_experiment("llm_merging")
    parent = client.create_run(experiment, tags={"mlrb.role": "sweep", "mlrb.sweep_id": SWEEP_ID}).info.run_id
    plans = {  # agent -> per seed, the counted score (None: not valid) at steps 1..4
        "claude": [[10.0, 10.0, 40.0, 55.0], [20.0, 20.0, 50.0, 45.0], [15.0, 15.0, 60.0, 60.0]],
        "gpt4o": [[None, 5.0, 5.0, 30.0], [None, 10.0, 10.0, 10.0], [None, None, None, None]],
        "baseline": [[]],
    }
    for agent, seeds in plans.items():
        for seed, steps in enumerate(seeds, 1):
            tags = {"mlrb.task": "llm_merging", "mlrb.agent": agent, "mlrb.budget": "smoke", "mlrb.scale": "tiny",
                    "mlrb.seed": str(seed), "mlrb.sandbox": "bwrap", "mlrb.confined": "true", "mlrb.status": "ok",
                    "mlrb.valid": "True", "mlrb.sweep_id": SWEEP_ID, "mlflow.parentRunId": parent}  # fmt: skip
            run = client.create_run(experiment, tags=tags, run_name=f"llm_merging/{agent}/smoke/{seed}").info.run_id
            final = next((v for v in reversed(steps) if v is not None), FLOOR)
            metrics = [Metric("counted_normalised_score", final, 0, 0), Metric("normalised_score", final, 0, 0)]
            for step, value in enumerate([None, *steps] if agent != "baseline" else []):  # step 0: the starting files
                at = {anytime.VALID: float(value is not None), anytime.COUNTED: FLOOR if value is None else value,
                      anytime.WALL_S: 100.0 * step, anytime.USD: 0.01 * step}  # fmt: skip
                metrics += [Metric(k, v, 1000 + step, step) for k, v in at.items()]
            client.log_batch(run, metrics=metrics, params=[Param("budget.wall_time_s", "600")])
            client.set_terminated(run, "FINISHED")
    client.set_terminated(parent, "FINISHED")


@pytest.mark.integration
def test_the_report_draws_the_anytime_section_from_the_runs_metrics(tmp_path):
    from conftest import mlflow_client
    from test_report import report

    fill(tmp_path)
    out = tmp_path / "report"
    result = report("--sweep", SWEEP_ID, "--html", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = (out / "summary.md").read_text()
    section = summary.split("## Anytime curves", 1)[1].split("\n## ", 1)[0]
    assert "`python -m mlrb.rescore RUN_ID --all-steps`" in section
    table = [line for line in section.splitlines() if line.startswith("| llm_merging")]
    assert len(table) == 2  # claude and gpt4o; the baseline's run was not rescored
    claude = [c.strip() for c in table[0].split("|")[1:-1]]
    # 10% of 600 s: step 0 only (-150 each); 50% (300 s): step 3; 100%: the best of all four steps.
    assert claude[:5] == ["llm_merging", "claude", "3", "10.0 min", "-150.0 [-150.0, -150.0] (n=3)"]
    assert claude[5].startswith("50.0 [") and claude[6].startswith("55.0 [")
    assert claude[7] == "100 s (3 of 3 runs had one)"
    gpt4o = [c.strip() for c in table[1].split("|")[1:-1]]
    assert gpt4o[7] == "3.3 min (2 of 3 runs had one)"  # 200 s, 200 s and never
    assert "<h2>Anytime curves</h2>" in (out / "report.html").read_text()
    assert "anytime.png" in summary and (out / "anytime.png").stat().st_size > 10_000

    curves = read_csv(out / "anytime_curves.csv")
    steps = [r for r in curves if r["agent"] == "claude" and r["axis"] == "steps"]
    assert [(r["x"], float(r["mean"])) for r in steps] == [("0", FLOOR), ("1", 15.0), ("2", 15.0), ("3", 50.0),
                                                           ("4", 55.0)]  # fmt: skip
    want = scipy.stats.t.interval(0.95, 2, loc=50.0, scale=scipy.stats.sem([40.0, 50.0, 60.0]))
    assert float(steps[3]["low"]) == pytest.approx(want[0]) and float(steps[3]["high"]) == pytest.approx(want[1])
    hours = [r for r in curves if r["agent"] == "gpt4o" and r["axis"] == "wall_hours"]
    assert float(hours[2]["x"]) == pytest.approx(200 / 3600) and float(hours[2]["mean"]) == pytest.approx(
        (5.0 + 10.0 + FLOOR) / 3
    )
    assert {r["axis"] for r in curves} == {"steps", "wall_hours", "usd"}
    budgets = read_csv(out / "anytime_budgets.csv")
    assert [b["agent"] for b in budgets] == ["claude", "gpt4o"]
    assert float(budgets[1]["first_valid_median_s"]) == 200.0 and budgets[1]["runs_with_valid"] == "2"

    # Onto the sweep's parent run, with the rest of the report.
    client = mlflow_client(tmp_path)
    parent = next(r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                  if r.data.tags.get("mlrb.role") == "sweep")  # fmt: skip
    assert "## Anytime curves" in parent.data.tags["mlflow.note.content"]
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/anytime.png", "report/anytime_curves.csv", "report/anytime_budgets.csv"} <= logged


# ---- a real run ------------------------------------------------------------------------------------


BASELINE_WEIGHTS = "weights = args.weights or [1.0 / len(adapter_dirs)] * len(adapter_dirs)"
SUMMED_WEIGHTS = "weights = args.weights or [1.0] * len(adapter_dirs)"
MERGE_ARGS = '--data "$MLRB_DATA" --output submission'


def rescore(run_id: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_module("mlrb.rescore", run_id, *args, cwd=cwd)


@pytest.mark.system  # the rise is the task's science, on counted normalised scores: the calibrated tiny scale's
def test_a_scripted_agent_s_rise_at_known_steps_is_on_its_anytime_curve(tmp_path, built_cache):
    """Claude, scripted: step 1 reads (no submission), step 2 merges with the experts' weights summed (a
    valid submission, worse than the baseline), step 3 puts the baseline's averaging back and merges
    again, step 4 submits. The run scores its workspace during the run at step 3
    (scoring.every_steps=3), off the agent's clock; rescored step by step afterwards, the best so far
    rises at steps 2 and 3."""
    from conftest import mlflow_client, run_cli, store_args
    from fake_llm_server import FakeLlmServer, reply, tool

    script = [
        reply(tool("read_file", path="merge.py", start_line=70, num_lines=10)),
        reply(
            tool("edit_file", path="merge.py", old_text=BASELINE_WEIGHTS, new_text=SUMMED_WEIGHTS),
            tool("run_python", path="merge.py", args=MERGE_ARGS, timeout_s=300),
        ),  # fmt: skip
        reply(
            tool("edit_file", path="merge.py", old_text=SUMMED_WEIGHTS, new_text=BASELINE_WEIGHTS),
            tool("run_python", path="merge.py", args=MERGE_ARGS, timeout_s=300),
        ),  # fmt: skip
        reply(tool("submit", summary="averaged after all")),
    ]
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, built_cache), "agent=claude", "scoring.every_steps=3", cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": "sk-ant-anytime", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    run = client.search_runs([client.get_experiment_by_name("llm_merging").experiment_id])[0]
    run_id, final = run.info.run_id, run.data.metrics

    def history(name: str) -> dict[int, float]:
        return last_per_step(client.get_metric_history(run_id, name))

    # During the run: the starting files, step 3 scored in the scorer's sandbox, and the run's own
    # score at its last step. The scoring was inside the agent's stage but not on its clock.
    during = {name: history(name) for name in anytime.METRICS}
    assert during[anytime.VALID] == {0: 0.0, 3: 1.0, 4: 1.0}
    assert during[anytime.NORMALISED][3] == during[anytime.NORMALISED][4] == pytest.approx(final["normalised_score"])
    assert during[anytime.WALL_S][4] == final["agent_time_s"] and during[anytime.USD][4] == final["cost_usd"]
    assert json.loads((Path(run.data.tags["mlrb.run_dir"]) / "anytime" / "step-3" / "score_report.json").read_text())[
        "valid"
    ]
    assert final["stage_time_s.agent"] - final["agent_time_s"] > 3  # a scoring: a sandbox, torch, the eval

    rescored = rescore(run_id, "--all-steps", cwd=tmp_path)
    assert rescored.returncode == 0, rescored.stderr[-3000:]
    lines = rescored.stdout.strip().splitlines()
    assert lines[0] == f"llm_merging/claude/smoke/0: scoring 4 of its 4 steps' workspaces (run {run_id})"
    assert lines[1].startswith("step 0, 0 s, $0.0000, counted normalised ") and "(the starting files" in lines[1]
    assert lines[2].endswith("(invalid: no submission: the agent left nothing at 'submission' in its workspace)")
    assert lines[5].endswith("(the same workspace as step 3)")
    assert lines[-1] == "logged the anytime metrics at 5 steps (3 workspaces scored); python -m mlrb.report draws them"

    valid, counted = history(anytime.VALID), history(anytime.COUNTED)
    # The run folder's record holds them too: the store is in sync with it.
    run_dir = Path(run.data.tags["mlrb.run_dir"])
    kept = record.fold(record.read(run_dir))["metrics"]
    assert {step: value for step, value in kept[anytime.COUNTED]} == counted
    synced = run_module("mlrb.sync", str(run_dir), "--tracking-dir", "mlruns", cwd=tmp_path)
    assert "in sync, nothing to upload" in synced.stdout, synced.stdout + synced.stderr[-2000:]
    floor = final["do_nothing_score"]
    assert valid == {0: 0.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 1.0}
    assert counted[0] == counted[1] < counted[2] < counted[3] == counted[4]  # rises at steps 2 and 3
    assert counted[0] == pytest.approx(100 * (floor - final["baseline_score"]) / (final["reference_score"]
                                                                                   - final["baseline_score"]))  # fmt: skip
    # The last step is the workspace the run was scored on: the same score, normalised on the run's anchors.
    assert history(anytime.SCORE)[4] == pytest.approx(final["score"], abs=1e-9)
    assert history(anytime.NORMALISED)[4] == pytest.approx(final["normalised_score"], abs=1e-6)
    # Wall times rise step by step within the agent's time; dollars as the model calls cost them.
    wall, usd = history(anytime.WALL_S), history(anytime.USD)
    assert wall[3] == during[anytime.WALL_S][3] and history(anytime.SCORE)[3] == during[anytime.SCORE][3]
    assert wall[0] == 0 and all(wall[s] < wall[s + 1] for s in range(4))
    assert wall[3] <= final["agent_time_s"] < wall[4] + 1  # step 4: the final state, taken as the agent ended
    cost = {m.step: m.value for m in client.get_metric_history(run_id, "llm.cost_usd")}
    assert all(usd[s] == pytest.approx(cost[s], abs=1e-6) for s in range(1, 5)) and usd[4] == pytest.approx(
        final["cost_usd"], abs=1e-6
    )

    # Every 3rd step and the last: scored again, logged again; the report reads the later values.
    every = rescore(run_id, "--every", "3", cwd=tmp_path)
    assert every.returncode == 0, every.stderr[-3000:]
    assert [line.split(",")[0] for line in every.stdout.splitlines()[1:-1]] == ["step 0", "step 3", "step 4"]
    assert len(client.get_metric_history(run_id, anytime.COUNTED)) == 3 + 5 + 3  # during the run, then twice
    out = tmp_path / "report"
    report = run_module("mlrb.report", "--no-plots", "--out", str(out), cwd=tmp_path, timeout=300)
    assert report.returncode == 0, report.stderr
    assert "## Anytime curves" in (out / "summary.md").read_text()
    steps = [r for r in read_csv(out / "anytime_curves.csv") if r["axis"] == "steps"]
    assert [(r["x"], float(r["mean"])) for r in steps] == [
        ("0", pytest.approx(counted[0])), ("1", pytest.approx(counted[0])), ("2", pytest.approx(counted[2])),
        ("3", pytest.approx(counted[3])), ("4", pytest.approx(counted[3])),
    ]  # fmt: skip
