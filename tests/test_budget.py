from __future__ import annotations

import pytest

from mlrb.budget import Budget
from mlrb.config import BudgetConfig

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
