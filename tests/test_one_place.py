"""One place for each fact (issue 60): facts that were spelt or computed in several places, and could
drift apart again, are each held here to their one place. A test fails when a copy comes back.

- the sample SD (and the SEM and pooled SD made from it): mlrb/analysis/stats.py's `sd`, `sem`, `pooled_sd`;
- a model call's tokens, from any API's usage: mlrb/models/api_shapes.py's `tokens_of` (the proxy's and the
  agents' providers' alike: tests/test_api_shapes.py checks their numbers);
- the names of the metrics the harness logs and reads back: mlrb/core/tags.py's `Metric`, as tags are `Tag`;
- the tracking store's URI (tracking.uri, else $MLFLOW_TRACKING_URI): mlrb/core/config.py's `TrackingConfig.named_uri`;
- a URI's credentials, masked: mlrb/core/messages.py's `mask_uri` and `mask_uris_in`;
- the words of an error that say the store could not be reached: mlrb/store/tracking.py's `UNREACHABLE_SIGNS`;
- how long mlrb waits before trying again: mlrb/core/retries.py's `Backoff` (the agent's retries and the
  metering proxy's alike)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def sources(*folders: str) -> list[Path]:
    """The Python files of these folders, without the tasks' starter code (the agent's, not the harness's)."""
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "starter" not in p.parts)


# A sum of squared deviations from a mean, as `(v - m) ** 2 for v in values`, or a library's SD.
SD_BY_HAND = re.compile(r"\(\s*\w+\s*-[^()]*(\([^()]*\)[^()]*)*\)\s*\*\*\s*2\s+for\b|\bstatistics\.(p?stdev|p?variance)\b"
                        r"|\bddof\b|\.std\(|\bnp\.var\(")  # fmt: skip


def test_the_sample_sd_is_computed_in_mlrb_stats_alone():
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb", "benchmarks") if p != REPO / "mlrb" / "analysis" / "stats.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if SD_BY_HAND.search(line)]  # fmt: skip
    assert not here, f"a sample SD computed outside mlrb/analysis/stats.py (call stats.sd, sem or pooled_sd): {here}"


def test_the_sd_rule_sees_the_copies_it_replaced():
    copies = [
        "return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)",
        "sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None",
        "squares = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in usable)",
        "spread = statistics.stdev(values)",
    ]
    assert all(SD_BY_HAND.search(line) for line in copies)
    assert not SD_BY_HAND.search("variance = 2 * sum(sd**2 for sd in sds) / len(sds) ** 2")  # a sum of variances


# The usage fields only one API has: reading them is reading usage, which mlrb/models/api_shapes.py alone does.
USAGE_FIELDS = re.compile(r"\b(prompt_tokens|completion_tokens|cache_creation_input_tokens|cache_read_input_tokens)\b")


def test_a_calls_usage_is_read_in_mlrb_models_api_shapes_alone():
    # ATIF's own metrics bear two of these names: mlrb/formats/atif.py writes them, reading none.
    exempt = (REPO / "mlrb" / "models" / "api_shapes.py", REPO / "mlrb" / "formats" / "atif.py")
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb") if p not in exempt
            for n, line in enumerate(p.read_text().splitlines(), 1) if USAGE_FIELDS.search(line)]  # fmt: skip
    assert not here, f"usage read outside mlrb/models/api_shapes.py (call api_shapes.usage_of or tokens_of): {here}"


# A pause that doubles with each try, computed by hand: `base * 2 ** (attempt - 1)`.
BACKOFF_BY_HAND = re.compile(r"\*\s*2(\.0)?\s*\*\*\s*\(?\s*(min\()?\s*(attempt|retry|retries|tries|try_)\w*\b")


def test_retry_pauses_are_computed_in_mlrb_core_retries_alone():
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb") if p != REPO / "mlrb" / "core" / "retries.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if BACKOFF_BY_HAND.search(line)]  # fmt: skip
    assert not here, f"a retry's pause computed outside mlrb/core/retries.py (use its Backoff): {here}"
    # the rule sees the copy it replaced, and the one place itself
    assert BACKOFF_BY_HAND.search("return min(self.retry_base_delay_s * 2 ** (attempt - 1), self.retry_max_delay_s)")
    assert BACKOFF_BY_HAND.search((REPO / "mlrb" / "core" / "retries.py").read_text())


def test_the_metering_proxy_waits_on_the_one_retry_schedule():
    """Its pauses between upstream tries are Backoff's, but for a Retry-After the upstream sent (capped)."""
    from mlrb.core.retries import Backoff
    from mlrb.models.proxy import MeteringProxy

    with MeteringProxy({}, "token", None, max_retries=4, retry_base_delay_s=0.5, retry_max_delay_s=3.0) as proxy:
        pauses = [proxy.pause_s(n, None) for n in range(1, 6)]
        assert pauses == [Backoff(4, 0.5, 3.0).pause_s(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
        assert (proxy.pause_s(1, "7"), proxy.pause_s(4, "0.1"), proxy.pause_s(2, "soon")) == (3.0, 0.1, 1.0)


# Where a string is a metric's name: an argument of these calls, a key of a dict handed to them, or a key
# looked up in (or written to) a mapping whose name says it holds metrics (or the anchors, which are
# logged by the same names), a function's `metrics` included.
METRIC_CALLS = {"metric", "log_metric", "log_metrics", "get_metric_history", "log"}
METRIC_HOLDERS = ("metric", "spent", "summary", "calibration", "anchors", "totals", "pending")


def named(node: ast.AST) -> str:
    """The name an expression is known by: `x`, `a.b.x`, `x(...)` -> "x"."""
    while isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def holds_metrics(node: ast.AST) -> bool:
    return any(word in named(node).lower() for word in METRIC_HOLDERS)


def metric_positions(tree: ast.AST) -> list[ast.AST]:
    """The expressions of a module that stand for metric names (whatever they are written as)."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and named(node.func) in METRIC_CALLS:
            found += node.args
            found += [key for arg in node.args if isinstance(arg, ast.Dict) for key in arg.keys if key]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and holds_metrics(node.func.value)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
        ):
            found.append(node.args[0])
        elif isinstance(node, ast.Subscript) and holds_metrics(node.value):
            found.append(node.slice)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            if any(holds_metrics(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                found += [key for key in node.value.keys if key]
        elif isinstance(node, ast.FunctionDef) and any(word in node.name for word in METRIC_HOLDERS + ("summarise",)):
            found += [key for d in ast.walk(node) if isinstance(d, ast.Dict) for key in d.keys if key]
            found += [d.key for d in ast.walk(node) if isinstance(d, ast.DictComp)]
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            found.append(node.iter)  # kept only where the loop's name is itself used as a metric's (below)
    return found


def bare_metric_names(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text())
    positions = metric_positions(tree)
    loops = {id(node.iter): node.target.id for node in ast.walk(tree)
             if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name)}  # fmt: skip
    used = {p.id for p in positions if isinstance(p, ast.Name)}
    found = []
    for position in positions:
        if id(position) in loops and loops[id(position)] not in used:
            continue  # a loop whose name is not a metric's
        for node in ast.walk(position):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in names or node.value.startswith(tuple(n for n in names if n.endswith("."))):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    return found


def metric_names() -> set[str]:
    from mlrb.core.tags import Metric

    values = [v for k, v in vars(Metric).items() if k.isupper()]
    return {v for v in values if isinstance(v, str)}


def test_metric_names_are_spelt_in_mlrb_tags_alone():
    names = metric_names()
    bare = [
        hit for p in sources("mlrb") if p != REPO / "mlrb" / "core" / "tags.py" for hit in bare_metric_names(p, names)
    ]
    assert not bare, f"a metric's name written out where mlrb.core.tags.Metric names it: {bare}"


def test_the_metric_rule_sees_the_bare_names_it_replaced(tmp_path):
    before = tmp_path / "before.py"
    before.write_text("""
def summarise(report, calibration, spent, rows):
    metrics = {"valid": 1.0}
    metrics["score"] = report.score
    baseline = calibration.get("baseline_score")
    recorder.log_metrics({**spent, "wall_time_s": 1.0, "llm.cost_usd": 2.0})
    kept = {k: spent[k] for k in ("steps", "cost_usd")}
    costs = [r.metric("cost_usd") for r in rows]
    shown = {name: r.metric(name) for name in ("reference_score", "output_tokens")}
    return {"counted_score": 1.0, "stage_time_s.agent": 2.0}


def metrics(times):
    values = {"counted_normalised_score": 1.0}
    return {f"stage_time_s.{stage}": s for stage, s in times.items()}
""")
    tmp_path.joinpath("mlrb").mkdir()
    found = {hit.split(": ", 1)[1].strip("'") for hit in bare_metric_names_at(before)}
    assert found == {"valid", "score", "baseline_score", "wall_time_s", "llm.cost_usd", "steps", "cost_usd",
                     "reference_score", "output_tokens", "counted_score", "stage_time_s.agent", "counted_normalised_score",
                     "stage_time_s."}, found  # fmt: skip


def bare_metric_names_at(path: Path) -> list[str]:
    global REPO
    saved, REPO = REPO, path.parent
    try:
        return bare_metric_names(path, metric_names())
    finally:
        REPO = saved


# Each fact's one module, and the text that works it out anew elsewhere.
ONE_PLACE = {
    "the tracking URI (TrackingConfig.named_uri)": (
        re.compile(r"(uri|cfg\.uri)\s+or\s+os\.environ|environ\.get\(\s*[\"']MLFLOW_TRACKING_URI"),
        # tracing.py reads the variable only to put back what it was after pointing MLflow's fluent API at a run
        {"mlrb/core/config.py", "mlrb/store/tracing.py"},
    ),
    "a URI's credentials masked (messages.mask_uri, mask_uris_in)": (re.compile(r"\*\*\*@"), {"mlrb/core/messages.py"}),
    "a store that cannot be reached (tracking.unreachable_sign)": (
        re.compile(r"[\"'](Connection refused|Max retries exceeded|Failed to establish a new connection)"),
        {"mlrb/store/tracking.py"},
    ),
}


@pytest.mark.parametrize("fact", sorted(ONE_PLACE))
def test_the_store_s_facts_are_worked_out_in_one_place(fact):
    pattern, homes = ONE_PLACE[fact]
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb") if str(p.relative_to(REPO)) not in homes
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]  # fmt: skip
    assert not here, f"{fact}, worked out again: {here}"


def test_the_store_rules_see_the_copies_they_replaced():
    copies = {
        "the tracking URI (TrackingConfig.named_uri)": 'uri = cfg.uri or os.environ.get("MLFLOW_TRACKING_URI")',
        "a URI's credentials masked (messages.mask_uri, mask_uris_in)": 'return re.sub(r"(//)[^/@\\s]+@", r"\\1***@", text)',
        "a store that cannot be reached (tracking.unreachable_sign)": 'NETWORK_FAILURES = ("Connection refused", "timed out")',
    }
    assert all(ONE_PLACE[fact][0].search(line) for fact, line in copies.items())
