"""Compute is a cost too: a run records the GPU-hours and CPU-hours its agent's sandbox held (the
hardware it was given, times the wall time from the sandbox's start to its close), their dollars at
the config's prices (compute.price_per_gpu_hour, compute.price_per_cpu_hour), and a budget may cap
its GPU-hours (budget.max_gpu_hours). The arithmetic and the config's checks on hand-made values;
one whole run on a GPU-sized sandbox requested on this CPU machine."""

from __future__ import annotations

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, compose_config, mlflow_client, run_cli, store_args
from mlrb.core.budget import Budget
from mlrb.core.compute import HeldCompute
from mlrb.core.config import BudgetConfig
from mlrb.core.messages import ConfigError
from mlrb.harness import resume
from mlrb.harness.plan import identity
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
    budget.carry(0, 0, 0, 0.0, progress.agent_time_s, gpu_hours=progress.gpu_hours, cpu_hours=progress.cpu_hours)
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
    assert cpu_hours == pytest.approx(4 * gpu_hours, abs=2e-6)
    assert metrics["compute_usd"] == pytest.approx(gpu_hours * GPU_PRICE + cpu_hours * CPU_PRICE, abs=1e-5)
    assert metrics["cost_usd"] == 0.0  # the API's dollars, apart
