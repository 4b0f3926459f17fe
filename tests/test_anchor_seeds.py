"""The normalised scale's anchors are means over seeds (issue 34): the asset build runs each
anchor command at seeds 0..anchor_seeds-1 and keeps each seed's score with their SD and SEM;
runs record the SEMs and the report carries them into its intervals. On every tiny task
the baseline and the reference, run at a seed the build did not use, land on 0 and 100
within 3 combined standard errors."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from build_ahead import SEEDED, unseen_seed_scores
from conftest import REPO, task_from_config
from mlrb.analysis import stats
from mlrb.analysis.counting import normalise
from mlrb.core.config import ConfigError, TaskConfig
from mlrb.report.aggregate import anchor_sem
from mlrb.report.runs import RunRow
from mlrb.tasks import anchors as anchors_module
from mlrb.tasks.anchors import Anchors, record_key, seed_statistics
from mlrb.tasks.base import ScoreReport, Task, packaged_task, scale_spec
from mlrb.tasks.handling import asset_key, build_assets, solutions_of


def build_public(out_dir, params):
    (out_dir / "public").mkdir(parents=True, exist_ok=True)
    return {}


def score_answer(submission, assets, work_dir):
    return ScoreReport(valid=True, reason="ok", score=float((submission / "answer.txt").read_text()))


def seeded(cfg: TaskConfig, starter, score=score_answer, download=None) -> Task:
    """Its baseline answers its seed: the score is the seed, so the spread is known. Its starter
    files are `starter` (an empty folder: the workspace it starts from)."""
    made = packaged_task(cfg, scale_spec(cfg), None, module=__name__, score=score, build=build_public,
                         download=download)  # fmt: skip
    return dataclasses.replace(made, package_dir=starter.parent, start=dataclasses.replace(made.start, starter=starter))


def seed_task(tmp_path, scale: dict | None = None, score=score_answer, **assets) -> Task:
    raw = yaml.safe_load("""
        name: seeded
        title: Seeded
        scales:
          tiny:
            description: answers its seed
            time_limit_s: 60
            baseline_command: mkdir -p submission && echo "$MLRB_SEED" > submission/answer.txt
            reference_command: mkdir -p submission && echo "$((MLRB_SEED + 10))" > submission/answer.txt
            prompt: {task: t, dataset: d, dataset_shape: s, models: m, result: r, evaluation: e}
    """)
    raw["scales"]["tiny"]["assets"] = assets
    raw["scales"]["tiny"].update(scale or {})
    (tmp_path / "starter").mkdir(exist_ok=True)
    return seeded(TaskConfig(**raw), tmp_path / "starter", score)


@pytest.mark.fast
def test_the_anchors_are_means_over_the_seeds_with_their_spread(tmp_path):
    task = seed_task(tmp_path, anchor_seeds=4)
    facts = build_assets(task, tmp_path / "assets")
    stored = json.loads((tmp_path / "assets" / "hidden" / "calibration.json").read_text())
    assert facts["calibration"] == stored
    assert stored["anchor_seeds"] == 4
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0, 3.0] and stored["baseline_score"] == 1.5
    assert stored["reference_seeds"] == [10.0, 11.0, 12.0, 13.0] and stored["reference_score"] == 11.5
    sd = math.sqrt((1.5**2 + 0.5**2 + 0.5**2 + 1.5**2) / 3)  # the sample SD of 0, 1, 2, 3
    assert stored["baseline_sd"] == pytest.approx(sd) and stored["baseline_sem"] == pytest.approx(sd / 2)
    anchors = task.anchors.read(tmp_path / "assets")
    assert anchors["baseline_score"] == 1.5 and anchors["baseline_sem"] == pytest.approx(sd / 2)
    assert anchors["reference_sem"] == pytest.approx(sd / 2)


@pytest.mark.fast
def test_three_seeds_by_default_and_a_stated_anchor_has_no_sem(tmp_path):
    task = seed_task(tmp_path, scale={"reference_score": 20.0})  # stated, as a paper's figure would be: not measured
    build_assets(task, tmp_path / "assets")
    stored = json.loads((tmp_path / "assets" / "hidden" / "calibration.json").read_text())
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0] and "reference_seeds" not in stored
    anchors = task.anchors.read(tmp_path / "assets")
    assert anchors["reference_score"] == 20.0 and "reference_sem" not in anchors
    assert anchors["baseline_sem"] == pytest.approx(1 / math.sqrt(3))
    # A different number of seeds is other assets: the cache key says so.
    assert asset_key(seed_task(tmp_path)) != asset_key(seed_task(tmp_path, anchor_seeds=5))


@pytest.mark.fast
@pytest.mark.parametrize("bad", [0, -2, 1.5, "three", True])
def test_a_bad_number_of_anchor_seeds_is_one_clear_error(bad, tmp_path):
    task = seed_task(tmp_path, anchor_seeds=bad)
    with pytest.raises(ConfigError, match=r"task\.scales\.tiny\.assets\.anchor_seeds must be a whole number"):
        task.builder.check_params("tiny")


@pytest.mark.fast
def test_the_anchors_part_measures_alike_one_at_a_time_and_side_by_side(tmp_path):
    # The part packaged tasks (side by side, one run per core) and task folders (one at a time)
    # share: the same runs give the same calibration either way.
    task = seed_task(tmp_path)
    measured = {}
    for workers in (None, 1):  # None: one run per core; 1: one at a time, as a task folder measures
        assets = tmp_path / f"workers-{workers}"
        task.builder.make(assets)
        measured[workers] = measure(dataclasses.replace(task.anchors, workers=workers), task, assets)
    assert measured[None] == measured[1] and measured[1]["baseline_seeds"] == [0.0, 1.0, 2.0]
    assert json.loads((assets / "hidden" / "calibration.json").read_text()) == measured[1]


@pytest.mark.fast
def test_a_stated_anchor_is_measured_only_where_the_part_must_measure_it(tmp_path):
    task = seed_task(tmp_path, scale={"baseline_score": 0.5})
    assert set(task.anchors.to_measure()) == {"reference"}  # a packaged task trusts the stated figure
    folder_like = dataclasses.replace(task.anchors, always_measured=("baseline",))
    assert set(folder_like.to_measure()) == {"baseline", "reference"}  # a folder runs its baseline all the same
    task.builder.make(tmp_path / "assets")
    assert measure(folder_like, task, tmp_path / "assets")["baseline_seeds"] == [0.0, 1.0, 2.0]
    assert folder_like.read(tmp_path / "assets")["baseline_score"] == 0.5  # ... and the stated figure still wins


def measure(anchors: Anchors, task: Task, assets) -> dict:
    return anchors.measure(
        assets,
        run=solutions_of(task, assets / "public").run,
        score=lambda submission, work_dir: task.judge.score(submission, assets, work_dir),
    )


@pytest.mark.fast
def test_a_submission_already_scored_is_not_scored_again(tmp_path):
    # do_nothing copies a fixed answer whatever the seed: its three submissions hold the same
    # bytes, so one score stands for all three; the seeded baseline and reference are each scored.
    scored = []
    task = seed_task(tmp_path, scale={"do_nothing_command": "mkdir -p submission && echo 7 > submission/answer.txt"},
                     score=lambda submission, assets, work_dir: scored.append(submission)
                     or score_answer(submission, assets, work_dir))  # fmt: skip
    build_assets(task, tmp_path / "assets")
    stored = json.loads((tmp_path / "assets" / "hidden" / "calibration.json").read_text())
    assert stored["do_nothing_seeds"] == [7.0, 7.0, 7.0] and stored["do_nothing_sd"] == 0.0
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0] and stored["reference_seeds"] == [10.0, 11.0, 12.0]
    assert len(scored) == 7  # 3 baseline, 3 reference, 1 do_nothing


def ship(path, task: Task, calibration: dict, elsewhere: dict | None = None) -> None:
    """Write `calibration` as the one mlrb ships for task's assets (benchmarks/calibration.py's shape),
    and `elsewhere` as another CPU's ("Other CPU")."""

    def measurement(calibration: dict, cpu: str) -> dict:
        measured = {"commit": "abc1234", "date": "2026-12-02 20:00 UTC", "machine": {"cpu": cpu}}
        return {"built": {"key": record_key(asset_key(task)), "calibration": calibration}, "measured": measured}

    entry = measurement(calibration, "Some CPU")
    if elsewhere is not None:
        entry["other_machines"] = [{**measurement(elsewhere, "Other CPU"), "avx512": False}]
    path.write_text(json.dumps({task.name: entry}))


@dataclasses.dataclass
class Shipping:
    task: Task  # a seeded task whose scorer (`score`) notes each score it takes in `scored`
    five: Task  # the same, measured at 5 seeds, as benchmarks/calibration.py builds and ships it
    calibration: dict[str, Any]  # what that build measured
    path: Path  # stands for the file mlrb ships, empty until `ship` writes it
    scored: list[float]
    score: Callable[..., ScoreReport]


def shipping(tmp_path, monkeypatch) -> Shipping:
    scored: list[float] = []

    def counting(submission, assets, work_dir):
        scored.append(float((submission / "answer.txt").read_text()))
        return score_answer(submission, assets, work_dir)

    task = seed_task(tmp_path, score=counting)
    five = dataclasses.replace(task, anchors=dataclasses.replace(task.anchors, seeds=5, use_shipped=False))
    calibration = build_assets(five, tmp_path / "five")["calibration"]
    monkeypatch.setattr(anchors_module, "SHIPPED", tmp_path / "shipped.json")
    return Shipping(task, five, calibration, tmp_path / "shipped.json", scored, counting)


@pytest.mark.fast
def test_a_build_takes_the_shipped_calibration_of_its_assets_once_its_seed_0_scores_as_shipped(
    tmp_path, monkeypatch, caplog
):
    setup = shipping(tmp_path, monkeypatch)
    task, five, calibration, shipped, scored = setup.task, setup.five, setup.calibration, setup.path, setup.scored
    ship(shipped, task, calibration)

    scored.clear()
    build_assets(task, tmp_path / "assets")
    assert sorted(scored) == [0.0, 10.0]  # seed 0 of the baseline and of the reference, nothing more
    stored = json.loads((tmp_path / "assets" / "hidden" / "calibration.json").read_text())
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0, 3.0, 4.0] and stored["anchor_seeds"] == 5
    assert stored["shipped"] == {"commit": "abc1234", "date": "2026-12-02 20:00 UTC", "cpu": "Some CPU",
                                 "checked": "seed 0 of each anchor, here, scored as shipped"}  # fmt: skip
    assert task.anchors.read(tmp_path / "assets")["baseline_sem"] == pytest.approx(stats.sd([0, 1, 2, 3, 4]) / 5**0.5)
    # Taking it makes other assets than measuring would: the cache key says so.
    assert asset_key(task)["shipped"] and "shipped" not in asset_key(five)

    # Assets built with another parameter are other assets: measured, every seed.
    scored.clear()
    build_assets(seed_task(tmp_path, score=setup.score, size=3), tmp_path / "other")
    assert sorted(scored) == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]

    # A shipped seed 0 that this machine does not reproduce: the other seeds are run too, with a warning.
    ship(shipped, task, {**calibration, "baseline_seeds": [0.5, 1.0, 2.0, 3.0, 4.0]})
    scored.clear()
    with caplog.at_level(logging.WARNING, logger="mlrb.tasks.anchors"):
        build_assets(task, tmp_path / "elsewhere")
    assert sorted(scored) == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    stored = json.loads((tmp_path / "elsewhere" / "hidden" / "calibration.json").read_text())
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0] and stored["anchor_seeds"] == 3 and "shipped" not in stored
    assert "seeded: the calibration mlrb ships does not hold on this machine (seed 0 of baseline" in caplog.text


@pytest.mark.fast
def test_a_build_on_another_kind_of_machine_takes_the_calibration_shipped_from_such_a_machine(tmp_path, monkeypatch):
    """Where the main machine's seed 0 does not hold (another CPU's kernels), a build takes the record
    measured on another machine whose seed 0 it reproduces, and says which it took."""
    setup = shipping(tmp_path, monkeypatch)
    task, here, shipped, scored = setup.task, setup.calibration, setup.path, setup.scored
    main_machine = {**here, "baseline_seeds": [0.25, 1.0, 2.0, 3.0, 4.0]}  # its kernels scored seed 0 otherwise
    ship(shipped, task, main_machine)
    alone = asset_key(task)["shipped"]
    ship(shipped, task, main_machine, elsewhere=here)
    assert asset_key(task)["shipped"] != alone  # another machine's record makes other assets here: a new key

    scored.clear()
    build_assets(task, tmp_path / "assets")
    assert sorted(scored) == [0.0, 10.0]  # seed 0 of each, and the other machine's record holds
    stored = json.loads((tmp_path / "assets" / "hidden" / "calibration.json").read_text())
    assert stored["baseline_seeds"] == [0.0, 1.0, 2.0, 3.0, 4.0] and stored["shipped"]["cpu"] == "Other CPU"

    # Where neither holds, every seed is measured, as without any.
    ship(shipped, task, main_machine, elsewhere={**here, "reference_seeds": [10.5, 11.0, 12.0, 13.0, 14.0]})
    scored.clear()
    build_assets(task, tmp_path / "neither")
    assert sorted(scored) == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    assert "shipped" not in json.loads((tmp_path / "neither" / "hidden" / "calibration.json").read_text())


@pytest.mark.fast
def test_one_seed_has_no_spread():
    assert seed_statistics("baseline", [0.25]) == {
        "baseline_score": 0.25, "baseline_sd": None, "baseline_sem": None, "baseline_seeds": [0.25],
    }  # fmt: skip


def row(score: float, **metrics: float) -> RunRow:
    base = {"score": score, "counted_score": score, "baseline_score": 0.5, "reference_score": 0.9}
    return RunRow(run_id="r", name="t/a/b/0", experiment="t", task="t", agent="a", budget="b", scale="tiny",
                  seed="0", sweep_id="", mlflow_status="FINISHED", kind="ok", detail="", valid=True,
                  metrics={**base, **metrics})  # fmt: skip


@pytest.mark.fast
def test_the_reports_interval_carries_the_anchors_sem():
    # Normalised 100 (x - b) / (r - b) at x = 0.7, b = 0.5, r = 0.9: moving b by its SEM (0.01)
    # moves it by 100 * (0.7 - 0.9) / 0.4**2 * 0.01 = -1.25; r by 0.02: -100 * 0.2 / 0.16 * 0.02 = -2.5.
    rows = [row(0.7, baseline_score_sem=0.01, reference_score_sem=0.02)]
    assert anchor_sem(0.7, 0.5, 0.9, rows) == pytest.approx(math.hypot(1.25, 2.5))
    # Checked against the normalisation itself, by finite differences.
    h = 1e-6
    d_b = (normalise(0.7, 0.5 + h, 0.9) - normalise(0.7, 0.5 - h, 0.9)) / (2 * h)
    d_r = (normalise(0.7, 0.5, 0.9 + h) - normalise(0.7, 0.5, 0.9 - h)) / (2 * h)
    assert anchor_sem(0.7, 0.5, 0.9, rows) == pytest.approx(math.hypot(d_b * 0.01, d_r * 0.02), rel=1e-4)
    assert anchor_sem(0.7, 0.5, 0.9, [row(0.7)]) is None  # runs recorded before anchors had an SEM


@pytest.mark.system
@pytest.mark.parametrize("key", SEEDED)
def test_the_baseline_and_the_reference_at_an_unseen_seed_normalise_to_0_and_100(key, cache_dir, tmp_path):
    """Within the 99.7% prediction interval of the anchor's seeds: combined standard errors (the
    run's own seed noise, the anchor's per-run SD, and the anchors' SEMs, to first order through
    the normalisation) times Student's t for the SD's degrees of freedom (`unseen_seed_bar`). The
    per-run SD is one measured over 5 seeds: that of the shipped calibration the build took (measured
    on a machine whose seed 0 this one reproduces), else benchmarks/calibration.json's where it has
    the task. An SD from the build's 3 seeds is itself uncertain by about half (math_reasoning's
    baseline: 1.00 BLEU over seeds 0-2, 1.80 over 0-4), too little to bound a fourth seed by."""
    from mlrb.harness.assets import ensure_assets

    task = task_from_config(key)
    assets = ensure_assets(task, cache_dir)
    c = json.loads((assets / "hidden" / "calibration.json").read_text())
    seed = c["anchor_seeds"]  # the first seed the build did not run
    b, r = c["baseline_score"], c["reference_score"]
    measured = json.loads((REPO / "benchmarks" / "calibration.json").read_text()).get(key, {}).get("anchors", {})
    scores = unseen_seed_scores(task, assets, tmp_path)  # kept beside the assets (tests/build_ahead.py)
    for anchor, target in (("baseline", 0.0), ("reference", 100.0)):
        x = scores[anchor]
        normalised = normalise(x, b, r, task.higher_is_better)
        if "shipped" in c:  # the build took a shipped calibration: its own SD, over its seeds
            sd, seeds = c[f"{anchor}_sd"], len(c[f"{anchor}_seeds"])
        else:
            sd = measured.get(anchor, {}).get("sd") or c[f"{anchor}_sd"]
            seeds = measured.get(anchor, {}).get("n") or len(c[f"{anchor}_seeds"])  # what the SD was measured over
        combined = math.hypot(
            100 / (r - b) * (sd or 0.0),  # the run's own noise
            100 * (x - r) / (r - b) ** 2 * (c["baseline_sem"] or 0.0),
            -100 * (x - b) / (r - b) ** 2 * (c["reference_sem"] or 0.0),
        )
        bar = unseen_seed_bar(seeds)
        assert abs(normalised - target) <= bar * combined + 1e-6, (
            f"{key} {anchor} at seed {seed}: {x:.4g} normalises to {normalised:.1f}, "
            f"not {target:.0f} within {bar:.2f} x {combined:.2f}; seeds {c[f'{anchor}_seeds']}"
        )


def unseen_seed_bar(seeds: int) -> float:
    """How many combined standard errors a new seed may lie from the anchor: Student's t at 99.85%
    for an SD measured over SEEDS (n - 1 degrees of freedom), the two-sided 99.7% that 3 is for a
    known SD. With the SD from 5 seeds, 3 would refuse an honest new seed one time in 25 (t with 4
    degrees of freedom), and one of the twelve anchors checked in two suite runs of five. An anchor
    whose seeds all score alike (one measured) has no SD to widen: 3."""
    return stats.t_quantile(0.9985, seeds - 1) if seeds > 1 else 3.0


@pytest.mark.fast
def test_the_unseen_seed_bar_is_a_t_prediction_bound_that_narrows_to_3_with_more_seeds():
    assert unseen_seed_bar(5) == pytest.approx(6.43, abs=0.01)
    assert unseen_seed_bar(10) == pytest.approx(4.02, abs=0.01)
    assert 2.96 < unseen_seed_bar(1000) < 3.0  # a known SD's 99.7%: 2.97
    # still a check: an anchor 10 combined errors off, which a broken calibration gives, fails at 5 seeds
    assert unseen_seed_bar(5) < 10
    assert unseen_seed_bar(1) == 3.0  # an anchor that scores alike at every seed: its SD is 0 whatever the bar
