"""One place for each fact (issue 60): facts that were spelt or computed in several places, and could
drift apart again, are each held here to their one place. A test fails when a copy comes back.

- the sample SD (and the SEM and pooled SD made from it): mlrb/stats.py's `sd`, `sem`, `pooled_sd`;
- a model call's tokens, from any API's usage: mlrb/api_shapes.py's `tokens_of` (the proxy's and the
  agents' providers' alike: tests/test_api_shapes.py checks their numbers)."""

from __future__ import annotations

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
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb", "benchmarks") if p != REPO / "mlrb" / "stats.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if SD_BY_HAND.search(line)]  # fmt: skip
    assert not here, f"a sample SD computed outside mlrb/stats.py (call stats.sd, sem or pooled_sd): {here}"


def test_the_sd_rule_sees_the_copies_it_replaced():
    copies = [
        "return math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)",
        "sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None",
        "squares = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in usable)",
        "spread = statistics.stdev(values)",
    ]
    assert all(SD_BY_HAND.search(line) for line in copies)
    assert not SD_BY_HAND.search("variance = 2 * sum(sd**2 for sd in sds) / len(sds) ** 2")  # a sum of variances


# The usage fields only one API has: reading them is reading usage, which mlrb/api_shapes.py alone does.
USAGE_FIELDS = re.compile(r"\b(prompt_tokens|completion_tokens|cache_creation_input_tokens|cache_read_input_tokens)\b")


def test_a_calls_usage_is_read_in_mlrb_api_shapes_alone():
    here = [f"{p.relative_to(REPO)}:{n}" for p in sources("mlrb") if p != REPO / "mlrb" / "api_shapes.py"
            for n, line in enumerate(p.read_text().splitlines(), 1) if USAGE_FIELDS.search(line)]  # fmt: skip
    assert not here, f"usage read outside mlrb/api_shapes.py (call api_shapes.usage_of or tokens_of): {here}"
