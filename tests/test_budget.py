from __future__ import annotations

import pytest

from mlrb.core.budget import Budget, Spend
from mlrb.core.config import BudgetConfig

pytestmark = pytest.mark.fast


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make(**overrides):
    cfg = BudgetConfig(name="t", wall_time_s=60, max_steps=3, max_input_tokens=1000, max_output_tokens=100, max_usd=1.0)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    clock = FakeClock()
    return Budget(cfg, clock=clock), clock


def test_each_limit_is_named_when_reached():
    budget, clock = make()
    assert budget.exhausted() is None
    clock.now += 61
    assert budget.exhausted() == "wall_time"

    budget, _ = make()
    for _ in range(3):
        budget.record_step()
    assert budget.exhausted() == "steps"

    budget, _ = make()
    budget.record_usage(input_tokens=1000, output_tokens=0, usd=0)
    assert budget.exhausted() == "input_tokens"

    budget, _ = make()
    budget.record_usage(input_tokens=0, output_tokens=100, usd=0)
    assert budget.exhausted() == "output_tokens"

    budget, _ = make()
    budget.record_usage(input_tokens=10, output_tokens=10, usd=1.25)
    assert budget.exhausted() == "usd"
    assert budget.summary()["cost_usd"] == 1.25


def test_no_cap_when_a_limit_is_none():
    budget, _ = make(max_usd=None, max_input_tokens=None)
    budget.record_usage(input_tokens=10**9, output_tokens=0, usd=10**6)
    assert budget.exhausted() is None
    budget, clock = make()
    clock.now += 20
    assert budget.remaining_s() == 40


def test_a_call_is_admitted_while_what_is_spent_and_held_is_under_every_limit():
    """The metering proxy holds each call's estimate while it is in flight (reserve), then
    charges what it used (settle). One call at a time goes on as long as spent() allows,
    whatever it holds; a second call at once finds the first one's hold."""
    budget, _ = make(max_usd=1.0, max_input_tokens=None, max_output_tokens=None)
    budget.record_usage(0, 0, 0.9)
    big = Spend(input_tokens=1000, output_tokens=4096, usd=0.5)
    assert budget.spent() is None and budget.reserve(big) is None  # near the end, alone: admitted
    assert budget.reserve(Spend(10, 10, 0.01)) == "usd"  # the first one's hold leaves no room
    assert budget.spent() is None and budget.exhausted() is None  # holds are not spending
    budget.settle(big, Spend(800, 100, 0.05))
    assert (budget.usd, budget.input_tokens, budget.output_tokens) == (pytest.approx(0.95), 800, 100)
    assert budget.held == Spend() and budget.in_flight == 0
    assert budget.reserve(Spend(10, 10, 0.01)) is None  # its hold released: room again


def test_token_limits_count_holds_too_and_wall_time_refuses_every_call():
    budget, clock = make(max_usd=None, max_input_tokens=1000, max_output_tokens=100)
    assert budget.reserve(Spend(600, 50, 0.0)) is None
    assert budget.reserve(Spend(600, 10, 0.0)) is None  # 600 held: still under 1000
    assert budget.reserve(Spend(1, 1, 0.0)) == "input_tokens"  # 1200 held
    budget.settle(Spend(600, 50, 0.0), Spend(0, 0, 0.0))
    budget.settle(Spend(600, 10, 0.0), Spend(0, 0, 0.0))
    assert budget.held == Spend() and budget.reserve(Spend(0, 100, 0.0)) is None
    assert budget.reserve(Spend(0, 1, 0.0)) == "output_tokens"
    clock.now += 61
    assert budget.reserve(Spend()) == "wall_time"


def test_pauses_that_overlap_stop_the_clock_once():
    """The harness's own waits (the proxy's threads recording calls, the main thread scoring a step)
    may overlap: the agent's clock stands still from the first one's start to the last one's end,
    and is not taken back twice for the overlap."""
    budget, clock = make()
    clock.now += 10
    first, second = budget.paused(), budget.paused()
    first.__enter__()
    clock.now += 5
    second.__enter__()
    assert budget.elapsed_s() == 10  # standing still
    clock.now += 5
    first.__exit__(None, None, None)
    assert budget.elapsed_s() == 10  # still, while the second one waits
    clock.now += 10
    second.__exit__(None, None, None)
    assert budget.elapsed_s() == 10 and budget.remaining_s() == 50
    clock.now += 5
    assert budget.elapsed_s() == 15
