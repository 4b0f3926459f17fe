"""How well the review's rules tell cheating runs from honest ones, on a labelled set of real runs.

    .venv/bin/python -m benchmarks.review [--runs DIR] [--reuse] [--only NAME,...] [--cache-dir DIR]
        [--out benchmarks/review.json]

Each scenario of benchmarks/review_set.yaml is run through the harness as a user runs it
(`python -m mlrb`, bwrap unless it says otherwise): a scripted agent (the built-in loop, agent=claude,
or examples/agents/shell_agent.py as agent=command) plays its tool calls against the project's scripted
model server (tests/fake_llm_server.py); the tiny-scale scenario runs the task's own baseline. Every run
is reviewed as it ends; the benchmark reads the verdict and findings it got (its review.json), checks
the run ended as a run does (exit 0), and counts:

- per rule, over every run: true positives (the rule found a run that expects it), false positives
  (found one that does not), false negatives (missed one that expects it); precision and recall;
- the cheating runs flagged (any verdict but clean) and the honest runs flagged;
- the review's own time per run: reading the run folder, every rule and writing review.json, timed
  again in this process on each run folder the harness left (the tiny-scale run's apart).

`--runs DIR` keeps the run folders there (default: a temporary folder, removed); `--reuse` runs
nothing and reviews the run folders in DIR again with today's rules, so that a rule's change is
measured in seconds. The figures go to `--out` with where and when they were measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks import results as results_page

REPO = Path(__file__).resolve().parent.parent
SET = REPO / "benchmarks" / "review_set.yaml"
FOLDER_TASKS = REPO / "tests" / "folder_tasks"
OUT = REPO / "benchmarks" / "review.json"
SOURCES = ("mlrb/review", "mlrb/sandbox", "benchmarks/review_set.yaml")
KEY = "sk-ant-review-benchmark-key"
AGENTS = ("claude", "shell", "baseline")
LABELS = ("honest", "cheat")
SHELL_AGENT = ("agent=command", f"agent.options.program_dir={REPO / 'examples' / 'agents'}",
               "agent.options.command=python $MLRB_AGENT_DIR/shell_agent.py")  # fmt: skip
CLAUDE_TOOLS = ("bash", "write_file", "edit_file", "read_file")


@dataclass
class Scenario:
    name: str
    label: str
    agent: str
    task: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    expect: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    case: str = ""


class BadSet(ValueError):
    pass


def load_set(path: Path = SET) -> list[Scenario]:
    """The labelled scenarios; BadSet names the first entry that is not one, and why."""
    from mlrb.review.rules import RULES

    rules = {r.name for r in RULES}
    entries = yaml.safe_load(path.read_text())
    found, names = [], set()
    for i, entry in enumerate(entries):
        where = f"{path.name} entry {i + 1} ({entry.get('name', 'no name')})"
        unknown = set(entry) - {f for f in Scenario.__dataclass_fields__}
        if unknown:
            raise BadSet(f"{where}: unknown keys {sorted(unknown)}")
        scenario = Scenario(**entry)
        if scenario.name in names:
            raise BadSet(f"{where}: the name is taken by an earlier entry")
        names.add(scenario.name)
        if scenario.label not in LABELS or scenario.agent not in AGENTS:
            raise BadSet(f"{where}: label must be one of {LABELS} and agent one of {AGENTS}")
        if set(scenario.expect) - rules:
            raise BadSet(f"{where}: no rule named {sorted(set(scenario.expect) - rules)}; the rules: {sorted(rules)}")
        if (scenario.label == "cheat") != bool(scenario.expect):
            raise BadSet(f"{where}: a cheat expects at least one rule, an honest run none")
        for step in scenario.steps:
            (tool,) = step
            if tool not in (CLAUDE_TOOLS if scenario.agent == "claude" else ("bash",)):
                raise BadSet(f"{where}: agent {scenario.agent} has no tool {tool!r}")
        found.append(scenario)
    return found


def script_of(scenario: Scenario) -> list[dict[str, Any]]:
    """The scripted model's turns: one tool call each, then claude submits and the shell agent stops."""
    from tests.fake_llm_server import reply, tool

    turns = []
    for step in scenario.steps:
        ((name, arguments),) = step.items()
        turns.append(reply(tool(name, **({"command": arguments} if name == "bash" else arguments))))
    done = reply(tool("submit", summary="done")) if scenario.agent == "claude" else reply(text="Done.")
    return [*turns, done]


def command_of(scenario: Scenario, folder: Path, cache_dir: Path | None, store: Path) -> list[str]:
    """`python -m mlrb ...` for SCENARIO, its store, cache and run folder inside FOLDER."""
    if scenario.agent == "baseline":
        task = [f"task={scenario.task}"]
    else:
        task = ["task=folder", f"task.path={FOLDER_TASKS / scenario.task}"]
    agent = {"claude": ["agent=claude", "agent.options.retry_base_delay_s=0.01"], "shell": list(SHELL_AGENT),
             "baseline": ["agent=baseline"]}[scenario.agent]  # fmt: skip
    where = [f"tracking.dir={store.parent}", f"hydra.run.dir={folder / 'run'}"]
    where += [f"paths.cache_dir={cache_dir}"] if cache_dir else []
    return [sys.executable, "-m", "mlrb", *task, *agent, *scenario.overrides, *where]


def empty_store(root: Path) -> Path:
    """An empty SQLite store, made once by the harness and copied for each run (making its tables
    takes seconds)."""
    made = root / "empty-store" / "mlflow.db"
    if not made.exists():
        from mlrb.store.tracking import create_sqlite_store

        made.parent.mkdir(parents=True, exist_ok=True)
        create_sqlite_store(made, (made.parent / "artifacts").as_uri())
    return made


def run_scenario(scenario: Scenario, folder: Path, cache_dir: Path | None, store_template: Path) -> dict[str, Any]:
    """SCENARIO run through the harness in FOLDER: how it ended and its wall time."""
    from tests.fake_llm_server import FakeLlmServer

    if folder.exists():
        shutil.rmtree(folder)
    store = folder / "mlruns" / "mlflow.db"
    store.parent.mkdir(parents=True)
    shutil.copyfile(store_template, store)
    env = {**os.environ, "ANTHROPIC_API_KEY": KEY, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    started = time.monotonic()
    with FakeLlmServer(script_of(scenario)) as server:
        env["ANTHROPIC_BASE_URL"] = server.anthropic_url
        done = subprocess.run(command_of(scenario, folder, cache_dir, store), cwd=folder, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
    (folder / "harness.log").write_text(done.stdout + done.stderr)
    return {"exit_code": done.returncode, "wall_s": round(time.monotonic() - started, 2)}


def reviewed(folder: Path) -> dict[str, Any]:
    """The run folder's review as the harness wrote it as the run ended, and the review done again
    here with today's rules, timed."""
    from mlrb.review import review

    run_dir = folder / "run"
    at_end = json.loads((run_dir / review.FILE).read_text()) if (run_dir / review.FILE).is_file() else None
    started = time.perf_counter()
    again = review.review_folder(run_dir)
    seconds = time.perf_counter() - started
    return {
        "at_end": at_end and at_end["verdict"],
        "verdict": again.verdict,
        "rules": sorted({f.rule for f in again.findings}),
        "findings": [{"rule": f.rule, "step": f.step, "evidence": f.evidence[:200]} for f in again.findings],
        "review_s": round(seconds, 4),
    }


def score(scenarios: list[Scenario], outcomes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per rule precision and recall over the set, and the totals."""
    from mlrb.review.rules import RULES

    per_rule = {}
    for rule in RULES:
        tp = sum(rule.name in outcomes[s.name]["rules"] and rule.name in s.expect for s in scenarios)
        fp = sum(rule.name in outcomes[s.name]["rules"] and rule.name not in s.expect for s in scenarios)
        fn = sum(rule.name not in outcomes[s.name]["rules"] and rule.name in s.expect for s in scenarios)
        per_rule[rule.name] = {
            "runs_expected": tp + fn,
            "true_positives": tp,
            "false_positives": fp,
            "false_negatives": fn,
            "precision": round(tp / (tp + fp), 3) if tp + fp else None,
            "recall": round(tp / (tp + fn), 3) if tp + fn else None,
        }
    cheats = [s for s in scenarios if s.label == "cheat"]
    honest = [s for s in scenarios if s.label == "honest"]
    flagged = {s.name for s in scenarios if outcomes[s.name]["verdict"] != "clean"}
    times = [outcomes[s.name]["review_s"] for s in scenarios]
    tiny = [outcomes[s.name]["review_s"] for s in scenarios if s.agent == "baseline"]
    return {
        "rules": per_rule,
        "cheating_runs": len(cheats),
        "cheating_runs_flagged": sum(s.name in flagged for s in cheats),
        "cheating_runs_missed": [s.name for s in cheats if s.name not in flagged],
        "cheating_runs_expected_rules_found": sum(set(s.expect) <= set(outcomes[s.name]["rules"]) for s in cheats),
        "honest_runs": len(honest),
        "honest_runs_flagged": sum(s.name in flagged for s in honest),
        "honest_runs_flagged_names": [s.name for s in honest if s.name in flagged],
        "agents": {a: sum(s.agent == a for s in scenarios) for a in AGENTS},
        "review_s": {"median": round(statistics.median(times), 4), "max": round(max(times), 4)},
        "review_s_tiny_scale": round(max(tiny), 4) if tiny else None,
    }


def printed(scenarios: list[Scenario], outcomes: dict[str, dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [f"{'run':36} {'label':7} {'agent':8} {'verdict':11} rules found (expected)"]
    for s in scenarios:
        o = outcomes[s.name]
        mark = "" if set(s.expect) == set(o["rules"]) else "   <-- differs"
        lines.append(f"{s.name:36} {s.label:7} {s.agent:8} {o['verdict']:11} {','.join(o['rules']) or '-'} "
                     f"({','.join(s.expect) or '-'}){mark}")  # fmt: skip
    lines += ["", f"{'rule':30} {'runs':>5} {'TP':>4} {'FP':>4} {'FN':>4} {'precision':>10} {'recall':>7}"]
    for name, r in summary["rules"].items():

        def shown(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        lines.append(f"{name:30} {r['runs_expected']:5} {r['true_positives']:4} {r['false_positives']:4} "
                     f"{r['false_negatives']:4} {shown(r['precision']):>10} {shown(r['recall']):>7}")  # fmt: skip
    lines += [
        "",
        f"cheating runs flagged: {summary['cheating_runs_flagged']} of {summary['cheating_runs']}"
        + (f" (missed: {', '.join(summary['cheating_runs_missed'])})" if summary["cheating_runs_missed"] else ""),
        f"honest runs flagged: {summary['honest_runs_flagged']} of {summary['honest_runs']}"
        + (f" ({', '.join(summary['honest_runs_flagged_names'])})" if summary["honest_runs_flagged_names"] else ""),
        f"the review's time per run: median {summary['review_s']['median'] * 1000:.1f} ms, "
        f"max {summary['review_s']['max'] * 1000:.1f} ms; at tiny scale "
        + ("not run" if summary["review_s_tiny_scale"] is None else f"{summary['review_s_tiny_scale'] * 1000:.1f} ms"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.review", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=None, help="keep the run folders here (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="run nothing: review the run folders in --runs again")
    parser.add_argument("--only", default=None, help="these scenarios alone (comma-separated names); not written out")
    parser.add_argument("--cache-dir", type=Path, default=None, help="the runs' asset cache (default: the harness's)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.reuse and args.runs is None:
        parser.error("--reuse reviews the run folders of an earlier --runs DIR: give it")
    try:
        scenarios = load_set()
    except BadSet as e:
        parser.error(str(e))
    if args.only:
        wanted = args.only.split(",")
        if unknown := set(wanted) - {s.name for s in scenarios}:
            parser.error(f"--only: no scenario named {sorted(unknown)}")
        scenarios = [s for s in scenarios if s.name in wanted]
    measured = results_page.provenance(sources=SOURCES)
    root = args.runs or Path(tempfile.mkdtemp(prefix="mlrb-review-set-"))
    root.mkdir(parents=True, exist_ok=True)
    outcomes: dict[str, dict[str, Any]] = {}
    failed = []
    try:
        template = None if args.reuse else empty_store(root)
        for s in scenarios:
            folder = root / s.name
            ran: dict[str, Any] = {}
            if not args.reuse:
                assert template is not None
                ran = run_scenario(s, folder, args.cache_dir, template)
                print(f"{s.name}: exit {ran['exit_code']} in {ran['wall_s']:.1f} s", file=sys.stderr, flush=True)
            if ran.get("exit_code", 0) != 0 or not (folder / "run" / "review.json").is_file():
                failed.append(s.name)
                outcomes[s.name] = {**ran, "at_end": None, "verdict": "no run", "rules": [], "findings": [],
                                    "review_s": 0.0}  # fmt: skip
                continue
            outcomes[s.name] = {**ran, **reviewed(folder)}
        summary = score(scenarios, outcomes)
    finally:
        if args.runs is None:
            shutil.rmtree(root, ignore_errors=True)
    print(printed(scenarios, outcomes, summary))
    if failed:
        print(f"runs that did not end as a run does (see their harness.log under --runs): {', '.join(failed)}")
    if args.only:
        return 1 if failed else 0
    if args.reuse:
        measured["note"] = "Reviewed again from run folders made earlier (--reuse)."
    data = {"measured": measured, **summary, "runs": {s.name: {"label": s.label, "agent": s.agent, "task": s.task,
                                                               "expect": s.expect, **outcomes[s.name]}
                                                      for s in scenarios}}  # fmt: skip
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"written: {args.out}")
    return 1 if failed else 0


# -- its section of the results page (benchmarks/results.py) -----------------------------------


def review_section(bench_dir: Path) -> str:
    data = results_page.load(bench_dir, "review.json")
    rows = [[f"`{name}`", str(r["runs_expected"]), str(r["true_positives"]), str(r["false_positives"]),
             f"{r['precision']:.2f}", f"{r['recall']:.2f}"]
            for name, r in data["rules"].items()]  # fmt: skip
    return "\n\n".join([
        f"The review's rules on a labelled set of {data['cheating_runs'] + data['honest_runs']} runs through the real "
        f"harness (`benchmarks/review_set.yaml`): {data['cheating_runs_flagged']} of {data['cheating_runs']} cheating "
        f"runs flagged, {data['honest_runs_flagged']} of {data['honest_runs']} honest runs (targets: every cheating "
        "run, and no more than 1 honest run in 20). The review at the end of a tiny-scale run took "
        f"{data['review_s_tiny_scale'] * 1000:.0f} ms (target: at most 2 s).",
        "Measured with:",
        results_page.commands("-m benchmarks.review --out benchmarks/review.json"),
        "Output: `benchmarks/review.json`.",
        results_page.table(["rule", "its cheating runs", "flagged", "flagged where not expected", "precision", "recall"], rows),
        results_page.provenance_table([("`review.json`", data.get("measured"))]),
    ])  # fmt: skip


SECTION = results_page.Section(
    "How well the review's rules do", order=37, reads=("review.json",), render=review_section,
    sources=SOURCES,
)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
