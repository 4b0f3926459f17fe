"""Task folders in MLAgentBench's and MLRC-Bench's layouts (tests/folder_tasks/), run end to
end through `python -m mlrb task=folder task.path=...` with the baseline agent and with
`agent=claude` against a scripted model server on loopback, in both confining sandboxes;
then one step of each run scored again with `python -m mlrb.rescore`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import mlflow_client, run_cli, run_module, store_args
from fake_llm_server import FakeLlmServer, reply, tool
from mlrb.run_files import snapshots
from test_docker_sandbox import docker_problem
from test_sweeps import slurm_problem

FOLDERS = Path(__file__).parent / "folder_tasks"
HOUSE_PRICE = FOLDERS / "house-price-mini"
MLRC = FOLDERS / "mlrc-mini"
KEY = "sk-ant-folder-task-secret"

# Both sandboxes; docker where an engine runs (CI has one).
SANDBOXES = [
    pytest.param("bwrap", marks=pytest.mark.integration),
    pytest.param(
        "docker",
        marks=[pytest.mark.skipif(bool(docker_problem()), reason=docker_problem() or "docker ok"), pytest.mark.system],
    ),
]


def runs_of(tmp_path: Path, experiment: str):
    client = mlflow_client(tmp_path)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"]) if found else []
    return client, {run.data.tags["mlrb.agent"]: run for run in runs}


def claude(tmp_path: Path, cache: Path, script, *overrides: str) -> tuple:
    with FakeLlmServer(script) as server:
        result = run_cli(*store_args(tmp_path, cache), "agent=claude", "agent.options.retry_base_delay_s=0.01",
                         f"hydra.run.dir={tmp_path / 'claude'}", *overrides, cwd=tmp_path,
                         env={"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result, server.requests


def rescore(tmp_path: Path, run_id: str, step: int) -> subprocess.CompletedProcess:
    return run_module("mlrb.rescore", run_id, "--step", str(step), cwd=tmp_path, timeout=300)


def tool_results(request) -> str:
    return json.dumps(request["body"]["messages"][-1]["content"])


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_mlagentbench_folder_baseline_then_claude_improves_and_any_step_rescores(tmp_path, cache_dir, sandbox):
    task = ["task=folder", f"task.path={HOUSE_PRICE}", "task.higher_is_better=false", f"sandbox={sandbox}"]
    if sandbox == "bwrap":  # the baseline agent (once: it only runs a command) runs the given train.py as it is
        result = run_cli(*store_args(tmp_path, cache_dir), *task, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "house-price-mini/baseline/smoke/0: score" in result.stdout

    script = [
        reply(
            tool(
                "bash",
                command="ls; ls /data; find / -name answer.csv -o -name research_problem.txt 2>/dev/null | "
                "grep -v ^/proc; echo searched",
            )
        ),  # fmt: skip
        reply(
            tool("edit_file", path="train.py", old_text='FEATURES = ["x1"]', new_text='FEATURES = ["x1", "x2", "x3"]')
        ),
        reply(tool("bash", command="python train.py")),
        reply(tool("write_file", path="train.csv", content="id,x1,x2,x3,y\n")),  # read-only: restored before scoring
        reply(tool("submit", summary="all three features")),
    ]
    _, requests = claude(tmp_path, cache_dir, script, *task)
    seen = tool_results(requests[1])
    assert "train.py" in seen and "searched" in seen and "answer.csv" not in seen and "research_problem" not in seen
    assert "Predict the sale price of a house" in json.dumps(requests[0]["body"]["messages"][0])  # the prompt

    client, runs = runs_of(tmp_path, "house-price-mini")
    agent = runs["claude"]
    m, tags = agent.data.metrics, agent.data.tags
    baseline_score = m["baseline_score"]  # measured once when the assets were built, cached with them
    if sandbox == "bwrap":  # its score is the cached baseline's
        base = runs["baseline"].data.metrics
        assert base["score"] == pytest.approx(baseline_score) and baseline_score > 1.0  # the MAE of x1 alone
        assert base["success"] == 0.0 and base["normalised_score"] == pytest.approx(0.0)
    assert tags["mlrb.status"] == "ok" and tags["mlrb.sandbox"] == sandbox and tags["mlrb.task"] == "house-price-mini"
    assert m["score"] < 0.5  # lower is better: the MAE fell
    assert m["improvement"] == pytest.approx((baseline_score - m["score"]) / baseline_score) and m["improvement"] > 0.1
    assert m["success"] == 1.0 and m["normalised_score"] == pytest.approx(100 * m["improvement"])
    assert tags["mlrb.read_only_restored"] == "train.csv"
    root = tmp_path / "claude" / "snapshots"
    steps = [json.loads(line) for line in (root / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 5]  # the final state again at the end
    changed = [snapshots.changed_files(root, step) for step in steps]
    assert changed[0] == {} and set(changed[1]) == {"train.py"}
    assert set(changed[3]) == {"train.py", "submission.csv", "train.csv"}

    # Step 4's tampered train.csv is restored before it is scored again (in the run's kind of sandbox).
    tampered = rescore(tmp_path, agent.info.run_id, 4)
    assert tampered.returncode == 0 and f"step 4: score {m['score']:.4f} (valid)" in tampered.stdout, tampered.stderr[
        -2000:
    ]
    assert [x.value for x in client.get_metric_history(agent.info.run_id, "step_score")] == [pytest.approx(m["score"])]
    if sandbox == "bwrap":  # step 2 (train.py edited, never run) left no submission.csv; there is no step 9
        early, missing = rescore(tmp_path, agent.info.run_id, 2), rescore(tmp_path, agent.info.run_id, 9)
        assert (
            early.returncode == 0
            and "step 2: no score (invalid: scripts/eval.py get_score raised FileNotFoundError" in early.stdout
        )
        assert missing.returncode == 2 and "has no step 9; its steps: 1, 2, 3, 4, 5" in missing.stderr


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_mlrc_folder_scores_test_on_the_best_dev_snapshot(tmp_path, cache_dir, sandbox):
    task = ["task=folder", f"task.path={MLRC}", "task.scales.folder.baseline_score=0.6",
            "task.scales.folder.reference_score=1.0", f"sandbox={sandbox}"]  # fmt: skip
    if sandbox == "bwrap":  # the baseline agent runs main.py -m my_method -p dev as it is
        result = run_cli(*store_args(tmp_path, cache_dir), *task, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]

    good, bad = 'FEATURES = ["a", "b"]', "        return 0  # always the first class\n"
    predict = "        return min(self.centroids"
    script = [
        reply(tool("edit_file", path="methods/my_method.py", old_text='FEATURES = ["a"]', new_text=good)),
        reply(tool("bash", command="python main.py -m my_method -p dev")),
        # A worse method, and dev labels forged to match it: were they not restored, it would win on dev.
        reply(
            tool("edit_file", path="methods/my_method.py", old_text=predict, new_text=bad + predict),
            tool("write_file", path="data/dev_labels.json", content=json.dumps([0] * 90)),
        ),
        reply(tool("submit", summary="done")),
    ]
    _, requests = claude(tmp_path, cache_dir, script, *task)
    assert "dev accuracy: 0.9667" in tool_results(requests[2])
    assert "main.py -m my_method -p test" in json.dumps(requests[0]["body"]["messages"][0])

    client, runs = runs_of(tmp_path, "mlrc-mini")
    agent = runs["claude"]
    if (
        sandbox == "bwrap"
    ):  # its test accuracy (feature a only); anchors 0.6 (baseline), 1.0 (top human) from the config
        base = runs["baseline"].data.metrics
        assert base["score"] == pytest.approx(85 / 120) and base["normalised_score"] == pytest.approx(
            100 * (85 / 120 - 0.6) / 0.4
        )
    m, tags = agent.data.metrics, agent.data.tags
    assert json.loads(tags["mlrb.dev_scores"]) == {"1": pytest.approx(87 / 90), "2": pytest.approx(87 / 90),
                                                   "3": pytest.approx(1 / 3), "4": pytest.approx(1 / 3)}  # fmt: skip
    assert tags["mlrb.scored_step"] == "1" and m["best_dev_score"] == pytest.approx(87 / 90)
    assert tags["mlrb.status"] == "ok" and m["score"] == pytest.approx(0.95)  # the good method, on test
    # ... its method run apart from the scorer, where the hidden labels are out of its reach
    # (tests/test_folder_hidden_labels.py), and only what it wrote scored
    assert (tmp_path / "claude" / "scoring" / "submission_command.log").is_file()
    assert m["normalised_score"] == pytest.approx(100 * (0.95 - 0.6) / 0.4)
    assert m["relative_improvement_to_human"] == pytest.approx(m["normalised_score"])
    assert m["absolute_improvement_to_baseline"] == pytest.approx(100 * (0.95 - 0.6) / 0.6)

    again = rescore(tmp_path, agent.info.run_id, 3)  # the last edit's method, on the test split
    assert again.returncode == 0 and f"step 3: score {40 / 120:.4f} (valid)" in again.stdout, again.stderr[-2000:]

    if sandbox == "bwrap":  # the report shows folder tasks like built-in ones
        report = run_module("mlrb.report", "--out", str(tmp_path / "reports"), cwd=tmp_path, timeout=300)
        assert report.returncode == 0, report.stderr[-2000:]
        rows = (tmp_path / "reports" / "summary.csv").read_text()
        assert "mlrc-mini" in rows and "claude" in rows and "baseline" in rows
        # ... under MLRC-Bench's own name for its normalised score (the run's tag, then the report)
        assert tags["mlrb.normalised_as"] == "human_gap"
        assert "MLRC-Bench relative improvement to human" in (tmp_path / "reports" / "summary.md").read_text()


@pytest.mark.fast
def test_a_broken_task_folder_is_one_line_naming_the_file_and_nothing_is_recorded(tmp_path, cache_dir):
    missing = tmp_path / "no-eval"
    shutil.copytree(HOUSE_PRICE, missing)
    (missing / "scripts" / "eval.py").unlink()
    result = run_cli(*store_args(tmp_path, cache_dir), "task=folder", f"task.path={missing}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: task folder {missing} has no scripts/eval.py (a mlagentbench task needs env/, "
        f"scripts/research_problem.txt, scripts/eval.py)"
    )

    raising = tmp_path / "eval-raises"
    shutil.copytree(HOUSE_PRICE, raising)
    (raising / "scripts" / "eval.py").write_text("def get_score(folder):\n    raise KeyError('price column')\n")
    result = run_cli(*store_args(tmp_path, cache_dir), "task=folder", f"task.path={raising}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: {raising}/scripts/eval.py could not score the baseline: "
        f"scripts/eval.py get_score raised KeyError: 'price column'"
    )
    assert [e.name for e in mlflow_client(tmp_path).search_experiments()] == ["Default"]  # nothing recorded
    assert not (tmp_path / "run").exists()
    assert not [p for p in (cache_dir / "eval-raises").iterdir() if p.is_dir()]  # no half-built assets in the cache

    # A baseline that fails, even where the config states its score (it is run all the same:
    # that is the check that the folder works).
    failing = tmp_path / "baseline-fails"
    shutil.copytree(HOUSE_PRICE, failing)
    (failing / "env" / "train.py").write_text("raise SystemExit('no data for the baseline')\n")
    result = run_cli(*store_args(tmp_path, cache_dir), "task=folder", f"task.path={failing}",
                     "task.scales.folder.baseline_score=1.0", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"mlrb: error: {failing}/env: the baseline `python train.py` failed at seed 0: `python train.py` exited 1: "
        f"no data for the baseline"
    )
    assert not [p for p in (cache_dir / "baseline-fails").iterdir() if p.is_dir()]


@pytest.mark.system
@pytest.mark.skipif(bool(slurm_problem()), reason=slurm_problem() or "slurm ok")
def test_a_folder_task_sweeps_on_slurm(tmp_path, cache_dir):
    result = run_cli("-m", "seed=1,2", "launcher=slurm", "tracking.allow_sqlite_on_slurm=true", "task=folder",
                     f"task.path={HOUSE_PRICE}", "task.higher_is_better=false", f"tracking.dir={tmp_path / 'mlruns'}",
                     f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
                     timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "done" in result.stdout and "2 runs (2 ok)" in result.stdout
    assert "MLAgentBench improvement over baseline, %" in result.stdout  # the summary names its scale
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("house-price-mini").experiment_id
    runs = [r for r in client.search_runs([experiment]) if r.data.tags.get("mlrb.role") != "sweep"]
    assert sorted(r.data.tags["mlrb.seed"] for r in runs) == ["1", "2"]
    assert all(r.info.status == "FINISHED" and r.data.tags["mlrb.valid"] == "True" for r in runs)
    assert list((tmp_path / "sweep" / ".submitit").rglob("*_log.out")), "the jobs ran through SLURM via submitit"
