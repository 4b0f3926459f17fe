"""mlrb's imports, read from its source with ast (nothing is imported, so this takes well
under a second): they flow one way, cli -> run -> stages -> shared lower modules, with no
cycle; and the libraries they name are the ones pyproject.toml declares."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

pytestmark = pytest.mark.fast

PACKAGE = REPO / "mlrb"


def is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` runs only when the file is a script, never on import."""
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")  # fmt: skip


def module_files() -> dict[str, Path]:
    """mlrb's modules by dotted name. The tasks' starter code is the agent's, run on its own."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "starter" in path.relative_to(PACKAGE).parts:
            continue
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every module an import statement in the file names, the ones inside functions included
    (a lazy import is still a dependency): `from a import b` names both a and a.b."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    statements: list[ast.AST] = [n for n in tree.body if not is_main_guard(n)]
    for node in (child for top in statements for child in ast.walk(top)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def internal_graph() -> dict[str, set[str]]:
    """module -> the mlrb modules it imports (a name resolves to the longest module it starts with)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in imported_names(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path that ends where it starts, or [] when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return []


def test_no_import_cycle_inside_mlrb():
    graph = internal_graph()
    assert len(graph) > 50 and "mlrb.core.registry" in graph["mlrb.core.config"]  # the walk sees lazy imports too
    cycle = find_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_imports_flow_from_the_command_line_down():
    graph = internal_graph()
    importers = {target: {m for m, targets in graph.items() if target in targets} for target in graph}
    assert importers["mlrb.cli"] == {"mlrb.__main__"}  # only the entry point imports the command line
    assert importers["mlrb.run"] <= {"mlrb.cli", "mlrb.sweep"}  # the command line and the sweep launcher start runs
    lowest = ("mlrb.core.messages", "mlrb.core.retries", "mlrb.core.status")  # they import nothing of mlrb's
    assert all(not graph[m] for m in lowest), {m: graph[m] for m in lowest}
    # Tasks use scoring's helpers (lm-eval, the ScoreReport they return); scoring never reaches up into tasks,
    # nor do the stages' packages into the run that drives them.
    upward = [(m, t) for m, targets in graph.items() for t in targets
              if (m.startswith("mlrb.scoring") and t.startswith("mlrb.tasks"))
              or (m.startswith(("mlrb.tasks", "mlrb.agents", "mlrb.sandbox", "mlrb.scoring")) and t in ("mlrb.run", "mlrb.sweep"))
              # a task is built and scored by the harness: it is handed what it needs of them, never imports them
              or (m.startswith("mlrb.tasks") and t in ("mlrb.harness.assets", "mlrb.scoring.runner", "mlrb.harness.plan"))]  # fmt: skip
    assert not upward, upward


# mlrb's layers, from the top: a module imports its own part's modules or a lower layer's, never
# a higher one's nor another part of its own layer (a sideways import). The package's top holds
# the commands; each folder below it is a part. A module is in the part of the longest name here
# that it is or starts with.
LAYERS = [
    # the command lines
    ("mlrb.__main__", "mlrb.report.__main__", "mlrb.review.__main__"),
    ("mlrb.cli",),
    # the commands: a sweep of runs, a run, and what reads them back or puts them elsewhere
    ("mlrb.sweep",),
    ("mlrb.run",),
    ("mlrb.compare", "mlrb.rescore", "mlrb.sweep_summary"),  # each reads runs through the report's parts
    ("mlrb.report",),
    ("mlrb.review",),  # the review's rules and judge, whose findings the report shows
    ("mlrb.sync", "mlrb.prefetch", "mlrb.tracking", "mlrb.export", "mlrb.preflight"),
    # what a run is made of: the harness drives the agent, which acts in a sandbox, on a task,
    # which a scorer scores in a sandbox; the run folder's files are below them all
    ("mlrb.harness",),
    ("mlrb.agents",),
    ("mlrb.formats",),
    ("mlrb.tasks",),
    ("mlrb.task_kit",),  # what tasks are built with: the hub, tiny models, the warm python, the code digest
    ("mlrb.scoring",),
    ("mlrb.sandbox",),
    ("mlrb.run_files",),
    # the store and its record; the numbers made from runs
    ("mlrb.store", "mlrb.analysis"),
    # a model call, end to end: providers, prices, the metering proxy and its charging
    ("mlrb.models",),
    # what every layer shares
    ("mlrb.core",),
    ("mlrb",),
]  # fmt: skip


def part_of(module: str) -> tuple[int, str]:
    """The layer (its index in LAYERS) and part (the name there) of the longest name in LAYERS that
    `module` is or starts with; (-1, "") for none."""
    found = [(len(name), i, name) for i, names in enumerate(LAYERS) for name in names
             if module == name or module.startswith(name + ".")]  # fmt: skip
    return max(found)[1:] if found else (-1, "")


def layer_of(module: str) -> int:
    return part_of(module)[0]


def against_the_layers(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that climb a layer, or go sideways to another part of the same layer."""
    found = []
    for module, targets in graph.items():
        (layer, part) = part_of(module)
        for target in targets:
            (target_layer, target_part) = part_of(target)
            if target_layer < layer or (target_layer == layer and target_part != part):
                found.append((module, target))
    return sorted(found)


def test_every_module_imports_only_its_own_part_or_a_lower_layer():
    graph = internal_graph()
    unplaced = sorted(m for m in graph if layer_of(m) < 0)
    assert not unplaced, f"place these in LAYERS: {unplaced}"
    assert against_the_layers(graph) == []
    # The rule is checked: a module of the shared layer that imported a run's stage would be refused.
    assert (
        layer_of("mlrb.core.tags")
        > layer_of("mlrb.store.tracking")
        > layer_of("mlrb.harness.assets")
        > layer_of("mlrb.run")
        > layer_of("mlrb.cli")
    )
    assert layer_of("mlrb.store.tracing") == layer_of("mlrb.analysis.stats") > layer_of("mlrb.agents.llm")
    assert layer_of("mlrb.core.budget") > layer_of("mlrb.models.proxy") > layer_of("mlrb.store.tracking")
    assert against_the_layers({"mlrb.tasks.folder.task": {"mlrb.harness.environments"}}) != []  # up
    assert against_the_layers({"mlrb.compare": {"mlrb.sweep_summary"}}) != []  # sideways
    assert against_the_layers({"mlrb.report.__main__": {"mlrb.review.__main__"}}) != []  # sideways, at the top
    assert against_the_layers({"mlrb.tasks.base": {"mlrb.tasks.judge", "mlrb.scoring.report"}}) == []


def test_no_module_of_the_harness_imports_a_task_of_its_own():
    """The harness drives any task through `Task` (mlrb/tasks/base.py); no task's own package is named."""
    graph = internal_graph()
    packages = {p.name for p in (PACKAGE / "tasks").iterdir() if (p / "__init__.py").is_file()}
    named = sorted((m, t) for m, targets in graph.items() if m.startswith("mlrb.harness") for t in targets
                   if t.startswith("mlrb.tasks.") and t.split(".")[2] in packages)  # fmt: skip
    assert not named, named


def test_the_models_layer_imports_only_itself_and_core():
    """A model call is owned end to end by mlrb/models/: it is used by the agents, the harness, the
    sandboxes and the review, and imports nothing of theirs (nor of the store's), only mlrb.core."""
    graph = internal_graph()
    models = {m for m in graph if m.startswith("mlrb.models.")}
    assert {"mlrb.models.proxy", "mlrb.models.prices", "mlrb.models.providers", "mlrb.models.metering"} <= models
    outside = sorted((m, t) for m in models for t in graph[m]
                     if not t.startswith(("mlrb.models", "mlrb.core")) and t != "mlrb")  # fmt: skip
    assert not outside, outside
    # and nothing of a model call is left beside the layer: no module outside it forwards or prices a call
    assert not [m for m in graph if m.rsplit(".", 1)[-1] in ("proxy", "prices", "providers", "metering")
                and not m.startswith("mlrb.models.")]  # fmt: skip


def package_folders() -> list[Path]:
    """mlrb's folders that are Python packages (the tasks' own folders and the starter code aside)."""
    return sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def test_the_package_s_top_holds_the_commands_and_each_folder_is_a_layer():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    commands = {name.removeprefix("mlrb.") for layer in LAYERS[: LAYERS.index(("mlrb.harness",))] for name in layer}
    assert set(top) <= commands, f"a module at mlrb's top that is not a command: {sorted(set(top) - commands)}"
    named = {name for layer in LAYERS for name in layer}
    for folder in package_folders():
        module = f"mlrb.{folder.name}"
        assert module in named, f"{module} is in no layer of LAYERS: place the folder in one"
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert docstring and len(docstring) > 60, f"{module}/__init__.py: say what the folder holds"
    # the layers' own folders say what they may import
    for folder in ("core", "models", "analysis", "store", "harness", "run_files"):
        assert "import" in (ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or "").lower()


def test_no_module_docstring_cites_an_issue_instead_of_saying_what_holds():
    cites = [str(path.relative_to(REPO)) for path in module_files().values()
             if re.search(r"\bissues? \d+", ast.get_docstring(ast.parse(path.read_text())) or "", re.I)]  # fmt: skip
    assert not cites, cites


# hydra_plugins is a namespace package that mlrb (launchers/hydra_plugins) shares with the plugins it uses.
NAMESPACE = "hydra_plugins"


def distribution_of(module: str, installed: dict[str, list[str]]) -> set[str] | None:
    """The installed distributions that can provide the module (canonical names), or None for
    mlrb's own Hydra launcher plugin."""
    top, _, rest = module.partition(".")
    if top == NAMESPACE:
        plugin = rest.partition(".")[0]
        return None if (REPO / "launchers" / NAMESPACE / plugin).exists() else {canonicalize_name(plugin)}
    return {canonicalize_name(d) for d in installed.get(top, [])} - {"mlrb"}


def third_party_imports() -> dict[str, Path]:
    """Every library module mlrb's code imports (the tasks' starter code too: it runs on the
    same environment), with one file that imports it."""
    found: dict[str, Path] = {}
    for folder in (PACKAGE, REPO / "launchers"):
        for path in sorted(folder.rglob("*.py")):
            for name in imported_names("mlrb._", path):
                top = name.partition(".")[0]
                if top and top not in sys.stdlib_module_names and top not in ("mlrb", "__future__"):
                    found.setdefault(name if top == NAMESPACE else top, path.relative_to(REPO))
    return found


def test_only_a_task_reads_its_own_config():
    """Outside mlrb/tasks/, modules take what they need of a task through its interface
    (Task.scale, .rules, .hardware, .scorer_config()...), never its config (task.cfg, task.spec)."""
    import re

    reads = re.compile(r"\btask\.(cfg|spec)\b")
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for name, path in module_files().items() if not name.startswith("mlrb.tasks.")
             for number, line in enumerate(path.read_text().splitlines(), 1) if reads.search(line)]  # fmt: skip
    assert not found, found
    assert reads.search("ctx.task.spec.baseline_command")  # (the pattern sees an attribute chain's reads)


def test_the_libraries_imported_are_the_ones_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # An extra other than the test tools is a library that one of mlrb's commands imports (say, the export's).
    extras = [r for name, group in project.get("optional-dependencies", {}).items() if name != "dev" for r in group]
    declared = {canonicalize_name(Requirement(r).name) for r in project["dependencies"] + extras}
    imports = third_party_imports()
    assert {"torch", "datasets", "hydra_plugins.hydra_submitit_launcher.submitit_launcher"} <= set(imports)
    installed = packages_distributions()  # import name -> distributions, read once (it scans them all)
    used: set[str] = set()
    undeclared = []
    for module, where in sorted(imports.items()):
        providers = distribution_of(module, installed)
        if providers is None:
            continue
        if not providers:
            undeclared.append(f"{module} ({where}; no installed distribution provides it)")
        elif not providers & declared:
            undeclared.append(f"{module} ({where}; from {', '.join(sorted(providers))})")
        used |= providers & declared
    assert not undeclared, "imported but not in pyproject.toml's dependencies: " + "; ".join(undeclared)
    assert not declared - used, f"declared in pyproject.toml but imported nowhere: {sorted(declared - used)}"


def test_a_test_without_a_tier_marker_fails_collection(tmp_path):
    """tests/conftest.py refuses to collect a test that has no tier marker, or two; a marked one passes."""
    (tmp_path / "test_tiers.py").write_text(
        "import pytest\n\n"
        "def test_unmarked():\n    pass\n\n"
        "@pytest.mark.fast\n@pytest.mark.system\ndef test_two_tiers():\n    pass\n\n"
        "@pytest.mark.fast\ndef test_marked():\n    pass\n"
    )
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "conftest", "-p", "no:cacheprovider",
               "-m", "fast", "--rootdir", str(tmp_path), "-c", str(REPO / "pyproject.toml"), str(tmp_path)]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "tests")}
    )
    assert result.returncode != 0
    assert "test_tiers.py::test_unmarked: no tier marker" in result.stderr + result.stdout
    assert "test_tiers.py::test_two_tiers: tiers fast and system" in result.stderr + result.stdout
    assert "test_marked:" not in result.stderr + result.stdout


def test_only_the_store_talks_to_mlflow():
    """One gateway to the store: mlrb/store/ imports MLflow; every other module asks it
    (store/tracking.py's clients, finders and writers), so the store's rules live in one place."""
    found = {name: path for name, path in module_files().items()
             if any(target == "mlflow" or target.startswith("mlflow.") for target in imported_names(name, path))}  # fmt: skip
    outside = sorted(str(path.relative_to(REPO)) for name, path in found.items() if not name.startswith("mlrb.store"))
    assert found and not outside, f"MLflow imported outside mlrb/store/: {outside}"
