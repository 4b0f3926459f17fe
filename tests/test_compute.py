"""Compute is a cost too: a run records the GPU-hours and CPU-hours its agent's sandbox held (the
hardware it was given, times the wall time from the sandbox's start to its close), their dollars at
the config's prices (compute.price_per_gpu_hour, compute.price_per_cpu_hour), and a budget may cap
its GPU-hours (budget.max_gpu_hours). The arithmetic and the config's checks on hand-made values;
one whole run on a GPU-sized sandbox requested on this CPU machine."""

from __future__ import annotations

import csv
import shutil

import pytest

from conftest import (
    HARNESS_EXPERIMENT,
    HARNESS_TASK,
    compose_config,
    empty_store,
    mlflow_client,
    run_cli,
    run_module,
    store_args,
)
from mlrb.core.budget import Budget
from mlrb.core.compute import HeldCompute
from mlrb.core.config import BudgetConfig
from mlrb.core.messages import ConfigError
from mlrb.harness.plan import identity
from mlrb.report import aggregate, costs, paired, render
from mlrb.report.runs import RunRow
from mlrb.run_files import resume
from mlrb.sandbox import gpus


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def held(gpus_: int = 2, cpus: float = 4, **prices) -> tuple[HeldCompute, Clock]:
    clock = Clock()
    return HeldCompute(gpus_, cpus, clock=clock, **prices), clock


@pytest.mark.fast
def test_hours_are_the_hardware_times_the_time_it_was_held_and_dollars_only_where_priced():
    compute, clock = held(2, 4)
    clock.now += 50  # before the sandbox starts nothing is held
    compute.start()
    clock.now += 1800
    assert compute.summary() == {"gpu_hours": 1.0, "cpu_hours": 2.0}  # no price: hours only
    compute.stop()
    clock.now += 3600  # after its close nothing is held
    assert (compute.gpu_hours(), compute.cpu_hours()) == (1.0, 2.0)

    priced, clock = held(2, 4, price_per_gpu_hour=2.5, price_per_cpu_hour=0.05)
    priced.start()
    clock.now += 1800
    assert priced.summary() == {"gpu_hours": 1.0, "cpu_hours": 2.0, "compute_usd": 2.6}  # 1 x 2.5 + 2 x 0.05
    gpu_only, clock = held(1, 8, price_per_gpu_hour=3.0)  # a price left null counts nothing
    gpu_only.start()
    clock.now += 3600
    assert gpu_only.summary() == {"gpu_hours": 1.0, "cpu_hours": 8.0, "compute_usd": 3.0}


@pytest.mark.fast
def test_a_gpu_hours_cap_stops_the_agent_on_wall_time_that_its_paused_clock_does_not_stop():
    compute, clock = held(2, 4)
    cfg = BudgetConfig(name="t", wall_time_s=3600, max_steps=10, max_gpu_hours=0.5)
    budget = Budget(cfg, clock=clock, compute=compute)
    compute.start()
    assert budget.remaining_s() == 900  # 0.5 GPU-hours on 2 GPUs: 15 minutes, before the hour's wall time
    assert "0.500 of 0.5 GPU-hours" in budget.note()
    with budget.paused():  # the agent's clock stands still, the GPUs are held all the same
        clock.now += 600
    assert budget.elapsed_s() == 0 and budget.remaining_s() == pytest.approx(300)
    assert budget.exhausted() is None and budget.spent() is None
    clock.now += 300
    assert (budget.exhausted(), budget.spent()) == ("gpu_hours", "gpu_hours")  # model calls refused too
    assert budget.summary()["gpu_hours"] == 0.5
    # no GPU held: the cap never comes (the wall time still does)
    cpu_only, clock = held(0, 4)
    budget = Budget(cfg, clock=clock, compute=cpu_only)
    cpu_only.start()
    clock.now += 3599
    assert budget.exhausted() is None and budget.remaining_s() == 1
    clock.now += 1
    assert budget.exhausted() == "wall_time"


@pytest.mark.fast
def test_a_resumed_run_goes_on_from_the_hours_its_earlier_attempts_held(tmp_path):
    cfg = BudgetConfig(name="t", wall_time_s=3600, max_steps=10, max_gpu_hours=1.0)
    compute, clock = held(2, 4)
    budget = Budget(cfg, clock=clock, compute=compute)
    compute.start()
    clock.now += 900
    resume.Keeper(tmp_path, 1, budget).save()  # as a kill finds it
    progress = resume.load(tmp_path)
    assert progress is not None and (progress.gpu_hours, progress.cpu_hours) == (0.5, 1.0)

    again, clock = held(2, 4, price_per_gpu_hour=2.0)
    budget = Budget(cfg, clock=clock, compute=again)
    budget.carry(
        {"agent_time_s": progress.agent_time_s, "gpu_hours": progress.gpu_hours, "cpu_hours": progress.cpu_hours}
    )
    again.start()
    assert budget.remaining_s() == 900  # half the cap is left
    clock.now += 450
    summary = budget.summary()
    assert (summary["gpu_hours"], summary["cpu_hours"], summary["compute_usd"]) == (0.75, 1.5, 1.5)


@pytest.mark.fast
def test_the_gpus_a_run_holds_are_those_it_was_given():
    assert gpus.given(["0", "1"], 1, {}) == 2  # sandbox.gpu_ids: every one it names is the run's
    assert gpus.given([0], 0, {}) == 1  # even where the task asks for none
    assert gpus.given(["-1"], 1, {}) == 0  # CUDA's "none"
    assert gpus.given(None, 2, {"CUDA_VISIBLE_DEVICES": "3"}) == 1  # the allocation has one of the task's two
    assert gpus.given(None, 1, {"CUDA_VISIBLE_DEVICES": "3,4"}) == 1  # the task's count of it
    assert gpus.given(None, 2, {}) == 2  # no allocation named: the node is the harness's
    assert gpus.given(None, 0, {"CUDA_VISIBLE_DEVICES": "0"}) == 0


@pytest.mark.fast
@pytest.mark.parametrize("override, message", [
    ("compute.price_per_gpu_hour=-1", "compute.price_per_gpu_hour must be a price in US dollars, 0 or more, got -1"),
    ("compute.price_per_cpu_hour=nan", "compute.price_per_cpu_hour must be a price in US dollars, 0 or more, got nan"),
    ("budget.max_gpu_hours=0", "budget.max_gpu_hours must be positive, got 0"),
])  # fmt: skip
def test_a_bad_price_or_cap_is_one_line_naming_its_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        compose_config(override)


@pytest.mark.fast
def test_prices_and_an_unset_cap_leave_the_run_s_key_as_it_was():
    plain = compose_config()
    assert (plain.compute.price_per_gpu_hour, plain.compute.price_per_cpu_hour, plain.budget.max_gpu_hours) == (
        None, None, None)  # fmt: skip
    assert "max_gpu_hours" not in identity(plain)["budget"]  # runs keyed before the cap existed go on
    priced = compose_config("compute.price_per_gpu_hour=2.5", "compute.price_per_cpu_hour=0")
    assert identity(priced) == identity(plain)  # a price does not change what the run does
    assert identity(compose_config("budget.max_gpu_hours=2"))["budget"]["max_gpu_hours"] == 2


def runs_of(agent: str, scores: list[float], api: float | None, compute: float | None) -> list[RunRow]:
    """An agent's runs of task a as the report reads them: each with its counted normalised score,
    its API dollars (cost_usd) and its compute's (compute_usd), None: not recorded."""
    metrics = {k: v for k, v in (("cost_usd", api), ("compute_usd", compute)) if v is not None}
    return [RunRow(run_id=f"{agent}{i}", name=f"a/{agent}/smoke/{i}", experiment="a", task="a", agent=agent,
                   budget="smoke", scale="tiny", seed=str(i), sweep_id="", mlflow_status="FINISHED", kind="ok",
                   detail="", valid=True, metrics={**metrics, "gpu_hours": 0.5, "counted_normalised_score": v},
                   sandbox="bwrap", confinement="confined")
            for i, v in enumerate(scores, 1)]  # fmt: skip


@pytest.mark.fast
def test_the_report_shows_api_compute_and_total_dollars_and_the_front_uses_the_chosen_one():
    baseline, claude, codex = (runs_of("baseline", [0.0, 2.0], None, 0.2), runs_of("claude", [40.0, 50.0], 1.0, 4.0),
                               runs_of("codex", [60.0, 60.0], 3.0, 0.5))  # fmt: skip
    stats = aggregate.summarise(baseline + claude + codex)
    results = render.results_table(stats)
    assert results.headers[results.headers.index("valid score") + 1 :][:3] == ["API $", "compute $", "total $"]
    at = results.headers.index("API $")
    by_agent = {r[results.headers.index("agent")]: r for r in results.rows}
    assert by_agent["claude"][at : at + 3] == ["$1.00", "$4.00", "$5.00"]
    assert by_agent["baseline"][at : at + 3] == ["-", "$0.20", "$0.20"]  # no API dollars: its compute's alone
    # the front: on API dollars claude is on it; on compute or total, codex is cheaper and better
    for cost, fronted in (("api", {"baseline", "claude", "codex"}), ("compute", {"baseline", "codex"}),
                          ("total", {"baseline", "codex"})):  # fmt: skip
        points, _ = costs.points_of(stats, cost)
        assert {p.label for p in points if p.on_front} == fronted, cost
    ((_, intro, table),) = costs.report_sections(stats, "total")
    assert "Mean dollars, model API and compute together per run" in intro and "drawn on the total $" in intro
    assert table.headers[2:7] == ["attempts", "API $ per run", "compute $ per run", "total $ per run",
                                  "counted normalised"]  # fmt: skip
    assert table.rows[1][3:6] == ["$1.00", "$4.00", "$5.00"]
    ((_, _, records),) = costs.csv_files(stats, "compute")
    assert {(r["label"], r["cost"], r["compute_usd_mean"], r["total_usd_mean"]) for r in records} == {
        ("baseline", "compute", 0.2, 0.2), ("claude", "compute", 4.0, 5.0), ("codex", "compute", 0.5, 3.5)}  # fmt: skip
    # compare: what each side cost, only where compute was priced
    table = paired.cost_table({"claude": claude, "codex": codex})
    assert table is not None and table.rows == [["claude", "2", "$1.00", "$4.00", "$5.00", "0.5"],
                                                ["codex", "2", "$3.00", "$0.50", "$3.50", "0.5"]]  # fmt: skip
    sections = paired.report_sections(claude + codex, resamples=200)  # the report's, beside its comparison
    assert [heading for heading, _, _ in sections] == ["Paired comparisons", "Cost per side"]
    assert sections[1][2] is not None and sections[1][2].rows == table.rows
    unpriced = runs_of("claude", [40.0], 1.0, None)
    assert paired.cost_table({"claude": unpriced}) is None
    assert "cost" in render.results_table(aggregate.summarise(unpriced)).headers  # as before: the API's alone


@pytest.mark.fast
def test_a_sweep_s_parent_run_has_the_hours_and_compute_dollars_of_all_its_runs():
    from mlrb.sweep_summary import parent_metrics

    metrics = parent_metrics(runs_of("claude", [40.0, 50.0], 1.0, 4.0) + runs_of("codex", [60.0], 3.0, 0.5))
    assert (metrics["cost_usd_total"], metrics["compute_usd_total"], metrics["gpu_hours_total"]) == (5.0, 8.5, 1.5)
    assert "compute_usd_total" not in parent_metrics(runs_of("claude", [40.0], 1.0, None))  # not priced


@pytest.mark.integration
def test_compare_shows_each_side_s_api_and_compute_dollars_from_a_real_store(tmp_path):
    """Two agents' runs as the harness records them (metrics cost_usd, compute_usd, gpu_hours),
    in a real SQLite store; `python -m mlrb.compare` and `python -m mlrb.report --cost total`."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    (tmp_path / "mlruns").mkdir()
    shutil.copyfile(empty_store(), tmp_path / "mlruns" / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    experiment = client.create_experiment("llm_merging")
    for agent, level, api, compute in (("claude", 40.0, 1.0, 4.0), ("codex", 60.0, 3.0, 0.5)):
        for seed in range(1, 7):
            tags = {"mlrb.task": "llm_merging", "mlrb.agent": agent, "mlrb.budget": "smoke", "mlrb.scale": "tiny",
                    "mlrb.seed": str(seed), "mlrb.sandbox": "bwrap", "mlrb.confined": "true", "mlrb.status": "ok",
                    "mlrb.valid": "True"}  # fmt: skip
            run = client.create_run(experiment, tags=tags, run_name=f"llm_merging/{agent}/smoke/{seed}").info.run_id
            metrics = {"score": level / 100, "normalised_score": level + seed, "counted_score": level / 100,
                       "counted_normalised_score": level + seed, "cost_usd": api, "compute_usd": compute,
                       "gpu_hours": 2.0, "cpu_hours": 16.0}  # fmt: skip
            client.log_batch(run, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
            client.set_terminated(run, "FINISHED")
    compared = run_module("mlrb.compare", "claude", "codex", cwd=tmp_path, timeout=300)
    assert compared.returncode == 0, compared.stderr
    assert (
        "| side | attempts | API $ per run | compute $ per run | total $ per run | GPU-hours per run |"
        in compared.stdout
    )
    assert "| claude | 6 | $1.00 | $4.00 | $5.00 | 2 |" in compared.stdout
    assert "| codex | 6 | $3.00 | $0.50 | $3.50 | 2 |" in compared.stdout
    assert compared.stdout.strip().splitlines()[-1].startswith("codex beats claude")  # the verdict stays last
    reported = run_module("mlrb.report", "--out", "out", "--cost", "total", "--no-plots", "--no-log", cwd=tmp_path,
                          timeout=300)  # fmt: skip
    assert reported.returncode == 0, reported.stderr
    assert "| API $ | compute $ | total $ |" in reported.stdout and "| $1.00 | $4.00 | $5.00 |" in reported.stdout
    with open(tmp_path / "out" / "cost_score.csv", newline="") as f:
        points = {r["label"]: r for r in csv.DictReader(f)}
    assert (points["claude"]["cost"], points["claude"]["total_usd_mean"], points["claude"]["pareto_front"]) == (
        "total", "5.0", "False")  # fmt: skip
    with open(tmp_path / "out" / "summary.csv", newline="") as f:
        (claude, _) = sorted(csv.DictReader(f), key=lambda r: r["agent"])
    assert (claude["compute_usd_mean"], claude["gpu_hours_mean"], claude["cpu_hours_mean"]) == ("4.0", "2.0", "16.0")


GPU_PRICE, CPU_PRICE, CAP_H = 2.5, 0.04, 0.002  # the cap: 7.2 s of one GPU


@pytest.mark.integration
def test_a_run_on_a_gpu_sized_sandbox_records_its_compute_and_its_gpu_hours_cap_stops_it(tmp_path, cache_dir):
    """A run given GPU 0 (sandbox.gpu_ids, its allocation CUDA_VISIBLE_DEVICES=0, on this machine
    with or without one) and 4 CPU cores, whose agent makes its submission and then works on: its
    GPU-hours cap stops it, its record has its hours and their dollars."""
    result = run_cli(
        *store_args(tmp_path, cache_dir), *HARNESS_TASK, "agent=command",
        "agent.options.command='python train.py > /dev/null && sleep 120'",
        "task.scales.folder.hardware.gpus=1", "sandbox.gpu_ids=[0]", "sandbox.cpus=4",
        f"budget.max_gpu_hours={CAP_H}", f"compute.price_per_gpu_hour={GPU_PRICE}",
        f"compute.price_per_cpu_hour={CPU_PRICE}",
        cwd=tmp_path, env={"ANTHROPIC_API_KEY": "sk-ant-compute-unused", "CUDA_VISIBLE_DEVICES": "0"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    tags, metrics = run.data.tags, run.data.metrics
    assert (tags["mlrb.status"], tags["mlrb.stop_reason"]) == ("budget_exhausted", "gpu_hours")
    assert tags["mlrb.valid"] == "True"  # what it handed in before is scored
    gpu_hours, cpu_hours = metrics["gpu_hours"], metrics["cpu_hours"]
    # held from the sandbox's start to its close: the cap, and the moments to stop and close it
    assert CAP_H <= gpu_hours < CAP_H + 15 / 3600
    assert gpu_hours * 3600 <= metrics["stage_time_s.sandbox_start"] + metrics["stage_time_s.agent"] + 0.01
    assert gpu_hours * 3600 >= metrics["agent_time_s"]
    assert cpu_hours == pytest.approx(4 * gpu_hours, abs=3e-6)  # each rounded to 6 decimals
    assert metrics["compute_usd"] == pytest.approx(gpu_hours * GPU_PRICE + cpu_hours * CPU_PRICE, abs=1e-5)
    assert metrics["cost_usd"] == 0.0  # the API's dollars, apart
    # the report shows them: the API's dollars, the compute's and their sum
    reported = run_module("mlrb.report", "--out", "out", "--no-plots", "--no-log", cwd=tmp_path, timeout=300)
    assert reported.returncode == 0, reported.stderr
    assert "| API $ | compute $ | total $ |" in reported.stdout
    shown = render.dollars(metrics["compute_usd"])
    assert f"| $0.00 | {shown} | {shown} |" in reported.stdout
    with open(tmp_path / "out" / "runs.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert float(row["gpu_hours"]) == gpu_hours and float(row["compute_usd"]) == metrics["compute_usd"]


@pytest.mark.integration
def test_a_resumed_run_adds_the_hours_of_each_attempt(tmp_path, cache_dir):
    """A run given GPU 0 and 2 cores, killed (SIGKILL) while its agent works and run again: its
    hours are the first attempt's, as its saved progress had them, and the second's."""
    import json
    import subprocess

    from test_resume import command_args, killed_mid_agent

    given = ("sandbox.gpu_ids=[0]", "task.scales.folder.hardware.gpus=1", "sandbox.cpus=2")
    folder = killed_mid_agent(tmp_path, cache_dir, *given)
    first = json.loads((folder / resume.PROGRESS).read_text())
    assert first["gpu_hours"] * 3600 >= resume.HEARTBEAT_S and first["cpu_hours"] == pytest.approx(
        2 * first["gpu_hours"], abs=1e-9)  # fmt: skip
    again = subprocess.run(command_args(tmp_path, cache_dir, *given), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    client = mlflow_client(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    metrics = run.data.metrics
    assert run.data.tags["mlrb.attempt"] == "2" and run.data.tags["mlrb.status"] == "ok"
    assert metrics["gpu_hours"] > first["gpu_hours"]  # the first attempt's, and the second's on top
    assert metrics["gpu_hours"] - first["gpu_hours"] <= metrics["stage_time_s.sandbox_start"] / 3600 + metrics[
        "stage_time_s.agent"] / 3600 + 1e-5  # fmt: skip
    assert metrics["cpu_hours"] == pytest.approx(2 * metrics["gpu_hours"], abs=3e-6)
    assert "compute_usd" not in metrics  # no price: hours only
    events = [json.loads(line) for line in (folder / "trajectory.jsonl").read_text().splitlines()]
    (resumed,) = [e for e in events if e["event"] == "resume"]
    # what the attempts before held, and the moments of this one's sandbox before the line was written
    assert first["gpu_hours"] <= resumed["spent"]["gpu_hours"] < first["gpu_hours"] + 30 / 3600
