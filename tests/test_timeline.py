"""Where a run's time goes (mlrb/core/timeline.py): each stage's seconds are its own, so the
`stage_time_s.<stage>` metrics add up to the run's time and none counts another's."""

from __future__ import annotations

import time

import pytest

from mlrb.core.timeline import StageClock

pytestmark = pytest.mark.fast


def test_a_stage_timed_inside_another_counts_once_as_its_own():
    clock = StageClock()
    started = time.monotonic()
    with clock.stage("collect"):
        time.sleep(0.05)
        with clock.stage("recording"):
            time.sleep(0.1)
        with clock.stage("recording"):  # again: it adds up
            time.sleep(0.1)
    with clock.stage("recording"):
        time.sleep(0.05)
    total = time.monotonic() - started
    assert 0.05 <= clock.times["collect"] < 0.1  # its own 0.05 s, not the 0.2 s it waited on the record
    assert 0.25 <= clock.times["recording"] < 0.3
    assert sum(clock.times.values()) == pytest.approx(total, abs=0.01)
    assert clock.metrics() == {"stage_time_s.collect": round(clock.times["collect"], 4),
                               "stage_time_s.recording": round(clock.times["recording"], 4)}  # fmt: skip


def test_a_stage_that_raises_is_still_timed_and_its_outer_stage_goes_on_counting():
    clock = StageClock()
    with clock.stage("agent"):
        with pytest.raises(RuntimeError), clock.stage("scoring"):
            time.sleep(0.05)
            raise RuntimeError("the scorer died")
        time.sleep(0.05)
    assert clock.times["scoring"] >= 0.05 and 0.05 <= clock.times["agent"] < 0.09
