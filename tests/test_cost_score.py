"""The report's "Cost against score" (issue 38, report/costs.py): the Pareto front and the points
per task and overall, on rows made by hand. The command line is checked with "Where agents fail"
in tests/test_where_agents_fail.py, on a real store."""

from __future__ import annotations

import pytest

from mlrb.report import aggregate, costs
from mlrb.report.costs import pareto_front
from mlrb.report.runs import RunRow


@pytest.mark.fast
def test_a_point_is_on_the_front_unless_another_costs_no_more_and_scores_no_less():
    points = [
        (0.0, -10.0),  # free, scores least: on the front (nothing is cheaper)
        (1.0, 30.0),  # on
        (3.0, 20.0),  # dominated by (1, 30): dearer and worse
        (1.0, 25.0),  # dominated: as cheap as (1, 30) but worse
        (2.0, 30.0),  # dominated: as good as (1, 30) but dearer
        (5.0, 60.0),  # on: the best score
    ]
    assert pareto_front(points) == [True, True, False, False, False, True]


@pytest.mark.fast
def test_points_that_tie_are_both_on_the_front_and_a_lone_point_is_on_it():
    assert pareto_front([(1.0, 30.0), (1.0, 30.0), (2.0, 10.0)]) == [True, True, False]
    assert pareto_front([(0.0, 0.0), (0.0, 0.0)]) == [True, True]
    assert pareto_front([(4.0, -5.0)]) == [True]
    assert pareto_front([]) == []


def rows_of(agent: str, task: str, scores: list[float], usd: float | None, model: str = "") -> list[RunRow]:
    metrics = {} if usd is None else {"cost_usd": usd}
    return [RunRow(run_id=f"{agent}{task}{i}", name=f"{task}/{agent}/smoke/{i}", experiment=task, task=task,
                   agent=agent, budget="smoke", scale="tiny", seed=str(i), sweep_id="", mlflow_status="FINISHED",
                   kind="ok", detail="", valid=True, metrics={**metrics, "counted_normalised_score": v},
                   sandbox="bwrap", confinement="confined", model=model)
            for i, v in enumerate(scores, 1)]  # fmt: skip


@pytest.mark.fast
def test_per_task_and_overall_points_with_the_free_baseline_among_them():
    rows = (rows_of("baseline", "a", [0.0, 2.0], None) + rows_of("baseline", "b", [0.0, 0.0], None)
            + rows_of("claude", "a", [40.0, 50.0], 1.0, "sonnet") + rows_of("claude", "b", [20.0, 30.0], 3.0, "sonnet")
            + rows_of("gpt4o", "a", [30.0], 2.0, "4o") + rows_of("gpt4o", "b", [10.0], 4.0, "4o")
            + rows_of("codex", "a", [60.0], 9.0))  # fmt: skip  # codex ran only task a
    stats = aggregate.summarise(rows)
    points, left_out = costs.points_of(stats)
    found = {(p.panel, p.label): (p.cost, p.score, p.on_front) for p in points}
    assert found == {
        ("a", "baseline"): (0.0, 1.0, True),
        ("a", "claude (sonnet)"): (1.0, 45.0, True),
        ("a", "codex"): (9.0, 60.0, True),
        ("a", "gpt4o (4o)"): (2.0, 30.0, False),
        ("b", "baseline"): (0.0, 0.0, True),
        ("b", "claude (sonnet)"): (3.0, 25.0, True),
        ("b", "gpt4o (4o)"): (4.0, 10.0, False),
        # overall: means over the tasks, each weighing the same
        ("overall", "baseline"): (0.0, 0.5, True),
        ("overall", "claude (sonnet)"): (2.0, 35.0, True),
        ("overall", "gpt4o (4o)"): (3.0, 20.0, False),
    }
    assert left_out == ["codex (a counted score on 1 of 2 tasks)"]

    ((heading, intro, table),) = costs.report_sections(stats)
    assert heading == "Cost against score" and "Not in the overall: codex (a counted score on 1 of 2 tasks)." in intro
    assert table.headers == ["task", "agent", "model", "attempts", "$ per run", "counted normalised", "Pareto front"]
    assert table.rows[0] == ["a", "baseline", "", "2", "$0.00 (none recorded)", "1.0 ± 1.0", "yes"]
    assert table.rows[-1] == ["overall", "gpt4o", "4o", "2", "$3.00", "20.0", ""]
    ((name, fields, records),) = costs.csv_files(stats)
    assert name == "cost_score.csv" and set(records[0]) == set(fields)


@pytest.mark.fast
def test_one_task_has_no_overall_and_a_row_without_counted_scores_is_off_the_front():
    rows = rows_of("claude", "a", [40.0], 1.0) + rows_of("gpt4o", "a", [30.0], 2.0)
    rows[1].metrics.pop("counted_normalised_score")  # recorded before runs recorded a counted score
    points, left_out = costs.points_of(aggregate.summarise(rows))
    assert [(p.panel, p.label, p.score, p.on_front) for p in points] == [
        ("a", "claude", 40.0, True), ("a", "gpt4o", None, False)]  # fmt: skip
    assert left_out == []


@pytest.mark.fast
def test_the_plot_marks_the_front(tmp_path):
    rows = rows_of("baseline", "a", [0.0], None) + rows_of("claude", "a", [40.0, 44.0], 1.0)
    rows += rows_of("baseline", "b", [0.0], None) + rows_of("claude", "b", [10.0], 2.0)
    drawn = costs.draw(aggregate.summarise(rows), tmp_path)
    assert list(drawn.values()) == [tmp_path / "cost_score_pareto.png"]
    assert (tmp_path / "cost_score_pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert costs.draw(aggregate.summarise(rows_of("x", "a", [], 1.0)), tmp_path) == {}
