"""Tables that fit the page's column without breaking a word in two.

Material lets code break anywhere (`word-break: break-word`), so a narrow table cell showed
`edge_llm_compres` over `sion`. Here code in a table cell breaks only where a reader would: this
hook (mkdocs.yml's `hooks`) puts a break opportunity (`<wbr>`) after each `.`, `/`, `_`, `:` and
`=` in a cell's code, and the page's style keeps code in cells from breaking anywhere else. Code
that its page keeps on one line (in a `white-space: nowrap` span, as the tasks' names) is left as
it is. tests/test_site_in_browser.py checks, at 1280 px, that no word breaks in a cell.
"""

from __future__ import annotations

import re
from typing import Any

TABLE = re.compile(r"<table>.*?</table>", re.S)
CODE = re.compile(r"(?<!nowrap\">)<code>([^<]*)</code>")
BREAK_AFTER = re.compile(r"([./_:=])(?=[^./_:=\s])")
STYLE = "<style>.md-typeset td code, .md-typeset th code { word-break: normal; overflow-wrap: normal; }</style>"


def breakable(code: re.Match[str]) -> str:
    return "<code>" + BREAK_AFTER.sub(r"\1<wbr>", code.group(1)) + "</code>"


def in_tables(html: str) -> str:
    return TABLE.sub(lambda table: CODE.sub(breakable, table.group(0)), html)


# MkDocs' events (https://www.mkdocs.org/dev-guide/plugins/#events).


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return in_tables(html)


def on_post_page(output: str, page: Any, config: Any) -> str:
    return output.replace("</head>", STYLE + "</head>", 1)
