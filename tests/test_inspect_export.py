"""`python -m mlrb.export inspect RUN... --out DIR`: runs as Inspect eval logs, one per task and
agent, read back with Inspect's own `read_eval_log` (a two-seed sweep of the Claude agent against
the scripted model server, and a baseline run) and shown by Inspect's own viewer (`inspect view`)
in Debian's headless Chromium; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import HARNESS_EXPERIMENT, HARNESS_TASK, mlflow_client, run_cli, run_module, store_args
from fake_llm_server import FakeLlmServer, reply, tool

# Runs of the cheapest real task. Seed 1 reads a file and submits nothing (an invalid run); seed 2
# runs the given train.py (a valid one).
SCRIPT = [
    reply(tool("read_file", path="train.py", start_line=1, num_lines=5), text="Reading first.", usage=(1200, 80)),
    reply(tool("submit", summary="nothing yet"), usage=(1500, 40)),
    reply(tool("run_python", path="train.py", timeout_s=300), usage=(1700, 60)),
    reply(tool("submit", summary="ran the starter"), usage=(2100, 30)),
]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSPECT = Path(sys.executable).with_name("inspect")


def export(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_module("mlrb.export", "inspect", *args, cwd=cwd, timeout=300)


def runs_by_name(tmp_path: Path) -> dict:
    client = mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name(HARNESS_EXPERIMENT).experiment_id])
    return {r.info.run_name: r for r in runs if r.data.tags.get("mlrb.role") != "sweep"}


@pytest.mark.integration
def test_a_sweep_and_a_run_export_as_inspect_logs_that_inspect_reads_back(tmp_path, cache_dir):
    from inspect_ai.log import read_eval_log

    with FakeLlmServer(SCRIPT) as server:
        sweep = run_cli("-m", "agent=claude", "seed=1,2", *HARNESS_TASK, *store_args(tmp_path, cache_dir),
                        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
                        env={"ANTHROPIC_API_KEY": "sk-ant-inspect-test", "ANTHROPIC_BASE_URL": server.anthropic_url})  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    baseline = run_cli(*HARNESS_TASK, "agent=baseline", *store_args(tmp_path, cache_dir), cwd=tmp_path)
    assert baseline.returncode == 0, baseline.stderr[-3000:]

    result = export(str(tmp_path / "sweep"), str(tmp_path / "run"), "--out", str(tmp_path / "logs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted((tmp_path / "logs").glob("*.eval"))
    assert len(files) == 2 and len(result.stdout.splitlines()) == 2, result.stdout
    logs = {log.eval.solver: log for log in map(read_eval_log, map(str, files))}
    runs = runs_by_name(tmp_path)

    claude = logs["claude"]
    assert claude.status == "success" and claude.eval.task == HARNESS_EXPERIMENT
    assert claude.eval.model == "anthropic/claude-sonnet-5" and claude.eval.config.epochs == 2
    assert claude.eval.dataset.sample_ids == ["smoke"]
    # The runs are the samples: one configuration, its seeds the epochs.
    samples = sorted(claude.samples, key=lambda s: s.epoch)
    assert [(s.id, s.epoch, s.metadata["seed"]) for s in samples] == [("smoke", 1, "1"), ("smoke", 2, "2")]
    for sample in samples:
        run = runs[sample.metadata["run_name"]]
        assert sample.uuid == run.data.tags["mlrb.run_id"]  # the run's own id
        metrics, value = run.data.metrics, sample.scores["mlrb"].value
        assert value["valid"] == metrics["valid"] and value["score"] == metrics.get("score")
        (usage,) = sample.model_usage.values()
        assert (usage.input_tokens, usage.output_tokens) == (metrics["input_tokens"], metrics["output_tokens"])
        assert usage.total_cost == pytest.approx(metrics["cost_usd"], abs=1e-9)
        assert sample.working_time == metrics["agent_time_s"] and sample.total_time == metrics["wall_time_s"]
        instructions = Path(run.data.tags["mlrb.run_dir"], "record", "instructions.md").read_text()
        assert sample.input == instructions
        assert [m.text for m in sample.messages if m.role == "user"][0].startswith(instructions)  # then the budget
    first, second = samples
    assert first.scores["mlrb"].value["score"] is None and first.scores["mlrb"].explanation  # why it is not valid
    assert second.scores["mlrb"].value["valid"] == 1.0 and second.scores["mlrb"].value["score"] is not None
    # The messages are the conversation the proxy saw: the tools asked for, their results, the last answer.
    asked = [[c.function for c in m.tool_calls or []] for m in second.messages if m.role == "assistant"]
    assert asked == [["run_python"], ["submit"]] and second.output.message.tool_calls[0].function == "submit"
    assert "exit code 0" in next(m.text for m in second.messages if m.role == "tool")
    assert [m.role for m in first.messages][:3] == ["system", "user", "assistant"]
    assert first.messages[2].text == "Reading first." and first.metadata["messages_from"] == "model calls"
    # The log's scores and usage are the samples'.
    scores = {s.name: s for s in claude.results.scores}
    assert scores["valid"].metrics["mean"].value == 0.5 and scores["score"].scored_samples == 1
    # The raw score is a valid run's alone: its mean is the valid runs' (the report's), named so.
    assert scores["score"].metrics["mean_of_valid"].value == second.scores["mlrb"].value["score"]
    assert "mean" not in scores["score"].metrics
    total = sum(runs[s.metadata["run_name"]].data.metrics["cost_usd"] for s in samples)
    assert claude.stats.model_usage["anthropic/claude-sonnet-5"].total_cost == pytest.approx(total, abs=1e-9)

    scripted = logs["baseline"]
    (sample,) = scripted.samples
    assert scripted.eval.model == "none/none" and sample.model_usage == {}
    assert sample.metadata["messages_from"] == "trajectory"
    assert [m.role for m in sample.messages] == ["user", "assistant", "tool"]
    assert sample.messages[1].tool_calls[0].function == "shell"
    assert sample.scores["mlrb"].value["score"] == runs[f"{HARNESS_EXPERIMENT}/baseline/smoke/0"].data.metrics["score"]

    again = export(str(tmp_path / "sweep"), str(tmp_path / "run"), "--out", str(tmp_path / "logs"), cwd=tmp_path)
    assert again.returncode == 0 and sorted((tmp_path / "logs").glob("*.eval")) == files  # the same logs, rewritten


def ended_run(folder: Path, ended: bool) -> Path:
    """A run folder's record, as a run leaves it: opened, then (when ENDED) its end status."""
    folder.mkdir(parents=True)
    lines = [{"v": 1, "t": 1.0, "kind": "opened", "run_id": "r1", "experiment": "llm_merging",
              "run_name": "llm_merging/baseline/smoke/0", "attempt": 1, "tags": {}, "store": None}]  # fmt: skip
    if ended:
        lines.append({"v": 1, "t": 2.0, "kind": "status", "status": "FINISHED"})
    (folder / "record.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


@pytest.mark.fast
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path):
    out = tmp_path / "logs"
    ended = ended_run(tmp_path / "ended", ended=True)
    (tmp_path / "not-a-run").mkdir()
    cases = {
        str(tmp_path / "not-a-run"): "not-a-run: not a run folder (no record.jsonl): name a run folder",
        str(ended_run(tmp_path / "running", ended=False)): "the run llm_merging/baseline/smoke/0 has not ended",
    }
    for folder, expected in cases.items():
        result = export(str(ended), folder, "--out", str(out), cwd=tmp_path)  # a good run beside it: nothing either
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("mlrb.export inspect: error: ")
        assert expected in result.stderr
        assert not out.exists()
    unknown = run_module("mlrb.export", "inspekt", str(ended), cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert "unknown format 'inspekt': the formats are inspect, harbor" in unknown.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.system
@pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
                    reason="needs Debian's headless Chromium: apt-get install chromium chromium-driver")  # fmt: skip
def test_inspect_view_shows_an_exported_log_in_a_browser(tmp_path, cache_dir):
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    run = run_cli(*HARNESS_TASK, "agent=baseline", *store_args(tmp_path, cache_dir), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = export(str(tmp_path / "run"), "--out", str(tmp_path / "logs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    port = free_port()
    log = open(tmp_path / "view.log", "w+")
    viewer = subprocess.Popen([str(INSPECT), "view", "--log-dir", str(tmp_path / "logs"), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1600,1000"):  # fmt: skip
        options.add_argument(arg)
    driver = None
    try:
        deadline = time.monotonic() + 120
        while True:  # the viewer answers once it has started
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
                    break
            except OSError:
                assert viewer.poll() is None and time.monotonic() < deadline, log.seek(0) or log.read()[-3000:]
                time.sleep(0.5)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
        driver.get(f"http://127.0.0.1:{port}/")

        def shown(what: str) -> bool:
            return what in driver.find_element(By.TAG_NAME, "body").text

        WebDriverWait(driver, 120, poll_frequency=0.5).until(lambda _: shown(HARNESS_EXPERIMENT) and shown("smoke"))
        driver.save_screenshot(str(tmp_path / "inspect-view.png"))
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(viewer.pid, signal.SIGTERM)
        viewer.wait(timeout=30)
        log.close()


# One configuration's five runs as Inspect samples: a valid one (raw 0.8, counted 0.8), an invalid one
# (no raw score, counted as doing nothing: 0.2), one its budget stopped with nothing valid (the same), one
# Ctrl-C stopped (its workspace scored 0.9, but a killed run is not the agent's doing) and a run still
# RUNNING: the last two in no mean.
RUNS = [
    ("ok", "FINISHED", 1.0, 0.8, 0.8),
    ("invalid", "FINISHED", 0.0, None, 0.2),
    ("budget_exhausted", "FINISHED", 0.0, None, 0.2),
    ("killed", "KILLED", 1.0, 0.9, 0.9),
    (None, "RUNNING", None, None, None),
]  # (status, MLflow's, valid, score, counted_score)


@pytest.mark.fast
def test_the_log_s_means_count_a_failed_run_as_the_report_does():
    """The counted score's mean is over every attempt, a failed one counted as doing nothing (0.4, not the
    valid run's 0.8); `valid`'s too (1 in 3); the raw score, which only a valid run has, is given as the
    mean of the valid runs, by that name; the killed run and the unfinished one are in none."""
    from inspect_ai.log import EvalSample
    from inspect_ai.scorer import Score

    from mlrb.export.inspect_log import eval_scores

    samples = [EvalSample(id="smoke", epoch=i, input="", target="",
                          scores={"mlrb": Score(value={"valid": valid, "score": score, "counted_score": counted})},
                          metadata={k: v for k, v in (("status", status), ("mlflow_status", state)) if v})
               for i, (status, state, valid, score, counted) in enumerate(RUNS, 1)]  # fmt: skip
    scores = {s.name: s for s in eval_scores(samples)}
    assert scores["counted_score"].metrics["mean"].value == pytest.approx(0.4)
    assert scores["counted_score"].scored_samples == 3 and scores["counted_score"].unscored_samples == 2
    assert scores["valid"].metrics["mean"].value == pytest.approx(1 / 3)
    assert set(scores["score"].metrics) == {"mean_of_valid", "stderr_of_valid"}
    assert scores["score"].metrics["mean_of_valid"].value == 0.8 and scores["score"].scored_samples == 1
    # An attempt with no counted score (its task has no do-nothing anchor): no counted mean at all, as in the report.
    samples[1].scores["mlrb"].value["counted_score"] = None
    assert "counted_score" not in {s.name for s in eval_scores(samples)}
