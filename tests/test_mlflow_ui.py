"""The MLflow UI in a real browser: `mlflow server` on loopback over a store with a
finished two-seed sweep of the Claude agent (against a scripted model server on
loopback, so the experiment also holds traces), whose parent run carries the sweep's
aggregates and the report. The UI is opened in Debian's headless Chromium, driven by
Selenium through Debian's chromedriver: both paths are given to Selenium, so Selenium
Manager never looks for (or downloads) a browser or a driver.

Screenshots of every page checked are kept in test-artifacts/mlflow_ui/ (git-ignored),
and one is taken of whatever the page showed when a wait times out.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    ElementNotInteractableException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import REPO, mlflow_client, run_cli, run_module
from fake_llm_server import FakeLlmServer, reply, tool

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
MISSING = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
SCREENSHOTS = REPO / "test-artifacts" / "mlflow_ui"
MLFLOW = Path(sys.executable).with_name("mlflow")
WAIT_S = 180  # the UI is a React app served by one worker on a busy 2-core machine: be patient
# Seed 1 runs the starter's merge as it is; seed 2 first sums the experts' updates: two scores.
MERGE_ARGS = '--data "$MLRB_DATA" --output submission'
BASELINE_WEIGHTS = "weights = args.weights or [1.0 / len(adapter_dirs)] * len(adapter_dirs)"
SUMMED_WEIGHTS = "weights = args.weights or [1.0] * len(adapter_dirs)"
SCRIPT = [
    reply(tool("run_python", path="merge.py", args=MERGE_ARGS, timeout_s=300)),
    reply(tool("submit", summary="the starter's merge")),
    reply(tool("edit_file", path="merge.py", old_text=BASELINE_WEIGHTS, new_text=SUMMED_WEIGHTS)),
    reply(tool("run_python", path="merge.py", args=MERGE_ARGS, timeout_s=300)),
    reply(tool("submit", summary="summed the experts' updates")),
]
# While a React page renders, an element is not there yet, was just drawn again, or is still covered.
NOT_YET = (NoSuchElementException, StaleElementReferenceException, ElementClickInterceptedException,
           ElementNotInteractableException, ValueError, IndexError)  # fmt: skip
# The sweep's aggregates on its parent run, and the params its runs are compared by.
AGGREGATES = ["n", "score_mean", "score_sem", "counted_normalised_score_mean", "counted_normalised_score_sem",
              "success_rate", "cost_usd_total"]  # fmt: skip
COMPARED_BY = ["task.name", "agent.name", "agent.options.model", "budget.name", "seed", "sandbox.kind",
               "assets.fingerprint"]  # fmt: skip

pytestmark = [
    pytest.mark.system,
    pytest.mark.xdist_group("mlflow_ui"),  # one process, so the store's sweep and the browser start once
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs Debian's headless Chromium ({', '.join(MISSING)} missing): apt-get install chromium chromium-driver",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium through Selenium, with the waits and screenshots these tests share."""

    def __init__(self, profile_dir: Path, shots_dir: Path):
        self.shots_dir = shots_dir
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={profile_dir}", "--window-size=1600,1000"):  # fmt: skip
            options.add_argument(arg)
        self.driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))

    def go(self, url: str) -> None:
        self.driver.get(url)

    def text(self) -> str:
        return self.driver.find_element(By.TAG_NAME, "body").text

    def lines(self) -> list:
        return [line.strip() for line in self.text().splitlines()]

    def wait(self, what: str, condition, timeout: float = WAIT_S):
        """Selenium's explicit wait for condition(driver) to be truthy (NOT_YET counts as not yet);
        on timeout a screenshot is kept and the page's text shown."""
        waiting = WebDriverWait(self.driver, timeout, poll_frequency=0.5, ignored_exceptions=NOT_YET)
        try:
            return waiting.until(condition)
        except TimeoutException:
            shot = self.screenshot(f"timeout-{''.join(c if c.isalnum() else '_' for c in what)[:60]}.png")
            raise AssertionError(
                f"waited {timeout:.0f} s for {what}; screenshot {shot}; page:\n{self.text()[:2000]}"
            ) from None

    def click(self, what: str, find) -> None:
        """A real click on the element find(driver) returns, once it takes one (a node React just
        drew may still be zero-sized, or under a panel that is closing)."""
        self.wait(f"a click on {what}", lambda driver: find(driver).click() or True, timeout=60)

    def screenshot(self, name: str) -> Path:
        path = self.shots_dir / name
        self.driver.save_screenshot(str(path))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / name)
        return path

    def close_assistant(self) -> None:
        """MLflow's assistant panel opens on a fresh profile and hides half the page (its close
        button itself may be under the page's header: clicked through the page's script)."""
        for button in self.driver.find_elements(
            By.CSS_SELECTOR, "[data-component-id='mlflow.assistant.chat_panel.close']"
        ):
            self.driver.execute_script("arguments[0].click()", button)

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture(scope="module")
def store(tmp_path_factory, built_cache):
    """A finished two-seed sweep of the Claude agent, with the report on its parent run."""
    root = tmp_path_factory.mktemp("ui-store")
    with FakeLlmServer(SCRIPT) as model_server:
        sweep = run_cli("-m", "agent=claude", "seed=1,2", f"tracking.dir={root / 'mlruns'}",
                        f"paths.cache_dir={built_cache}", f"hydra.sweep.dir={root / 'sweep'}", cwd=root, timeout=900,
                        env={"ANTHROPIC_API_KEY": "sk-ant-ui-test", "ANTHROPIC_BASE_URL": model_server.anthropic_url})  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
    report = run_module("mlrb.report", "--out", str(root / "report"), cwd=root, timeout=300)
    assert report.returncode == 0 and "logged to the sweep's parent run" in report.stdout, report.stderr[-3000:]
    client = mlflow_client(root)
    experiment = client.get_experiment_by_name("llm_merging")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("mlrb.role") == "sweep"]
    children = sorted((r for r in runs if r is not parent and r.data.tags.get("mlrb.role") != "sweep"),
                      key=lambda r: r.info.run_name)  # fmt: skip
    assert [(r.info.status, r.data.tags["mlrb.valid"]) for r in children] == [("FINISHED", "True")] * 2
    scores = [r.data.metrics["score"] for r in children]
    assert scores[0] != scores[1], "the two seeds' runs score differently, so the SEM is not zero"
    traces = client.search_traces(locations=[experiment.experiment_id])
    assert traces, "the agent's traces are in the experiment (what made the UI open it on its GenAI overview)"
    (address,) = re.findall(r"then open (http://127\.0\.0\.1:5000/\S+)", sweep.stdout)  # the summary's last line
    return {"root": root, "experiment_id": experiment.experiment_id, "parent": parent, "children": children,
            "printed_page": address.removeprefix("http://127.0.0.1:5000/")}  # fmt: skip


@pytest.fixture(scope="module")
def ui(store, tmp_path_factory):
    """`mlflow server` on a free loopback port; its base URL."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("mlflow-server") / "server.log", "w+")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers: just the UI
    server = subprocess.Popen(
        [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{store['root'] / 'mlruns' / 'mlflow.db'}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,  # its own group: stopped as one
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy(_) -> bool:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200

    try:  # Selenium's wait works for any condition: here the server's health endpoint
        WebDriverWait(server, WAIT_S, poll_frequency=0.5, ignored_exceptions=(OSError,)).until(healthy)
    except TimeoutException:
        log.seek(0)
        stop(server)
        pytest.fail(f"mlflow server did not answer on {url} within {WAIT_S} s:\n{log.read()[-3000:]}")
    yield url
    stop(server)
    log.close()


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    shots = tmp_path_factory.mktemp("screenshots")
    chromium = Browser(tmp_path_factory.mktemp("chromium-profile"), shots)
    yield chromium
    chromium.quit()


def shown_after(lines: list, key: str) -> str:
    """The value beside `key` in one of the run page's key-value tables (metrics, params)."""
    return lines[lines.index(key) + 1]


def test_an_experiment_opens_on_its_runs_table_once_the_ui_is_set_to_model_training(store, ui, browser):
    # A fresh browser, as a new user: the experiment list, then a click on the experiment.
    browser.go(f"{ui}/#/experiments")
    # The list's link (the sidebar also names the last experiment seen, linking to the list).
    experiment_link = lambda driver: driver.find_element(  # noqa: E731
        By.CSS_SELECTOR, f"a[href$='#/experiments/{store['experiment_id']}']"
    )
    assert store["experiment_id"] != "0"  # not the Default experiment
    browser.click("the experiment in the list", experiment_link)
    # MLflow 3.17 ignores the experiment's kind tag: by default it opens the GenAI overview (the README says so).
    browser.wait("the GenAI overview", lambda driver: "/overview" in driver.current_url)
    browser.close_assistant()
    browser.screenshot("experiment_default_genai_overview.png")
    # Its tip about detecting issues dims the page until dismissed; then the sidebar's switch, as
    # the README tells (the browser remembers it).
    browser.click(
        "the tip's Got it", lambda driver: driver.find_element(By.XPATH, "//button[normalize-space(.)='Got it']")
    )
    browser.click("the sidebar's Model training switch",
                  lambda driver: driver.find_element(By.XPATH, "//div[@role='button'][normalize-space(.)='Model training']"))  # fmt: skip
    browser.go(f"{ui}/#/experiments")
    browser.click("the experiment in the list", experiment_link)
    parent_name = store["parent"].info.run_name
    assert parent_name == "sweep llm_merging/claude/smoke: seed=1,2"
    browser.wait(f"'{parent_name}' in the runs table", lambda driver: parent_name in browser.lines())
    assert f"/#/experiments/{store['experiment_id']}/runs" in browser.driver.current_url
    browser.close_assistant()
    # The sweep's runs are nested under its parent run: expand it with the button in its name cell.
    browser.click("the parent run's expand button", lambda driver: driver.find_element(
        By.XPATH, f"//a[normalize-space(.)='{parent_name}']/ancestor::*[@role='gridcell'][1]//button"))  # fmt: skip
    children = [r.info.run_name for r in store["children"]]
    assert children == ["llm_merging/claude/smoke/1", "llm_merging/claude/smoke/2"]
    browser.wait("both seeds' runs under it", lambda driver: set(children) <= set(browser.lines()))
    assert browser.screenshot("experiment_runs.png").stat().st_size > 10_000


def test_the_address_the_sweep_printed_shows_its_parent_run_with_the_sweeps_aggregates(store, ui, browser):
    parent, children = store["parent"], store["children"]
    browser.go(f"{ui}/{store['printed_page']}")
    browser.wait("the parent run's metrics", lambda driver: "cost_usd_total" in browser.lines())
    browser.close_assistant()
    lines = browser.lines()
    assert parent.info.run_name in lines
    shown = {name: float(shown_after(lines, name)) for name in AGGREGATES}
    assert shown == pytest.approx({name: parent.data.metrics[name] for name in AGGREGATES}, abs=1e-9)
    # ... and they are the figures of the sweep's two runs.
    scores = [r.data.metrics["score"] for r in children]
    assert shown["n"] == 2 and shown["score_mean"] == pytest.approx(sum(scores) / 2)
    assert shown["score_sem"] == pytest.approx(abs(scores[0] - scores[1]) / 2) and shown["score_sem"] > 0
    assert shown["cost_usd_total"] == pytest.approx(sum(r.data.metrics["cost_usd"] for r in children))
    assert shown["cost_usd_total"] > 0
    assert browser.screenshot("sweep_aggregates.png").stat().st_size > 10_000


def test_a_run_page_shows_the_score_the_params_runs_are_compared_by_and_the_workspace_patch(store, ui, browser):
    run = store["children"][0]
    page = f"{ui}/#/experiments/{store['experiment_id']}/runs/{run.info.run_id}"
    browser.go(page)
    shown = browser.wait(
        "the score metric on the run page", lambda driver: float(shown_after(browser.lines(), "score"))
    )
    assert shown == pytest.approx(run.data.metrics["score"], abs=1e-9)
    assert run.info.run_name in browser.lines()
    browser.close_assistant()
    params = run.data.params
    assert params["assets.fingerprint"] == run.data.tags["mlrb.assets_fingerprint"]
    expected = {"task.name": "llm_merging", "agent.name": "claude", "agent.options.model": "claude-sonnet-5",
                "budget.name": "smoke", "seed": "1", "sandbox.kind": "bwrap", "assets.fingerprint": params["assets.fingerprint"]}  # fmt: skip
    assert list(expected) == COMPARED_BY
    search = browser.wait("the parameters' search box",
                          lambda driver: driver.find_element(By.CSS_SELECTOR, "input[placeholder='Search parameters']"))  # fmt: skip
    for name, value in expected.items():  # each found as a researcher would, by the table's search box
        search.send_keys(Keys.CONTROL, "a")  # replaces what the box held (clear() bypasses React's state)
        search.send_keys(name)
        browser.wait(
            f"the param {name} = {value}",
            lambda driver, name=name, value=value: shown_after(browser.lines(), name) == value,
        )
    browser.screenshot("run_overview.png")

    browser.go(f"{page}/artifacts")
    patch_node = (By.CSS_SELECTOR, '[data-testid="artifact-tree-node"][artifact-name="workspace.patch"]')
    browser.click("workspace.patch in the artifact tree", lambda driver: driver.find_element(*patch_node))
    browser.wait(
        "the workspace.patch pane", lambda driver: "Path:" in browser.text() and "workspace.patch" in browser.text()
    )
    # MLflow does not preview .patch files, so read the diff the way the UI downloads it.
    patch = browser.driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; fetch(arguments[0]).then(r => r.text()).then(done);",
        f"{ui}/get-artifact?path=workspace.patch&run_uuid={run.info.run_id}",
    )
    assert "+++ b/submission/config.json" in patch
    assert browser.screenshot("run_artifacts.png").stat().st_size > 10_000


def test_the_sweeps_parent_run_shows_the_report(store, ui, browser):
    parent = store["parent"]
    page = f"{ui}/#/experiments/{store['experiment_id']}/runs/{parent.info.run_id}"
    browser.go(page)
    sweep_id = parent.data.tags["mlrb.sweep_id"]
    browser.wait(
        "the report as the run's description", lambda driver: f"mlrb report: sweep {sweep_id}" in browser.text()
    )

    browser.go(f"{page}/artifacts")
    node = lambda name: lambda driver: driver.find_element(  # noqa: E731
        By.CSS_SELECTOR, f'[data-testid="artifact-tree-node"][artifact-name="{name}"]')  # fmt: skip
    browser.close_assistant()
    browser.click("the report folder in the artifact tree", node("report"))
    browser.click("report/summary.md", node("summary.md"))
    browser.wait("the rendered report", lambda driver: "Why runs did not score" in browser.text())
    assert "| llm_merging |" not in browser.text(), "the Markdown is rendered as a table, not shown as text"
    browser.screenshot("sweep_report.png")

    browser.click("score_by_task.png", node("score_by_task.png"))
    width = browser.wait("the score plot", lambda driver: driver.execute_script(
        "const img = [...document.querySelectorAll('img')].find(i => i.src.startsWith('blob:'));"
        "return img && img.complete ? img.naturalWidth : 0;"))  # fmt: skip
    assert width > 300
    browser.screenshot("sweep_report_plot.png")
