"""benchmarks/RESULTS.md's tables of tiny-scale anchors are the ones the benchmark prints for
benchmarks/calibration.json (seeds of the anchors' runs) and benchmarks/calibration_assets.json
(seeds of the assets), and the benchmark's checks compute what issue 16 asks of a task."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    return importlib.import_module(f"benchmarks.{name}")


def benchmark():
    return load("calibration")


def test_the_results_page_tables_are_the_committed_calibration_outputs():
    page = load("results").render(REPO / "benchmarks")  # RESULTS.md is this (tests/test_results_page.py)
    spread = json.loads((REPO / "benchmarks" / "machine_spread.json").read_text())["tasks"]
    machines = {key: task["spread"] for key, task in spread.items()}
    for name, vary, seen in (("calibration.json", "runs", machines), ("calibration_assets.json", "assets", None)):
        results = json.loads((REPO / "benchmarks" / name).read_text())
        assert {r["vary"] for r in results.values()} == {vary}, name
        section = page.split(f"Output: `benchmarks/{name}`.", 1)[1]
        assert section.split("\n\n", 2)[1] == benchmark().table(results, seen), name  # the table after its provenance


def test_an_anchor_every_run_scores_alike_shows_its_spread_over_kernel_paths_not_a_sem_of_0():
    module = benchmark()
    alike = {"mean": 0.5625, "sem": 0.0, "n": 1, "values": [0.5625], "deterministic": True}
    assert module.fmt(alike, [0.55, 0.5625, 0.5833]) == (
        "0.5625 (every run alike here; over 3 kernel paths 0.5500-0.5833, SD 0.0168)"
    )
    assert module.fmt(alike, [0.5625] * 3) == "0.5625 (every run alike here; the same on 3 kernel paths)"
    assert "± 0" not in module.fmt(alike) and "not measured" in module.fmt(alike)
    seeded = module.mean_sem([0.70, 0.72, 0.74])
    assert module.fmt({**seeded, "values": [0.70, 0.72, 0.74]}) == "0.7200 ± 0.0115 (SD 0.0200)"
    # The baseline's noise in normalised points: the paths' SD over the anchors' gap (0.0168 / 0.4375).
    result = {"anchors": {"baseline": alike, "reference": {"mean": 1.0, "n": 1, "deterministic": True}},
              "checks": {"baseline_sem_normalised_points": 0.0}}  # fmt: skip
    assert (
        module.baseline_noise(result, {"baseline": {"values": [0.55, 0.5625, 0.5833]}}) == "3.8 (SD over kernel paths)"
    )
    assert module.baseline_noise(result, {}) == "- (one kernel path)"


def test_the_calibration_that_ships_with_mlrb_is_the_benchmark_s():
    """`python -m mlrb.compare --plan` without runs reads the file inside the package, which
    benchmarks/calibration.json links to (the benchmark writes it there); each task there records
    its code's digests."""
    from mlrb.compare import CALIBRATION

    assert CALIBRATION == REPO / "mlrb" / "data" / "calibration.json"
    assert CALIBRATION.read_text() == (REPO / "benchmarks" / "calibration.json").read_text()
    shipped = json.loads(CALIBRATION.read_text())
    for key in ("llm_merging", "llm_efficiency"):  # re-measured with the script, with their sources
        measured = shipped[key]["measured"]
        assert measured["commit"] and measured["machine"]["cpu"] and measured["command"], key
        # measured on this code, or checked on it since (--carry: seed 0 of each anchor scores as measured)
        latest = shipped[key].get("carried", measured)
        assert set(latest["sources"]) == set(benchmark().task_sources(key)), key


def anchors(do_nothing, baseline, reference):
    module = benchmark()
    return {name: module.mean_sem(values) for name, values in
            (("do_nothing", do_nothing), ("baseline", baseline), ("reference", reference))}  # fmt: skip


def test_checks_pass_a_well_separated_task_and_fail_a_noisy_one():
    module = benchmark()
    good = module.checks(anchors([0.25, 0.26, 0.24], [0.50, 0.51, 0.49], [0.90, 0.91, 0.89]), items=400, score_unit=1)
    assert good["do_nothing_below_baseline"] is True and good["reference_beats_baseline"] is True
    assert good["item_worth_normalised_points"] == 100 / 400 / 0.4  # 0.625 points
    assert good["item_worth_at_most_2"] and good["baseline_sem_at_most_5"]

    noisy = module.checks(anchors([0.55, 0.60, 0.50], [0.56, 0.62, 0.50], [0.60, 0.58, 0.62]), items=100, score_unit=1)
    assert noisy["do_nothing_below_baseline"] is False and noisy["reference_beats_baseline"] is False
    assert not noisy["item_worth_at_most_2"] and not noisy["baseline_sem_at_most_5"]

    invalid = module.checks(anchors([], [0.5, 0.5], [0.7, 0.7]), items=300, score_unit=1)
    assert invalid["do_nothing_below_baseline"] == "invalid"


def test_one_seed_gives_no_noise_figures():
    module = benchmark()
    one = module.checks(anchors([0.2], [0.5], [0.9]), items=100, score_unit=1)
    assert one["do_nothing_below_baseline"] is None and one["reference_beats_baseline"] is None
    assert one["baseline_sem_normalised_points"] is None and one["baseline_sem_at_most_5"] is None
    assert module.fmt(module.mean_sem([0.5])) == "0.5000 (one seed)"


def test_an_anchor_no_seed_reaches_has_no_seed_noise():
    # llm_merging's averaging, a copy of the base: every run scores the same
    module = benchmark()
    same = {"mean": 0.5, "sem": 0.0, "n": 1, "values": [0.5], "deterministic": True}
    result = module.checks({**anchors([0.2, 0.25, 0.22], [0.5], [0.9, 0.91, 0.89]), "baseline": same}, 100, 1)
    assert result["baseline_sem_normalised_points"] == 0 and result["baseline_sem_at_most_5"] is True
    assert result["do_nothing_below_baseline"] is True and result["reference_beats_baseline"] is True
    assert module.fmt(same) == "0.5000 (every run alike here; across kernel paths not measured)"


def test_a_trial_design_changes_the_tiny_scale_and_a_typo_is_refused(tmp_path):
    import subprocess
    import sys

    module = benchmark()
    overrides = module.parse_overrides(["assets.num_layers=3", "assets.pretrain_lr=3e-3",
                                        "baseline_command=python finetune.py --lr 5e-3"])  # fmt: skip
    task = module.load_task("llm_efficiency", 2, overrides)
    assert task.spec.assets["num_layers"] == 3 and task.spec.assets["seed"] == 2
    assert task.spec.assets["pretrain_lr"] == 0.003  # a number, as the task's YAML reads it
    assert task.spec.baseline_command == "python finetune.py --lr 5e-3"

    out = tmp_path / "calibration.json"
    for value, expected in [
        ("assets.num_layer=3", "llm_efficiency: task.scales.tiny has no key 'assets.num_layer'"),
        ("assets.num_layers=-3", "task.scales.tiny.assets: num_layers must be a whole number above 0, not -3"),
        ("num_layers", "--set 'num_layers': expected KEY=VALUE"),
    ]:
        result = subprocess.run([sys.executable, "-m", "benchmarks.calibration", "--tasks", "llm_efficiency",
                                 "--set", value, "--out", str(out), "--cache-dir", str(tmp_path)],
                                cwd=REPO, capture_output=True, text=True)  # fmt: skip
        assert result.returncode == 2 and expected in result.stderr.strip().splitlines()[-1]
        assert not out.exists() and not (tmp_path / "llm_efficiency").exists()  # nothing built or written


def test_the_unchanged_baseline_succeeds_on_at_most_1_run_in_20():
    """MLAgentBench's success (more than 10% over the baseline) is judged against the baseline's
    mean over the asset build's seeds, so the unchanged baseline run at another seed succeeds only
    by seed noise. From each task's committed seeds (benchmarks/calibration.json), with normal
    noise: a run differs from a mean of k seeds by SD * sqrt(1 + 1/k)."""
    import math
    import statistics

    from mlrb.tasks.anchors import DEFAULT_SEEDS

    results = json.loads((REPO / "benchmarks" / "calibration.json").read_text())
    checked = []
    for key, result in results.items():
        values = [v for v in result["anchors"]["baseline"]["values"] if v is not None]
        if len(values) < 2:
            continue  # one value: deterministic (no seed reaches it), it never moves
        mean, sd = statistics.mean(values), statistics.stdev(values)
        if sd == 0:
            continue
        z = 0.1 * abs(mean) / (sd * math.sqrt(1 + 1 / DEFAULT_SEEDS))
        chance = 0.5 * math.erfc(z / math.sqrt(2))  # P(a run is 10% over the mean)
        assert chance <= 1 / 20, f"{key}: the unchanged baseline succeeds on {chance:.1%} of runs (SD {sd:.3g})"
        checked.append(key)
    assert {"math_reasoning", "baby_lm", "mini_pile", "edge_llm_training", "llm_efficiency"} <= set(checked)


def test_a_carried_calibration_must_score_as_measured_at_seed_0_on_assets_of_the_same_settings(tmp_path):
    """`--carry` keeps a task's figures for moved code only where a build of the same settings scores
    seed 0 of each anchor to the last bit as recorded; an invalid anchor must be invalid alike."""
    module = benchmark()
    entry = {"anchors": {"do_nothing": {"values": [], "invalid": 1, "invalid_reason": "too big"},
                         "baseline": {"values": [0.5, 0.52]}, "reference": {"values": [0.9]}}}  # fmt: skip
    built = {"do_nothing_invalid": "too big", "baseline_seeds": [0.5, 0.51, 0.49], "reference_score": 0.9}
    assert [module.seed_zero(built, a) == module.recorded_seed_zero(entry, a) for a in module.ANCHORS] == [True] * 3
    moved = {**built, "baseline_seeds": [0.5000001]}
    assert module.seed_zero(moved, "baseline") != module.recorded_seed_zero(entry, "baseline")
    valid = {**built, "do_nothing_invalid": None, "do_nothing_score": 0.2}
    assert module.seed_zero(valid, "do_nothing") != module.recorded_seed_zero(entry, "do_nothing")
    # Assets of other settings are refused before anything is built.
    other = {**entry, "built": {"key": {"task": "llm_efficiency", "assets": {"seed": 99}}}}
    assert module.carry_over_runs("llm_efficiency", other, tmp_path) == (
        "its assets' settings changed since it was measured",
        None,
    )
    assert not list(tmp_path.iterdir())


def test_another_machine_s_calibration_is_kept_beside_the_task_s_own_and_survives_a_new_measurement():
    """`--another-machine` keeps one record per kind of machine, none where its seed 0 scores as the
    entry's own (a build there takes that one already); measuring the task again on the main machine
    keeps them (a build checks each at seed 0), and the results page names where each was measured."""
    module = benchmark()

    def measurement(cpu: str, baseline_seed_0: float, avx512: bool = False) -> dict:
        calibration = {"do_nothing_invalid": "too big", "baseline_seeds": [baseline_seed_0, 0.51],
                       "reference_seeds": [0.9, 0.91]}  # fmt: skip
        machine = {"cpu": cpu, "avx512": avx512, "cpus": 2}
        return {"built": {"key": {"task": "t"}, "calibration": calibration},
                "measured": {"commit": "abc1234", "date": "2026-12-06 01:00 UTC", "machine": machine}}  # fmt: skip

    entry = {"anchors": {"do_nothing": {"values": [], "invalid": 1, "invalid_reason": "too big"},
                         "baseline": {"values": [0.5, 0.51]}, "reference": {"values": [0.9, 0.91]}},
             **measurement("Main CPU", 0.5)}  # fmt: skip
    assert module.with_other_machine(entry, measurement("Other CPU", 0.5)) is None  # seed 0 as the main's

    entry = module.with_other_machine(entry, measurement("Other CPU", 0.52))
    assert [module.machine_of(r) for r in entry["other_machines"]] == [("Other CPU", False)]
    again = module.with_other_machine(entry, measurement("Other CPU", 0.53))  # that machine measured it again
    assert [r["built"]["calibration"]["baseline_seeds"][0] for r in again["other_machines"]] == [0.53]
    both = module.with_other_machine(again, measurement("Third CPU", 0.54))
    assert [r["measured"]["machine"]["cpu"] for r in both["other_machines"]] == ["Other CPU", "Third CPU"]

    remeasured = module.with_other_machines_kept(both, {**measurement("Main CPU", 0.49), "anchors": entry["anchors"]})
    assert remeasured["built"]["calibration"]["baseline_seeds"][0] == 0.49
    assert remeasured["other_machines"] == both["other_machines"]
    assert "other_machines" not in module.with_other_machines_kept({}, measurement("Main CPU", 0.49))

    rows = module.other_machine_rows({"t": remeasured})
    assert [label for label, _ in rows] == ["`calibration.json`: t: another machine, without AVX-512"] * 2
    assert [measured["machine"]["cpu"] for _, measured in rows] == ["Other CPU", "Third CPU"]

    # One CPU name, two kinds of machine ("AMD EPYC" with AVX-512 and without): one record each,
    # told apart by what their provenance says, or by the field recorded beside it before.
    older = {**both["other_machines"][0], "measured": {**both["other_machines"][0]["measured"], "machine": {
        "cpu": "Other CPU"}}, "avx512": False}  # fmt: skip
    beside = module.with_other_machine(
        {**entry, "other_machines": [older]}, measurement("Other CPU", 0.55, avx512=True)
    )
    assert [module.machine_of(r) for r in beside["other_machines"]] == [("Other CPU", False), ("Other CPU", True)]
    assert [module.machine_name(r) for r in beside["other_machines"]] == [  # as --carry names them
        "Other CPU, without AVX-512", "Other CPU, with AVX-512"]  # fmt: skip
    rows = module.other_machine_rows({"t": beside})
    assert [label for label, _ in rows] == [
        f"`calibration.json`: t: another machine, {w} AVX-512" for w in ("without", "with")
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tasks", "llm_merging"], "llm_merging ships no seeds for a build to take: leave it out"),
        (["--tasks", "mini_pile", "--carry"], "--another-machine measures; --carry checks what is measured"),
        (["--tasks", "mini_pile", "--vary", "assets"], "give neither --vary assets nor --set"),
    ],
    ids=["a-task-that-ships-no-seeds", "with-carry", "vary-assets"],
)
def test_another_machine_s_measurement_that_cannot_stand_beside_an_entry_is_refused_before_anything_is_built(
    args, said, tmp_path, monkeypatch
):
    out = tmp_path / "calibration.json"
    out.write_text((REPO / "benchmarks" / "calibration.json").read_text())
    before = out.read_text()
    monkeypatch.setattr("sys.argv", ["calibration", "--another-machine", *args, "--out", str(out),
                                     "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        benchmark().main()
    assert said in str(refused.value.code)
    assert out.read_text() == before and not (tmp_path / "cache").exists()
    # an entry the file lacks: measure it on the main machine first
    out.write_text("{}")
    monkeypatch.setattr("sys.argv", ["calibration", "--another-machine", "--tasks", "mini_pile", "--out", str(out),
                                     "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    with pytest.raises(SystemExit, match="has no entry for mini_pile: measure it first on the main machine"):
        benchmark().main()


def test_a_carried_calibration_may_hold_as_another_machine_s_record_of_the_same_assets():
    """On another kind of machine, `--carry` checks the record a build there takes: the entry's own
    where seed 0 scores as it, else an other machine's record of the same assets that it scores as."""
    module = benchmark()
    key = {"task": "t", "assets": {"seed": 0}}

    def record(baseline_seed_0: float, assets_key: dict = key) -> dict:
        calibration = {"do_nothing_invalid": "too big", "baseline_seeds": [baseline_seed_0, 0.51],
                       "reference_seeds": [0.9, 0.91]}  # fmt: skip
        return {"built": {"key": assets_key, "calibration": calibration},
                "measured": {"machine": {"cpu": "Other CPU"}}}  # fmt: skip

    entry = {"anchors": {"do_nothing": {"values": [], "invalid": 1, "invalid_reason": "too big"},
                         "baseline": {"values": [0.5, 0.51]}, "reference": {"values": [0.9, 0.91]}},
             "built": {"key": key}, "other_machines": [record(0.52, {"task": "t", "assets": {"seed": 1}}),
                                                       record(0.52), record(0.53)]}  # fmt: skip
    as_main = {"do_nothing_invalid": "too big", "baseline_seeds": [0.5, 0.49], "reference_seeds": [0.9]}
    assert module.held_by(entry, as_main) is entry
    # the first record of other assets is passed over, though it scores alike
    assert module.held_by(entry, {**as_main, "baseline_seeds": [0.52]}) is entry["other_machines"][1]
    assert module.held_by(entry, {**as_main, "baseline_seeds": [0.54]}) is None
    assert module.held_by(entry, {**as_main, "reference_seeds": [0.95], "baseline_seeds": [0.52]}) is None
