"""The benchmarks' figures on the site, each with whether it is still current, computed at build time.

A page shows a page of figures with a snippet line, as it would include the file itself:

    --8<-- "benchmarks/RESULTS.md"

(docs/results.md; docs/development.md shows benchmarks/SUITE.md). This hook (mkdocs.yml's
`hooks`) writes in its place what benchmarks/results.py renders from the committed JSON, the
same sections as that file, with two differences: each figure's provenance says whether the
sources its figures depend on have changed since it was measured ("Stale: measured on code
that has changed since (FILES)"), or that its JSON recorded none ("Sources not recorded"),
which depends on the code being built and so cannot be in the committed file; and the
sections' headings go one level under the heading above the snippet line, so that the page
has one title and its table of contents lists them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

INCLUDE = re.compile(r'^--8<-- "benchmarks/(\w+\.md)"\s*$', re.M)
HEADING = re.compile(r"^(#+) ", re.M)


def figures(root: Path, name: str, level: int) -> str:
    """The page of figures in benchmarks/NAME, marked, its headings under a heading of LEVEL."""
    if str(root) not in sys.path:  # benchmarks/ is the repository's package, not an installed one
        sys.path.insert(0, str(root))
    from benchmarks import results

    pages = {file: page for page, (file, _) in results.PAGES.items()}
    if name not in pages:
        raise ValueError(f'--8<-- "benchmarks/{name}": not a page of figures; those are {", ".join(pages)}')
    text = results.render(results.HERE, pages[name], marked=True, title=False)
    return shift(text, level - 2)


def shift(markdown: str, by: int) -> str:
    """Each heading outside code blocks BY levels deeper."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and HEADING.match(line):
            line = "#" * by + line
        out.append(line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = Path(config.config_file_path).resolve().parent

    def replace(match: re.Match) -> str:
        above = [m for m in HEADING.finditer(markdown[: match.start()]) if not inside_fence(markdown, m.start())]
        level = len(above[-1].group(1)) if above else 1
        return figures(root, match.group(1), level + 1)

    return INCLUDE.sub(replace, markdown)


def inside_fence(markdown: str, at: int) -> bool:
    return markdown[:at].count("\n```") % 2 == 1
