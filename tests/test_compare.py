"""`python -m mlrb.compare`: paired comparisons of agents and seed planning (issue 38).

The statistics on rows made by hand (fast), checked against scipy.stats where it has the same
test; then the command line against a real SQLite store filled through MlflowClient with the
tags, params and metrics the report reads (no benchmark runs: they take tens of seconds each)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from conftest import run_module
from mlrb.analysis import stats
from mlrb.report.paired import (
    CompareError,
    Noise,
    Plan,
    compare,
    noise_of_calibration,
    noise_of_runs,
    rank,
    resolve,
    stratum_labeller,
)
from mlrb.report.runs import RunRow

STATUS = {"infra_error": "FAILED", "killed": "KILLED", "running": "RUNNING"}


def row(agent: str, task: str, seed: int, value: float | None, kind: str = "ok", **fields) -> RunRow:
    """One run as the report reads it; `value` is its counted normalised score (None: none recorded)."""
    budget = fields.pop("budget", "smoke")
    return RunRow(
        run_id=f"{agent}/{task}/{budget}/{seed}/{fields.get('sweep_id', '')}", name=f"{task}/{agent}/{budget}/{seed}",
        experiment=task, task=task, agent=agent, budget=budget, scale="tiny", seed=str(seed),
        sweep_id=fields.pop("sweep_id", ""), mlflow_status=STATUS.get(kind, "FINISHED"), kind=kind,
        detail=fields.pop("detail", ""), valid=kind == "ok",
        metrics={} if value is None else {"counted_normalised_score": value}, **fields,
    )  # fmt: skip


def side(agent: str, scores: dict[str, list[float]]) -> list[RunRow]:
    """Runs of one agent: task -> its scores at seeds 1, 2, ..."""
    return [row(agent, task, i + 1, v) for task, values in scores.items() for i, v in enumerate(values)]


def label(key):
    return key[0]


@pytest.mark.fast
def test_a_large_difference_is_told_apart_with_a_small_p():
    rng = np.random.default_rng(1)
    tasks = [f"t{i}" for i in range(3)]
    b = {t: list(rng.normal(20, 8, 8)) for t in tasks}
    a = {t: [v + 30 + rng.normal(0, 5) for v in b[t]] for t in tasks}
    c = compare("claude", side("claude", a), "gpt4o", side("gpt4o", b), label)
    assert c.pairs == 24 and not c.unpaired
    assert c.diff == pytest.approx(30, abs=4)
    assert c.interval[0] > 0 and c.p < 0.001  # the exact test: 2 of 2**24 sign patterns are as extreme
    assert all(t.interval[0] > 0 and t.p < 0.01 for t in c.tasks)
    assert c.outcome == 1
    assert c.verdict().startswith("claude beats gpt4o: ahead on 3 of 3 tasks (significantly on 3); overall +")
    assert c.verdict().endswith("p < 0.001")
    # Named the other way round, the same verdict from the winner's side, and the differences negated.
    d = compare("gpt4o", side("gpt4o", b), "claude", side("claude", a), label)
    assert d.verdict() == c.verdict() and d.diff == pytest.approx(-c.diff)


@pytest.mark.fast
def test_identical_agents_cannot_be_told_apart():
    # B scored what A scored, at other seeds: the differences sum to 0.
    a = {"t0": [10.0, 40.0, 25.0, 60.0, 5.0, 33.0], "t1": [70.0, 20.0, 45.0, 50.0, 30.0, 65.0]}
    b = {task: values[1:] + values[:1] for task, values in a.items()}
    c = compare("a", side("a", a), "b", side("b", b), label)
    assert c.diff == pytest.approx(0, abs=1e-9)
    assert c.interval[0] < 0 < c.interval[1] and c.p > 0.5 and c.outcome == 0
    assert c.verdict().startswith("cannot tell a from b (the interval contains 0): a ahead on ")


@pytest.mark.fast
def test_pairing_reports_every_run_left_out_and_why():
    a = side("a", {"t0": [50.0, 55.0, 60.0, 40.0]}) + side("a", {"only_a": [10.0, 20.0]})
    b = side("b", {"t0": [30.0, 35.0]}) + [
        row("b", "t0", 3, None, "infra_error", detail="the scorer crashed"),
        row("b", "t0", 4, None, "invalid"),  # an attempt recorded without a counted score
    ]
    c = compare("a", a, "b", b, label)
    assert [(t.task, len(t.pairs), t.unpaired) for t in c.tasks] == [("t0", 2, 2)]
    assert c.unpaired == [
        "only_a: only a ran it (2 runs, seeds 1, 2); b has none",
        "t0 seed 3: a 60.0; b not counted (infrastructure error: the scorer crashed)",
        "t0 seed 4: a 40.0; b no counted score (its task has no do-nothing anchor, or it was recorded before runs "
        "recorded one)",
    ]
    assert c.table().rows[-1][:3] == ["overall (1 tasks)", "2", "4"]  # 2 seeds of t0, 2 of only_a


@pytest.mark.fast
def test_failures_count_as_doing_nothing_and_are_paired_not_dropped():
    """A side whose every attempt failed is not a side without runs: each failure counted as
    doing nothing (-68 here, as llm_merging tiny's do-nothing anchor), so it is compared and loses."""
    a = side("a", {"t0": [12.0, 3.0, 20.0, 8.0, 15.0, 5.0]})
    failures = [row("b", "t0", s, -68.0, kind) for s, kind in
                enumerate(["invalid", "no_submission", "budget_exhausted", "agent_error", "invalid", "invalid"], 1)]  # fmt: skip
    c = compare("a", a, "b", failures, label)
    assert c.pairs == 6 and not c.unpaired
    assert c.diff == pytest.approx(68 + 63 / 6)
    assert c.verdict().startswith("a beats b: ahead on 1 of 1 tasks (significantly on 1)")


@pytest.mark.fast
def test_two_counted_runs_at_one_seed_are_ambiguous_and_say_how_they_differ():
    a = [row("a", "t0", 1, 50.0, budget="smoke"), row("a", "t0", 1, 70.0, budget="1h")]
    with pytest.raises(CompareError, match=r"a has 2 counted runs of t0 with seed 1 .*differ in budget 1h, smoke"):
        compare("a", a, "b", side("b", {"t0": [30.0]}), label)


@pytest.mark.fast
def test_sides_are_agents_models_or_sweeps_and_a_bad_name_says_what_there_is():
    rows = [row("claude", "t0", 1, 5.0, model="sonnet", sweep_id="abc"), row("gpt4o", "t0", 1, 3.0, model="4o")]
    assert {n: len(r) for n, r in resolve(rows, ["sonnet", "gpt4o"], "w").items()} == {"sonnet": 1, "gpt4o": 1}
    assert len(resolve(rows, ["abc", "4o"], "w")["abc"]) == 1
    with pytest.raises(CompareError, match=r"unknown agent, model or sweep id 'codex' in w; there: agents claude, "
                                           r"gpt4o; models 4o, sonnet; sweeps abc"):  # fmt: skip
        resolve(rows, ["claude", "codex"], "w")
    with pytest.raises(CompareError, match="'claude' and 'abc' share 1 runs"):
        resolve(rows, ["claude", "abc"], "w")


@pytest.mark.fast
def test_clustering_by_task_widens_the_interval_when_tasks_differ():
    """Tasks whose differences disagree (0 to 30 points) but each with little seed noise: pooling
    every difference as if from one task understates how much the overall figure could move."""
    rng = np.random.default_rng(2)
    by_task = [list(rng.normal(effect, 2, 6)) for effect in (0, 10, 20, 30)]
    pooled = [d for g in by_task for d in g]
    clustered = stats.bootstrap_interval(by_task)
    naive = stats.bootstrap_interval([pooled])
    assert stats.mean_of_means(by_task) == pytest.approx(sum(pooled) / len(pooled))
    assert clustered[1] - clustered[0] > 1.5 * (naive[1] - naive[0])
    # ...and tasks that agree give about the interval of pooling (a little wider: seeds are drawn at both stages).
    alike = [list(rng.normal(15, 2, 6)) for _ in range(4)]
    agree = stats.bootstrap_interval(alike)
    pooled_alike = stats.bootstrap_interval([[d for g in alike for d in g]])
    assert agree[1] - agree[0] < 1.6 * (pooled_alike[1] - pooled_alike[0])


@pytest.mark.fast
def test_the_interval_and_p_agree_with_scipy_and_are_reproducible():
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(4)
    d = list(rng.normal(4, 10, 12))
    exact = scipy_stats.permutation_test((np.array(d),), np.mean, permutation_type="samples", n_resamples=np.inf)
    assert stats.sign_flip_p([d]) == pytest.approx(exact.pvalue)
    many = list(rng.normal(4, 10, 40))  # past EXACT_UP_TO: random flips
    sampled = scipy_stats.permutation_test((np.array(many),), np.mean, permutation_type="samples",
                                           n_resamples=20_000, random_state=1)  # fmt: skip
    assert stats.sign_flip_p([many]) == pytest.approx(sampled.pvalue, abs=0.01)
    # Many values: the expanded level is near the plain one, so the interval is scipy's percentile interval.
    reference = scipy_stats.bootstrap((np.array(many),), np.mean, method="percentile", n_resamples=20_000,
                                      random_state=1).confidence_interval  # fmt: skip
    low, high = stats.bootstrap_interval([many], resamples=20_000)
    width = reference.high - reference.low
    assert abs(low - reference.low) < 0.12 * width and abs(high - reference.high) < 0.12 * width
    assert stats.bootstrap_interval([many], seed=3) == stats.bootstrap_interval([many], seed=3)
    assert stats.t_quantile(0.975, 5) == pytest.approx(scipy_stats.t.ppf(0.975, 5), rel=1e-6)


@pytest.mark.fast
def test_the_interval_covers_the_true_effect_about_95_percent_of_the_time():
    """Over repeated draws of one task's seeds with a known effect, and of 7 tasks whose effects
    spread around it: covered 93-97% of the time (with 300 draws, one SE is 1.3 points)."""
    rng = np.random.default_rng(5)
    one_task = sum(low <= 5 <= high for low, high in
                   (stats.bootstrap_interval([list(rng.normal(5, 10, 12))], resamples=2000, seed=i)
                    for i in range(300)))  # fmt: skip
    tasks = sum(low <= 5 <= high for low, high in
                (stats.bootstrap_interval([list(rng.normal(rng.normal(5, 5), 10, 5)) for _ in range(7)],
                                          resamples=2000, seed=i) for i in range(300)))  # fmt: skip
    assert 0.93 <= one_task / 300 <= 0.97 and 0.93 <= tasks / 300 <= 0.97, (one_task, tasks)


@pytest.mark.fast
def test_more_than_two_sides_are_grouped_by_what_no_test_tells_apart():
    rng = np.random.default_rng(3)
    base = {t: list(rng.normal(10, 5, 8)) for t in ("t0", "t1")}
    strong = {t: [v + 40 + rng.normal(0, 3) for v in values] for t, values in base.items()}
    also = {t: values[2:] + values[:2] for t, values in strong.items()}  # claude's scores at other seeds
    sides = {"weak": side("weak", base), "claude": side("claude", strong), "gpt4o": side("gpt4o", also)}
    ranking = rank(sides, label)
    assert ranking.order[-1] == "weak"
    assert [sorted(g) for g in ranking.groups] == [["claude", "gpt4o"], ["weak"]]
    assert ranking.groups_line().startswith("statistically tied groups, best first: [")
    table = ranking.table()
    assert len(table.rows) == 3 and table.headers[-2:] == ["p (Holm)", "verdict"]
    assert {r[-1] for r in table.rows} == {"claude beats weak", "gpt4o beats weak", "cannot tell"}


@pytest.mark.fast
def test_the_plan_is_the_normal_approximation_and_shrinks_as_the_effect_grows():
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
    noise = [Noise("t0", 20.0, "given")]
    for effect in (5, 10, 20):
        assert Plan(effect, noise).seeds(noise[0]) == math.ceil((z * 20 / effect) ** 2)  # 126, 32, 8
    assert Plan(40, noise).seeds(noise[0]) == 6  # the formula's 2 pairs could never reach p < 0.05
    assert "6 (formula: 2)" in Plan(40, noise).table().markdown()
    assert stats.fewest_pairs(0.05) == 6 and stats.smallest_p(6) < 0.05 < stats.smallest_p(5)
    assert Plan(10, [Noise("t0", None, "none")]).overall() is None
    # The overall mean over tasks: its variance is sum(SD**2) / tasks**2 per seed, counted twice by the interval.
    two = [Noise("t0", 20.0, ""), Noise("t1", 10.0, "")]
    assert Plan(5, two).overall() == math.ceil(z**2 * 2 * (400 + 100) / 4 / 25)


@pytest.mark.fast
def test_noise_comes_from_the_runs_at_hand_or_from_the_calibration():
    rows = side("a", {"t0": [10.0, 20.0, 30.0]}) + side("b", {"t0": [50.0, 60.0, 70.0], "t1": [5.0]})
    t0, t1 = noise_of_runs(rows, stratum_labeller(rows))
    assert t0.sd_diff == pytest.approx(10 * math.sqrt(2)) and t1.sd_diff is None  # each group's SD is 10
    calibration = {
        "t0": {"anchors": {"baseline": {"mean": 0.55, "values": [0.5, 0.6]},
                           "reference": {"mean": 0.95, "values": [0.9, 1.0]}}},
        "fixed": {"anchors": {"baseline": {"mean": 0.5, "values": [0.5]}, "reference": {"mean": 1.0, "values": [1.0]}}},
    }  # fmt: skip
    fixed, t0 = noise_of_calibration(calibration)
    # pooled SD 0.0707 raw, 100 / 0.4 normalised points per raw point, times sqrt(2) for a difference
    assert t0.sd_diff == pytest.approx(math.sqrt(0.005) * 250 * math.sqrt(2))
    assert fixed.sd_diff is None and "same at every seed" in fixed.source
    repo_calibration = json.loads((Path(__file__).parents[1] / "benchmarks" / "calibration.json").read_text())
    assert {n.task for n in noise_of_calibration(repo_calibration) if n.sd_diff} >= {"llm_efficiency", "baby_lm"}


@pytest.mark.fast
def test_the_report_compares_per_budget_the_agents_or_an_agent_s_models():
    from mlrb.report.paired import report_sections, report_sides

    rows = (side("a", {"t0": [50.0, 55.0, 60.0, 52.0, 58.0, 51.0]}) + side("b", {"t0": [10.0, 15.0, 20.0, 12.0, 8.0, 9.0]})
            + [row("solo", "t0", 1, 5.0, budget="1h")]
            + [row("c", "t0", s, v, model=m, budget="24h") for s, v, m in ((1, 5.0, "x"), (1, 9.0, "y"))])  # fmt: skip
    assert set(report_sides([r for r in rows if r.budget == "24h"])) == {"x", "y"}
    sections = report_sections(rows)
    assert [heading for heading, _, _ in sections] == [
        "Paired comparisons (budget 24h)",
        "Paired comparisons (budget smoke)",
    ]
    _, intro, table = sections[1]
    assert (
        "Verdict: a beats b: ahead on 1 of 1 tasks" in intro and "`python -m mlrb.compare a b --budget smoke`" in intro
    )
    assert table.rows[-1][0] == "overall (1 tasks)"
    assert sections[0][1].startswith("Runs of two agents pair") and sections[0][2] is not None  # x against y
    assert report_sections([r for r in rows if r.agent == "a"]) == []  # one agent: nothing to compare


# ---- the command line ----------------------------------------------------------------------


def compare_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_module("mlrb.compare", *args, cwd=cwd, timeout=300)


@pytest.mark.fast
def test_help_is_fast_and_bad_arguments_are_one_line(tmp_path):
    probe = "import sys; from mlrb.compare import parser; parser(); print(sorted(m for m in ('mlflow', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr
    helped = compare_cli("--help", cwd=tmp_path)
    assert (
        helped.returncode == 0 and "sign-flip permutation test" in helped.stdout and "--tracking-uri" in helped.stdout
    )
    cases = {
        "name two or more agents, models or sweep ids to compare (A B); got only 'claude'": ["claude"],
        "--effect must be a positive number of normalised points (e.g. 10); got -5": ["--plan", "--effect", "-5"],
        "--plan needs --effect": ["--plan"],
        "--effect is for --plan": ["a", "b", "--effect", "10"],
        "--power must be between 0 and 1": ["--plan", "--effect", "10", "--power", "80"],
        f"no tracking store at {tmp_path / 'mlruns' / 'mlflow.db'}": ["a", "b"],
    }
    for message, args in cases.items():
        result = compare_cli(*args, cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("mlrb.compare: error: ") and message in lines[0], (args, lines)


SWEEP_ID, BASELINE_SWEEP = "5eed0c1a0de1", "ba5e11e5eed0"


def fill(store: Path) -> None:
    """Runs as the harness records them, in two tasks' experiments, seeds 1-6: a sweep of claude
    (model sonnet-x) and gpt4o (model 4o-x), about 25 points above a sweep of the baseline.
    Left unpaired: claude's seed 7 of llm_merging, and the baseline's seed 6 of math_reasoning,
    an infrastructure error."""
    import shutil

    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from conftest import empty_store

    (store / "mlruns").mkdir(parents=True)
    shutil.copyfile(empty_store(), store / "mlruns" / "mlflow.db")
    client = MlflowClient(f"sqlite:///{store / 'mlruns' / 'mlflow.db'}")
    rng = np.random.default_rng(0)
    parents: dict[str, str] = {}
    for task, level in (("llm_merging", 10.0), ("math_reasoning", 30.0)):
        experiment = client.create_experiment(task)
        for sweep in (SWEEP_ID, BASELINE_SWEEP):
            if sweep not in parents:
                parents[sweep] = client.create_run(
                    experiment, tags={"mlrb.role": "sweep", "mlrb.sweep_id": sweep}
                ).info.run_id
        for agent, model, gain in (("baseline", "", 0.0), ("claude", "sonnet-x", 25.0), ("gpt4o", "4o-x", 24.0)):
            sweep = BASELINE_SWEEP if agent == "baseline" else SWEEP_ID
            for seed in range(1, 8 if (agent, task) == ("claude", "llm_merging") else 7):
                failed = (agent, task, seed) == ("baseline", "math_reasoning", 6)
                value = level + gain + rng.normal(0, 4)
                tags = {"mlrb.task": task, "mlrb.agent": agent, "mlrb.budget": "smoke", "mlrb.scale": "tiny",
                        "mlrb.seed": str(seed), "mlrb.sandbox": "bwrap", "mlrb.confined": "true",
                        "mlrb.status": "infra_error" if failed else "ok", "mlrb.valid": str(not failed),
                        "mlrb.sweep_id": sweep, "mlflow.parentRunId": parents[sweep]}  # fmt: skip
                if failed:
                    tags["mlrb.error"] = "ScorerError: the scorer crashed"
                run = client.create_run(experiment, tags=tags, run_name=f"{task}/{agent}/smoke/{seed}").info.run_id
                metrics = {} if failed else {"score": value / 100, "normalised_score": value, "counted_score": value / 100,
                                             "counted_normalised_score": value}  # fmt: skip
                client.log_batch(run, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                                 params=[Param("agent.options.model", model)] if model else [])  # fmt: skip
                client.set_terminated(run, "FAILED" if failed else "FINISHED")
    for parent in parents.values():
        client.set_terminated(parent, "FINISHED")


ONE_STORE = pytest.mark.xdist_group("compare_store")  # one process, so the store is filled once


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare-store")
    fill(root)
    return root


def verdict(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.integration
@ONE_STORE
def test_the_command_line_compares_agents_models_and_sweeps_in_a_real_store(store):
    # The --help epilog's example: one task.
    one = compare_cli("baseline", "claude", "--task", "llm_merging", cwd=store)
    assert verdict(one).startswith("claude beats baseline: ahead on 1 of 1 tasks (significantly on 1); overall +")
    assert "- llm_merging seed 7: baseline no run; claude " in one.stdout
    both = compare_cli("baseline", "claude", cwd=store)
    # math_reasoning has 5 pairs: the sign-flip test cannot go below p = 2/32 on it alone
    assert verdict(both).startswith("claude beats baseline: ahead on 2 of 2 tasks (significantly on 1)")
    assert (
        "math_reasoning seed 6: baseline not counted (infrastructure error: ScorerError: the scorer crashed)"
        in both.stdout
    )
    assert "| overall (2 tasks) | 11 | 2 |" in both.stdout
    assert compare_cli("baseline", "claude", cwd=store).stdout == both.stdout  # a fixed seed: the same output
    # A model and a sweep id name sides as an agent does.
    by_name = compare_cli("4o-x", "sonnet-x", "--tracking-dir", str(store / "mlruns"), cwd=store.parent)
    assert verdict(by_name).startswith("cannot tell 4o-x from sonnet-x (the interval contains 0)")
    by_sweep = compare_cli(BASELINE_SWEEP, "sonnet-x", cwd=store)
    assert verdict(by_sweep).startswith(f"sonnet-x beats {BASELINE_SWEEP}: ahead on 2 of 2 tasks")
    three = compare_cli("baseline", "claude", "gpt4o", cwd=store)
    groups = verdict(three)
    assert groups.startswith("statistically tied groups, best first: [") and groups.endswith(" [baseline]")
    assert {"claude", "gpt4o"} <= set(groups.split("[")[1].rstrip("] ").split(", "))
    assert "| baseline | claude | 2 | 11 |" in three.stdout


@pytest.mark.integration
@ONE_STORE
def test_the_command_line_plans_seeds_from_the_runs_at_hand_or_the_calibration(store, tmp_path):
    at_hand = compare_cli("--plan", "--effect", "10", cwd=store)
    assert at_hand.returncode == 0, at_hand.stderr
    assert at_hand.stdout.startswith("Noise of the 37 runs at hand in sqlite:///")
    assert "| llm_merging | per-seed scores (19 counted runs in groups of 2 or more) × √2 |" in at_hand.stdout
    paired = compare_cli("claude", "gpt4o", "--plan", "--effect", "5", "--power", "0.9", cwd=store)
    assert "| math_reasoning | paired differences claude − gpt4o (6 pairs) |" in paired.stdout
    assert "= (3.24 × SD / 5)², rounded up" in paired.stdout
    # No store here: the calibration file's noise (the --help epilog's second example).
    calibrated = compare_cli("--plan", "--effect", "10", cwd=tmp_path)
    assert calibrated.returncode == 0, calibrated.stderr
    assert "calibration.json (tiny-scale anchors at several seeds): no tracking store at" in calibrated.stdout
    assert "| llm_efficiency | calibration: baseline and reference at 5 seeds × √2 |" in calibrated.stdout
    bigger = compare_cli("--plan", "--effect", "20", cwd=tmp_path)
    assert "overall: " in bigger.stdout


@pytest.mark.integration
@ONE_STORE
def test_bad_input_against_a_store_is_one_line(store):
    cases = {
        "unknown agent, model or sweep id 'codex' in the runs (filters: none); there: agents baseline, claude, gpt4o; "
        f"models 4o-x, sonnet-x; sweeps {SWEEP_ID}": ["claude", "codex"],
        "no runs match (filters: task nope)": ["claude", "gpt4o", "--task", "nope"],
        f"'claude' and '{SWEEP_ID}' share 13 runs": ["claude", SWEEP_ID],
        f"{SWEEP_ID} has 2 counted runs of llm_merging with seed 1 (llm_merging/claude/smoke/1, "
        "llm_merging/gpt4o/smoke/1; they differ in agent claude, gpt4o; model 4o-x, sonnet-x): narrow the runs": [
            "baseline", SWEEP_ID,
        ],
    }  # fmt: skip
    for message, args in cases.items():
        result = compare_cli(*args, cwd=store)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and message in lines[0], (args, result.stderr)


@pytest.mark.integration
@ONE_STORE
def test_the_report_of_a_sweep_of_two_agents_compares_them_and_logs_it_on_the_parent_run(store, tmp_path):
    """python -m mlrb.report puts the same comparison in summary.md, report.html and, for one
    sweep, the parent run's description and artifacts."""
    from conftest import mlflow_client

    out = tmp_path / "report"
    result = run_module("mlrb.report", "--sweep", SWEEP_ID, "--html", "--no-plots", "--out", str(out), cwd=store,
                        timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = (out / "summary.md").read_text()
    assert "## Paired comparisons" in summary
    assert "Verdict: cannot tell claude from gpt4o (the interval contains 0): claude ahead on " in summary
    assert "`python -m mlrb.compare claude gpt4o` lists the runs left out" in summary
    assert "| overall (2 tasks) | 12 | 1 |" in summary
    assert "<h2>Paired comparisons</h2>" in (out / "report.html").read_text()
    client = mlflow_client(store)
    parent = next(r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])
                  if r.data.tags.get("mlrb.role") == "sweep" and r.data.tags["mlrb.sweep_id"] == SWEEP_ID)  # fmt: skip
    assert "## Paired comparisons" in parent.data.tags["mlflow.note.content"]
    assert "report/summary.md" in {a.path for a in client.list_artifacts(parent.info.run_id, "report")}


@pytest.mark.system  # counted normalised scores: the calibrated tiny scale's (mlrb.compare refuses plumbing runs)
def test_a_sweep_of_an_agent_that_submits_the_baseline_and_one_that_submits_nothing_is_told_apart(
    tmp_path, built_cache
):
    """End to end: real runs of two agents as one sweep at six seeds (the fewest pairs with which
    the sign-flip test can say p < 0.05), then `python -m mlrb.compare` on their store: the agent
    that hands in the baseline's merge beats the one that hands in nothing, its interval clear of 0."""
    from conftest import run_cli, store_args
    from fake_llm_server import FakeLlmServer, reply, tool

    seeds = "1,2,3,4,5,6"
    with FakeLlmServer([reply(tool("submit", summary="nothing"), usage=(500, 10))] * 6) as server:
        swept = run_cli("-m", "agent=baseline,claude", f"seed={seeds}", "hydra.launcher.slots=2",
                        *store_args(tmp_path, built_cache)[:2], cwd=tmp_path,
                        env={"ANTHROPIC_API_KEY": "sk-ant-compare", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert swept.returncode == 0, swept.stderr[-3000:]
    result = compare_cli("baseline", "claude", cwd=tmp_path)
    line = verdict(result)
    assert line.startswith("baseline beats claude: ahead on 1 of 1 tasks (significantly on 1); overall +"), line
    low, high = (float(x) for x in line.split("[", 1)[1].split("]", 1)[0].split(", "))
    assert 0 < low <= high and line.endswith("p = 0.03")  # 2 / 2**6: every sign pattern as far from 0
