"""The review page (docs/review.md) lists every rule the review runs, from the rules themselves: the
docs hook (docs/hooks/review.py) writes its table at build time, so a rule added is on the page."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO
from mlrb.review.rules import RULES

pytestmark = pytest.mark.fast


def hook():
    spec = importlib.util.spec_from_file_location("review_hook", REPO / "docs" / "hooks" / "review.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Page:
    class file:  # noqa: N801 - as mkdocs's page.file
        src_uri = "review.md"


def test_the_review_page_has_a_row_for_every_rule_with_its_verdict_and_reason():
    review_hook = hook()
    built = review_hook.on_page_markdown((REPO / "docs" / "review.md").read_text(), Page, None, None)
    assert review_hook.MARKER not in built
    rows = [line for line in built.splitlines() if line.startswith("| `")]
    assert rows == [f"| `{r.name}` | {r.severity} | {r.reason} |" for r in RULES]
    assert len(RULES) >= 12 and {r.severity for r in RULES} == {"suspicious", "tampering"}


def test_a_page_that_lost_the_table_s_place_fails_the_build():
    from mkdocs.exceptions import PluginError

    review_hook = hook()
    with pytest.raises(PluginError, match="where the table of rules goes"):
        review_hook.on_page_markdown("# How runs are reviewed\n", Page, None, None)
