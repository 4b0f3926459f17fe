"""Tables that fit the page's column without breaking a word in two.

Material lets code break anywhere (`word-break: break-word`), so a narrow table cell showed
`edge_llm_compres` over `sion`. Here code in a table cell breaks only where a reader would: this
hook (mkdocs.yml's `hooks`) puts a break opportunity (`<wbr>`) after each `.`, `/`, `_`, `:` and
`=` in a cell's code, and the page's style keeps code in cells from breaking anywhere else. Code
that its page keeps on one line (in a `white-space: nowrap` span, as the tasks' names) is left as
it is. tests/test_site_in_browser.py checks, at 1280 px, that no word breaks in a cell.

What a command prints (a ```text block) wraps at the column's edge rather than being cut: it is read,
not copied. A command to copy (```bash, python, yaml) is not wrapped: a long one is written on
several lines (a backslash at a line's end), which the same test checks by failing on a cut line.
"""

from __future__ import annotations

import re
from typing import Any

TABLE = re.compile(r"<table>.*?</table>", re.S)
CODE = re.compile(r"(?<!nowrap\">)<code>([^<]*)</code>")
TEXT_FENCE = re.compile(r"^(\s*)```text\s*$", re.M)  # what a command prints: marked to wrap
# A fence's words after its language (```python example=agent, which a test finds the example by) are
# no syntax Markdown knows: the fence would not open, and the page below it would read as code.
NAMED_FENCE = re.compile(r"^(\s*```\w+) [\w-]+=[\w-]+\s*$", re.M)
TEXT = re.compile(r">([^<>]+)<")
LONG_WORD = re.compile(r"[^\s<>&;]{25,}")
BREAK_AFTER = re.compile(r"([./_:=])(?=[^./_:=\s])")
STYLE = (
    "<style>"
    ".md-typeset td code, .md-typeset th code { word-break: normal; overflow-wrap: normal; }"
    ".md-typeset .output pre > code { white-space: pre-wrap; overflow-wrap: break-word; }"
    "</style>"
)


def breakable(code: re.Match[str]) -> str:
    return "<code>" + BREAK_AFTER.sub(r"\1<wbr>", code.group(1)) + "</code>"


def long_words_breakable(text: re.Match[str]) -> str:
    """A long word of a cell's text (a dataset's id, a path) breaks where its code would."""
    return ">" + LONG_WORD.sub(lambda word: BREAK_AFTER.sub(r"\1<wbr>", word.group(0)), text.group(1)) + "<"


def in_tables(html: str) -> str:
    return TABLE.sub(lambda table: TEXT.sub(long_words_breakable, CODE.sub(breakable, table.group(0))), html)


# MkDocs' events (https://www.mkdocs.org/dev-guide/plugins/#events).


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return TEXT_FENCE.sub(r"\1``` {.text .output}", NAMED_FENCE.sub(r"\1", markdown))


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return in_tables(html)


def on_post_page(output: str, page: Any, config: Any) -> str:
    return output.replace("</head>", STYLE + "</head>", 1)
