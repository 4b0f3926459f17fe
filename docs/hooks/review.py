"""The review page's table of rules (docs/review.md), written at build time from the rules themselves
(mlrb/review/rules.py: each rule's name, severity and reason), so that a rule added or changed is on
the page without an edit. tests/test_review_page.py checks the page has the table's place."""

from __future__ import annotations

from typing import Any

from mkdocs.exceptions import PluginError

PAGE = "review.md"
MARKER = "<!-- rules: generated from mlrb/review/rules.py by docs/hooks/review.py -->"


def rules_table() -> str:
    from mlrb.review.rules import RULES

    rows = [f"| `{r.name}` | {r.severity} | {r.reason} |" for r in RULES]
    return "\n".join(["| rule | verdict it gives | what it looks for, and why |", "| --- | --- | --- |", *rows])


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} lost its line '{MARKER}', where the table of rules goes")
    return markdown.replace(MARKER, rules_table())
