"""benchmarks/RESULTS.md and SUITE.md are written by benchmarks/results.py from the committed JSON files,
never by hand; every JSON a benchmark writes there has its section, declared in that benchmark's own
script; the scripts import one another through the package, never through sys.path; the scripts'
writers give the shape the pages are rendered from; each figure's provenance records its sources,
and the docs' rendering marks a figure whose sources have changed since, or were not recorded."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pkgutil
import shutil
from pathlib import Path

import pytest

from benchmarks import overhead, results, sweep_scaling

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def test_the_pages_are_what_the_scripts_write_from_the_committed_json():
    for page, (name, _) in results.PAGES.items():
        assert (BENCH / name).read_text() == results.render(BENCH, page), "run python -m benchmarks.results"


def test_every_benchmark_json_has_a_section():
    covered = [name for section in results.sections() for name in section.reads]
    committed = sorted(path.name for path in BENCH.glob("*.json"))
    assert sorted(covered) == committed  # a new JSON needs a section; a section, its committed JSON
    page = results.render(BENCH) + results.render(BENCH, "suite")
    for name in covered:
        assert f"`benchmarks/{name}`" in page, name
    # the scripts' own default outputs are among them
    for script, name in (("overhead", "overhead.json"), ("sweep_scaling", "sweep_scaling.json")):
        assert f'"benchmarks" / "{name}"' in (BENCH / f"{script}.py").read_text(), script


def test_each_script_declares_its_own_section():
    """A section is declared in its benchmark's script, as its `SECTION`, beside the function that
    writes it, and reads first the JSON named after that script: results.py declares none, so a new
    benchmark touches one file."""
    modules = [importlib.import_module(f"benchmarks.{found.name}") for found in pkgutil.iter_modules([str(BENCH)])]
    declared = {module.__name__: module.SECTION for module in modules if hasattr(module, "SECTION")}
    assert "benchmarks.results" not in declared and len(declared) >= 7
    for name, section in declared.items():
        assert section.render.__module__ == name, f"{name}'s section is written in {section.render.__module__}"
        assert section.reads[0] == f"{name.removeprefix('benchmarks.')}.json", name
    assert results.sections() == sorted(declared.values(), key=lambda section: section.order)
    assert len({section.order for section in declared.values()}) == len(declared)  # one place each on the page
    for path in BENCH.glob("*.py"):  # a Section made anywhere but as a script's SECTION is one found nowhere
        tree = ast.parse(path.read_text())
        made = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and "Section" in ast.unparse(node.func)]
        as_section = [node.value for node in tree.body if isinstance(node, ast.Assign)
                      and [ast.unparse(target) for target in node.targets] == ["SECTION"]]  # fmt: skip
        assert made == as_section, f"{path.name}: a Section made other than as its SECTION"


def path_tricks(source: str, siblings: set[str]) -> list[int]:
    """The lines where SOURCE uses sys.path, loads a module from its file's path, or imports one of
    SIBLINGS by its bare name (which works only with benchmarks/ itself on sys.path)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in (
            "sys.path",
            "importlib.util.spec_from_file_location",
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.Import) and any(alias.name.split(".")[0] in siblings for alias in node.names):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in siblings:
            found.append(node.lineno)
    return sorted(found)


def test_the_scripts_import_the_package_and_leave_sys_path_alone():
    siblings = {path.stem for path in BENCH.glob("*.py")}
    tricks = {path.name: lines for path in BENCH.glob("*.py") if (lines := path_tricks(path.read_text(), siblings))}
    assert not tricks, f"import through the package (`from benchmarks import results`), not sys.path: {tricks}"


def test_the_sys_path_rule_sees_what_it_replaced():
    replaced = (
        'sys.path.insert(0, str(REPO / "tests"))  # the scripted upstream\n'
        "import results as results_page  # beside this file\n"
        "from calibration import TASKS, load_task  # beside this file\n"
        'spec = importlib.util.spec_from_file_location(f"benchmark_{name}", HERE / f"{name}.py")\n'
    )
    assert path_tricks(replaced, {"results", "calibration"}) == [1, 2, 3, 4]
    assert path_tricks("from benchmarks import results\nfrom tests.fake_llm_server import reply\n", {"results"}) == []


def test_the_page_is_plain_markdown():
    page = results.render(BENCH)
    assert "<!--" not in page and "](" not in page  # no HTML comments, no relative links
    assert page.startswith("# Benchmark results\n\n*Generated by `benchmarks/results.py`")
    assert "Stale" not in page and "Sources not recorded" not in page  # the docs build marks them, not the file


def test_the_results_page_shows_the_benchmark_and_development_the_suite():
    """The Results page opens on the tasks' anchors and holds the benchmark's figures and what a lab's store and
    sweep cost at paper scale, a day of paper-scale work and how well the review's rules do; the harness's own per run (a run's overhead, sweep scaling, the proxy's cost) and
    the suite's and builds' timings are Development's."""
    benchmark, suite = results.sections("results"), results.sections("suite")
    assert benchmark[0].reads[0] == "calibration.json"
    assert {s.reads[0] for s in benchmark} == {
        "calibration.json", "machine_spread.json", "lineage_shares.json", "store_load.json", "paper_load.json",
        "review.json",
    }  # fmt: skip
    assert {s.reads[0] for s in suite} == {
        "suite_time.json",
        "build_times.json",
        "overhead.json",
        "sweep_scaling.json",
        "proxy.json",
    }
    assert {s.page for s in results.sections()} == set(results.PAGES)


def test_the_results_page_keeps_commits_and_notes_in_its_provenance_tables():
    """Every measurement of the Results page's JSON files has its row in a provenance table (what it
    measured, date, machine, commit, command and note); the prose outside tables and code names no commit."""
    import re

    page = results.render(BENCH)
    rows = [line for line in page.splitlines() if line.startswith("| `") and "commit " in line]
    for section in results.sections("results"):
        for name in section.reads:
            measured = list(results.measurements(results.load(BENCH, name)))
            if name.startswith("calibration"):  # one entry per task, a row per distinct measurement
                measured = [m for m in measured if m[1].get("commit")]
            ours = [row for row in rows if row.startswith(f"| `{name}`")]
            assert ours, name
            for _, entry in measured:
                commit = entry.get("commit")
                assert any(commit is None or f"commit {commit}" in row for row in ours), (name, commit)
                if entry.get("command"):
                    assert any(results.breakable(entry["command"]) in row for row in ours), (name, entry["command"])
    assert page.count("| figures | measured | command and note |") == len(results.sections("results"))
    prose = re.sub(r"```.*?```", "", page, flags=re.S)
    prose = "\n".join(line for line in prose.splitlines() if not line.startswith("|"))
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", prose), "a commit hash in the prose: it belongs in the table"
    assert "Commit:" not in page


def test_every_figure_names_its_script_commit_date_machine_and_command():
    """Each provenance paragraph of both pages; a JSON written before a field was recorded says
    'not recorded' rather than leaving it out."""
    for page in results.PAGES:
        text = results.render(BENCH, page)
        for paragraph in [p for p in text.split("\n\n") if "Commit:" in p]:
            for field in ("Commit:", "Date:", "Command:", "Machine:"):
                assert paragraph.count(field) == paragraph.count("Commit:"), (field, paragraph[:300])
        for section in results.sections(page):
            assert f"-m benchmarks.{section.reads[0].removesuffix('.json')}" in text, section.heading


@pytest.mark.parametrize(
    ("flags", "avx512", "said"), [("fpu avx2 fma", False, "without"), ("avx2 avx512f", True, "with")]
)
def test_a_figure_s_machine_says_whether_its_cpu_has_avx_512(flags, avx512, said, monkeypatch):
    """torch's kernels take other paths without AVX-512: other bits in a tiny build's scores, more CPU."""
    monkeypatch.setattr(results, "cpu_info", {"model name": "Some CPU", "flags": flags}.get)
    machine = results.provenance()["machine"]
    assert (machine["cpu"], machine["avx512"]) == ("Some CPU", avx512)
    assert results.machine_text(machine).startswith(f"Some CPU, {said} AVX-512, ")  # a section's paragraph
    assert f"Some CPU, {said} AVX-512, " in results.provenance_table([("figures", {"machine": machine})])  # its table
    assert results.avx512_of({"measured": {"machine": machine}}) is avx512
    assert results.avx512_of({"measured": {"machine": {"cpu": "Older"}}, "avx512": avx512}) is avx512  # said beside
    assert results.avx512_of({"measured": {"machine": {"cpu": "Older"}}}) is None


def test_each_section_names_sources_that_exist_and_each_script_records_them():
    for section in results.sections():
        assert section.sources, section.heading
        missing = [path for path in section.sources if results.digest(path) is None]
        assert not missing, (section.heading, missing)
    measured = results.provenance(sources=("mlrb/models/proxy.py", "mlrb/tasks/llm_merging"))
    assert set(measured["sources"]) == {"mlrb/models/proxy.py", "mlrb/tasks/llm_merging"}
    assert all(len(value) == 16 for value in measured["sources"].values())
    for path in BENCH.glob("*.py"):  # a script that measures records its section's sources
        if "results_page.provenance(" in (text := path.read_text()):
            assert "provenance(sources=" in text, path.name


def test_a_figure_whose_sources_changed_is_marked_stale_where_the_docs_render_it(tmp_path):
    """The docs' rendering (`marked=True`) compares each figure's recorded digests with the sources
    as they are: equal, no mark; one changed, "Stale" naming it; none recorded, "Sources not recorded"."""
    folder = bench_copy(tmp_path)
    figures = json.loads((folder / "proxy.json").read_text())
    section = next(s for s in results.sections() if s.reads[0] == "proxy.json")

    def marked() -> str:
        (folder / "proxy.json").write_text(json.dumps(figures))
        page = results.render(folder, "suite", marked=True, title=False)
        return page.split(f"## {section.heading}", 1)[1].split("\n## ", 1)[0]

    figures["measured"]["sources"] = results.digests(section.sources)
    assert "Stale" not in marked() and "Sources not recorded" not in marked()
    figures["measured"]["sources"]["mlrb/models/proxy.py"] = "0" * 16  # as if measured on other code
    assert "**Stale: measured on code that has changed since (mlrb/models/proxy.py).**" in marked()
    del figures["measured"]["sources"]
    assert "**Sources not recorded**: whether its code has changed since cannot be checked" in marked()
    assert "Stale" not in results.render(folder, "suite")  # the committed page carries no mark
    listed = "\n".join(results.marks(folder))
    assert "The metering proxy's cost / proxy.json: Sources not recorded" in listed


def bench_copy(tmp_path: Path) -> Path:
    """The committed JSON files in a folder of their own, to render the scripts' outputs beside them."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    for path in BENCH.glob("*.json"):
        shutil.copy(path, folder)
    return folder


def test_overhead_writes_its_runs_entries_and_keeps_the_others(tmp_path):
    wall = {"hfloor": [1.5, 1.6, 1.4], "sfloor": [3.3, 3.2, 3.4], "default": [8.6, 7.9, 8.8],
            "default before": [14.3, 13.7, 15.2]}  # fmt: skip
    peak = {key: [240.0, 241.0, 242.0] for key in wall}
    tree = {key: [1100.0, 1168.0, 1200.0] for key in wall}
    times = {"compose": 0.8, "sandbox_start": 0.1, "agent": 3.9, "collect": 0.3, "scoring": 1.2, "recording": 2.0}
    stages = {"default": [times] * 3, "default before": [times] * 3}
    rounds = [{"harness": 1.4, "recording": 3.2, "scorer": 4.0, "sandbox": 5.0},
              {"harness": 1.2, "recording": 3.4, "scorer": 4.4, "sandbox": 5.2},
              {"harness": 1.3, "recording": 3.3, "scorer": 4.2}]  # fmt: skip
    cpu = {"default": rounds, "default before": rounds}
    measured = results.provenance(note="a unit test's figures")
    before = {"option": "--before-python", "path": "/tmp/before-venv/bin/python", "commit": "fbf2c7c"}
    new = overhead.entries(["default"], ["", " before"], wall, peak, tree, stages, cpu, 3, measured, before)

    folder = bench_copy(tmp_path)
    overhead.write_entries(folder / "overhead.json", new)
    written = json.loads((folder / "overhead.json").read_text())
    assert written["noop"] == json.loads((BENCH / "overhead.json").read_text())["noop"]  # kept
    assert set(new) == {"default"}
    entry = written["default"]
    assert entry["measured"]["note"] == "a unit test's figures" and entry["measured"]["machine"]["cpus"]
    assert entry["rows"]["run"]["wall_s"] == {"median": 8.6, "min": 7.9, "max": 8.8}
    assert entry["per_round"]["run"]["beyond_imports_s"]["median"] == pytest.approx(3.8)  # 8.6 - 1.5 - 3.3
    assert entry["stages_s"]["run"]["agent"] == 3.9 and entry["stages_s"]["run"]["other"] == pytest.approx(0.3)
    # a role a round did not see counts 0 there; "all" is the median of the rounds' sums
    assert entry["cpu_s"]["run"] == {"harness": 1.3, "recording": 3.3, "scorer": 4.2, "sandbox": 5.0, "all": 13.6}
    assert not (folder / "RESULTS.md").exists()  # a file outside benchmarks/ leaves the page alone

    page = results.render(folder, "suite")  # the harness's own figures: the Development page
    assert "| default run, before (fbf2c7c) | 14.30 s [13.70-15.20] |" in page
    assert (
        "a unit test's figures" in page
        and "| stage | now | before (fbf2c7c) |" in page  # one row per stage: a table as narrow as the column
        and all(
            f"| {stage} | {now} |" in page
            for stage, now in [
                ("`compose`", "0.80"),
                ("`assets`", "0.00"),
                ("`sandbox_start`", "0.10"),
                ("`agent`", "3.90"),
                ("`collect`", "0.30"),
                ("`scoring`", "1.20"),
                ("`recording`", "2.00"),
                ("other", "0.30"),
                ("wall", "8.60"),
            ]
        )  # fmt: skip
    )
    assert "| now | 1.30 | 3.30 | 4.20 | 5.00 | 13.60 |" in page


def test_sweep_scaling_writes_its_figures(tmp_path):
    args = argparse.Namespace(jobs=12, slots=2, agent_seconds=10.0)
    single = {"bwrap": (15.0, 3.6, 0.2), "unconfined": (14.8, 3.5, 0.2), "docker": "DockerException: no engine"}
    measured = results.provenance()
    figures = sweep_scaling.figures(args, measured, 19.3, 97.5, single, [20.1, 19.9, 20.0])
    assert figures["ideal_s"] == 115.8 and figures["fixed_cost_s"] == 4.3 and figures["median_job_s"] == 20.0
    assert figures["sandboxes"]["docker"] == {
        "not_measured": "no usable Docker engine or image (DockerException: no engine)"
    }

    folder = bench_copy(tmp_path)
    sweep_scaling.write(folder / "sweep_scaling.json", figures)
    assert json.loads((folder / "sweep_scaling.json").read_text()) == figures
    page = results.render(folder, "suite")  # the harness's own figures: the Development page
    assert "| scaling efficiency: ideal / sweep (target >= 90%) | 119% |" in page
    assert "| `docker` | not measured: no usable Docker engine or image (DockerException: no engine) |  |  |" in page
    assert "| `bwrap` | 15.0 s | 3.6 s | 0.2 s |" in page


def test_overhead_noop_entry_renders_with_its_store_floor(tmp_path):
    wall = {"floor": [2.8, 2.7, 2.9], "store_floor": [4.1, 3.6, 4.5], "noop": [2.9, 2.8, 3.0]}
    peak = {"floor": [231.0] * 3, "store_floor": [279.0] * 3, "noop": [241.0] * 3}
    tree = {"floor": [229.0] * 3, "store_floor": [279.0] * 3, "noop": [497.0] * 3}
    stages = {"noop": [{"compose": 0.6, "agent": 0.3}] * 3}
    cpu = {"noop": [{"harness": 1.4, "recording": 3.2, "scorer": 0.2, "sandbox": 0.1}] * 3}
    new = overhead.entries(["noop"], [""], wall, peak, tree, stages, cpu, 3, results.provenance(), None)
    assert new["noop"]["per_round"]["run"]["peak_above_floor_mib"]["median"] == 10.0

    folder = bench_copy(tmp_path)
    overhead.write_entries(folder / "overhead.json", new)
    page = results.render(folder, "suite")  # the harness's own figures: the Development page
    assert (
        "| floor and the SQL store's module (`mlflow.store.tracking.sqlalchemy_store`) | 4.10 s [3.60-4.50] |" in page
    )
    assert "| no-op run, now | 2.90 s [2.80-3.00] | 1.04 x [1.03-1.04] (target <= 1.2 x); peak +10 MiB" in page


def test_the_docs_hook_renders_each_page_of_figures_under_its_page_s_title():
    """docs/hooks/figures.py puts the sections in place of the snippet line, one level under the
    heading above it (the page keeps one title, so its table of contents lists them), marked."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("figures_hook", REPO / "docs" / "hooks" / "figures.py")
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    config = SimpleNamespace(config_file_path=str(REPO / "mkdocs.yml"))
    page = hook.on_page_markdown('# Results\n\nIntro.\n\n--8<-- "benchmarks/RESULTS.md"\n', None, config, None)
    assert page.count("\n# ") == 0 and page.startswith("# Results\n")
    assert "\n## How far apart the anchors are\n" in page and "\n### Seeds of the runs, on the shipped assets\n" in page
    # calibration_assets.json's first tasks, measured before sources were recorded: under its table
    assert (
        "`calibration_assets.json`: llm_merging, llm_efficiency, edge_llm_compression, baby_lm: **Sources not recorded**"
        in page
    )
    development = hook.on_page_markdown('# Dev\n\n## Figures\n\n--8<-- "benchmarks/SUITE.md"\n', None, config, None)
    assert "\n### Test suite time\n" in development and "\n### First asset builds\n" in development
    assert "\n### Per-run overhead\n" in development and "\n### The metering proxy's cost\n" in development
    assert "Sources not recorded" in development  # proxy.json, measured before sources were recorded
    assert "## How far apart" not in development and "## Per-run overhead" not in page
