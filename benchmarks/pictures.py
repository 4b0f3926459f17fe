"""The pictures on the docs' pages, made from a real sweep: llm_merging at its tiny scale, run by
the scripted `baseline` agent and by the `claude` and `gpt4o` agents against a scripted model server
on loopback (tests/fake_llm_server.py), three seeds each. So the pictures show what mlrb draws from
real runs, not what any real model scored. Then each model agent's run is scored step by step, the
report is made, and one run's page in the MLflow UI is photographed in headless Chromium.

    python -m benchmarks.pictures        # from the repository's root; about 10 minutes on 2 cores

Writes docs/img/*.png and docs/img/pictures.json (where and when they were made, by what command).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from benchmarks.results import provenance

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
MODEL_SERVER = REPO / "tests" / "fake_llm_server.py"  # the scripted model server the tests use

# The report's plots the pages show, by the name the report gives them.
PLOTS = {"score_by_task.png": "score_by_task.png", "anytime.png": "anytime.png",
         "cost_score_pareto.png": "cost_score_pareto.png"}  # fmt: skip
RUN_VIEW = "mlflow_run.png"
MERGE_ARGS = '--data "$MLRB_DATA" --output submission'
STARTER = "weights = args.weights or [1.0 / len(adapter_dirs)] * len(adapter_dirs)"
SUMMED = "weights = args.weights or [1.0] * len(adapter_dirs)"
WAIT_S = 180


RUN_MERGE = [["run_python", {"path": "merge.py", "args": MERGE_ARGS, "timeout_s": 300}]]
SUBMIT = [["submit", {"summary": "merged"}]]


def weights(share: str) -> str:
    return f"weights = args.weights or [{share}] * len(adapter_dirs)"


def claude_turns() -> list:
    """Three runs, one after another (a local sweep runs one job at a time): each runs the starter's
    merge, changes the merge's weights, runs it again and submits; the weights differ per run. A
    turn is a list of [tool, arguments], as the model server reads them."""
    turns = []
    for new in (SUMMED, weights("0.75"), STARTER):
        edit = [["edit_file", {"path": "merge.py", "old_text": STARTER, "new_text": new}]] if new != STARTER \
            else [["list_files", {"path": "."}]]  # fmt: skip
        turns += [RUN_MERGE, edit, RUN_MERGE, SUBMIT]
    return turns


def gpt4o_turns() -> list:
    """The second agent's three runs, after Claude's: it edits the weights before its first merge, then
    once more, running the merge after each edit, so that its curve climbs later than Claude's."""
    turns = []
    for first, second in ((SUMMED, weights("0.6")), (weights("0.75"), weights("0.6")), (SUMMED, weights("0.4"))):
        turns += [[["edit_file", {"path": "merge.py", "old_text": STARTER, "new_text": first}]], RUN_MERGE,
                  [["edit_file", {"path": "merge.py", "old_text": first, "new_text": second}]], RUN_MERGE,
                  SUBMIT]  # fmt: skip
    return turns


@contextlib.contextmanager
def model_server(work: Path) -> Iterator[str]:
    """The scripted model server on loopback, playing Claude's turns, then GPT-4o's; its address."""
    (work / "turns.json").write_text(json.dumps(claude_turns() + gpt4o_turns()))
    server = subprocess.Popen([sys.executable, str(MODEL_SERVER), str(work / "turns.json")], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{server.stdout.readline().strip()}"
    finally:
        server.kill()
        server.wait()


def python(*args: str, cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env={**os.environ, **(env or {})}, text=True,
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"`python {' '.join(args)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def sweep_and_report(work: Path) -> tuple[Path, str, str]:
    """The sweep, each Claude run scored step by step, the report; returns the report's folder, the
    experiment's id and a Claude run's id."""
    import mlflow

    with model_server(work) as address:
        python("-m", "mlrb", "-m", "agent=baseline,claude,gpt4o", "seed=1,2,3", f"tracking.dir={work / 'mlruns'}",
               f"hydra.sweep.dir={work / 'sweep'}", cwd=work,
               env={"ANTHROPIC_API_KEY": "sk-ant-pictures", "ANTHROPIC_BASE_URL": address,
                    "OPENAI_API_KEY": "sk-pictures", "OPENAI_BASE_URL": f"{address}/v1"})  # fmt: skip
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlruns' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("llm_merging")
    runs = client.search_runs([experiment.experiment_id])  # the sweep's parent run has no agent.name
    claude = [r for r in runs if r.data.params.get("agent.name") == "claude"]
    gpt4o = [r for r in runs if r.data.params.get("agent.name") == "gpt4o"]
    assert len(claude) == 3 and len(gpt4o) == 3, [r.info.run_name for r in runs]
    for run in claude + gpt4o:  # both agents' curves: each step scored
        python("-m", "mlrb.rescore", run.info.run_id, "--all-steps", "--tracking-dir", str(work / "mlruns"), cwd=work)
    python("-m", "mlrb.report", "--tracking-dir", str(work / "mlruns"), "--out", str(work / "report"), cwd=work)
    return work / "report", experiment.experiment_id, claude[0].info.run_id


def photograph_run(work: Path, experiment_id: str, run_id: str, shot: Path) -> None:
    """The run's page in the MLflow UI (`mlflow server` on loopback), in headless Chromium."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{work / 'mlruns' / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1400,900",
                f"--user-data-dir={work / 'chromium'}"):  # fmt: skip
        options.add_argument(arg)
    driver = None
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"mlflow server did not answer on port {port} within {WAIT_S} s") from None
                time.sleep(1)
        service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
        driver = webdriver.Chrome(options=options, service=service)
        driver.get(f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}")
        WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
            lambda d: "agent.name" in d.find_element(By.TAG_NAME, "body").text
        )
        for button in driver.find_elements(By.CSS_SELECTOR, "[data-component-id='mlflow.assistant.chat_panel.close']"):
            driver.execute_script("arguments[0].click()", button)  # its assistant panel hides half the page
        time.sleep(2)  # the page's last redraw
        driver.save_screenshot(str(shot))
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def main() -> None:
    measured = provenance("a tiny-scale sweep: the scripted baseline, and the claude and gpt4o agents against a "
                          "scripted model server on loopback, three seeds each; the pictures show what mlrb draws, "
                          "not a real model's scores")  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlrb-pictures-") as folder:
        work = Path(folder)
        report, experiment_id, run_id = sweep_and_report(work)
        for made, name in PLOTS.items():
            shutil.copyfile(report / made, OUT / name)
        photograph_run(work, experiment_id, run_id, OUT / RUN_VIEW)
    (OUT / "pictures.json").write_text(json.dumps({"measured": measured, "pictures": [*PLOTS.values(), RUN_VIEW]},
                                                  indent=2) + "\n")  # fmt: skip
    print(f"wrote {', '.join([*PLOTS.values(), RUN_VIEW])} and pictures.json into {OUT}")


if __name__ == "__main__":
    main()
