"""The docs site as a reader sees it: built strictly, served over HTTP, and every page opened in
Debian's headless Chromium (driven by Selenium, as tests/test_mlflow_ui.py does). A page fails on
a link to a page or a heading that is not there, an image that does not load, or an empty table
of contents where the page has sections. mkdocs --strict checks the links it can see in the
Markdown; this checks what the browser gets, generated pages and tables included.

At a 1280 px wide window a page also fails on what a reader cannot read whole: a code line cut at
its block's edge, a table wider than the column or a cell whose text overflows it, a word broken
mid-word to fit a cell, a literal `\\|` (a bar escaped for a table, shown as typed), or no opening
sentence after its title (the first thing after the H1 must be a paragraph of a few words: what the
page lets you do)."""

from __future__ import annotations

import functools
import http.server
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO
from test_mlflow_ui import MISSING, Browser

pytestmark = [
    pytest.mark.system,
    pytest.mark.xdist_group("site_in_browser"),  # one process, so the site is built and Chromium started once
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"needs Debian's headless Chromium ({', '.join(MISSING)} missing): apt-get install chromium chromium-driver",
    ),
]

# What the page shows, read in the browser: its links (absolute, as the browser resolved them), its
# images and whether each loaded, its sections, and the links of its table of contents.
READ_PAGE = """
const article = document.querySelector('article') || document.body;
return {
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  images: Array.from(document.images).map(i => [i.currentSrc || i.src, i.complete && i.naturalWidth > 0]),
  sections: article.querySelectorAll('h2').length,
  toc: document.querySelectorAll('nav.md-nav--secondary a.md-nav__link').length,
};
"""


# What a reader cannot read whole at the window's width, each problem with the line or cell it is in.
READ_LAYOUT = """
const article = document.querySelector('article') || document.body;
const problems = [];
const short = text => text.replace(/\\s+/g, ' ').trim().slice(0, 90);
// A code block whose lines are wider than its box: the reader sees them cut (or must scroll sideways).
const ruler = document.createElement('canvas').getContext('2d');
for (const code of article.querySelectorAll('pre > code')) {
  if (code.scrollWidth <= code.clientWidth + 1) continue;
  const style = getComputedStyle(code);
  ruler.font = `${style.fontSize} ${style.fontFamily}`;
  const room = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const fit = Math.floor(room / ruler.measureText('m').width);
  const cut = code.textContent.split('\\n').filter(line => ruler.measureText(line).width > room);
  for (const line of cut.length ? cut : [code.textContent.split('\\n')[0]]) {
    problems.push(`code line cut at ${Math.round(room)} px (${fit} characters fit, it has ${line.length}): ${short(line)}`);
  }
}
// A table wider than the column (material scrolls it sideways in .md-typeset__scrollwrap), a cell whose
// content overflows it, and a word broken across lines in a cell.
for (const table of article.querySelectorAll('table')) {
  const box = table.closest('.md-typeset__scrollwrap') || table.parentElement;
  const head = short(table.rows[0] ? table.rows[0].innerText : '');
  if (table.scrollWidth > box.clientWidth + 1) {
    problems.push(`table wider than the column (${table.scrollWidth} px > ${box.clientWidth} px): | ${head} |`);
  }
  for (const cell of table.querySelectorAll('td, th')) {
    if (cell.scrollWidth > cell.clientWidth + 1) {
      problems.push(`table cell overflows (${cell.scrollWidth} px > ${cell.clientWidth} px): ${short(cell.innerText)}`);
    }
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.data.matchAll(/[A-Za-z0-9]{2,}/g)) {  // a break at . / _ : = is no break in a word
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
        if (tops.size > 1) problems.push(`word broken across lines in a table cell: ${word[0]}`);
      }
    }
  }
}
// A bar escaped for a Markdown table, shown as typed.
for (const line of article.innerText.split('\\n')) {
  if (line.includes('\\\\|')) problems.push(`literal \\\\| in: ${short(line)}`);
}
// The opening sentence: the first element after the title is a paragraph of a few words.
const title = article.querySelector('h1');
const first = title && title.nextElementSibling;
if (!title) problems.push('no title (h1)');
else if (!first || first.tagName !== 'P' || first.innerText.split(/\\s+/).length < 5) {
  problems.push(`no opening sentence after the title: the first thing is ${first ? `<${first.tagName.toLowerCase()}> ${short(first.innerText)}` : 'nothing'}`);
}
return problems;
"""
# Each of READ_LAYOUT's checks, on purpose: a page's article is replaced by this and each must be found.
BROKEN_ON_PURPOSE = """
const article = document.querySelector('article');
article.innerHTML = '<h1>Broken</h1><ul><li>a list first</li></ul>'
  + '<pre><code>' + 'python -m mlrb seed=1,2,3,4,5 '.repeat(12) + '</code></pre>'
  + '<p>a bar escaped for a table: str \\\\| None</p>'
  + '<div class="md-typeset__scrollwrap"><div class="md-typeset__table"><table><tr><th>a</th><th>b</th></tr>'
  + '<tr><td><code style="word-break: break-all">' + 'edge_llm_compression_'.repeat(4) + '</code></td>'
  + '<td style="white-space: nowrap">' + 'wide '.repeat(80) + '</td>'
  + '<td><div style="width: 40px; white-space: nowrap">a cell too narrow for its text</div></td></tr></table></div></div>';
"""
LAYOUT_CHECKS = ("code line cut", "table wider than the column", "table cell overflows", "word broken across lines",
                 "literal \\|", "no opening sentence")  # fmt: skip
WIDTH, HEIGHT = 1280, 900


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    folder = tmp_path_factory.mktemp("site")
    previous = Path.cwd()
    os.chdir(REPO)  # mkdocs.yml's snippets are relative to the working folder
    try:
        build(load_config(config_file=str(REPO / "mkdocs.yml"), site_dir=str(folder), strict=True))
    finally:
        os.chdir(previous)
    return folder


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Browser(tmp_path_factory.mktemp("chromium-profile"), tmp_path_factory.mktemp("shots"))
    # the page's width, whatever the window's frame: a laptop's browser at 1280 px
    chromium.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    yield chromium
    chromium.quit()


def pages(site: Path) -> list[str]:
    """Every page of the site, as its path under the site's root ('' is the home page)."""
    found = sorted(str(p.parent.relative_to(site)) for p in site.rglob("index.html"))
    return ["" if p == "." else p + "/" for p in found if not p.startswith(("assets", "search"))]


@functools.cache
def fetched(url: str) -> str | None:
    """The page at URL (no fragment), or None when the server has none."""
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.read().decode("utf-8", "replace")
    except urllib.error.HTTPError:
        return None


def broken(link: str, root: str) -> str | None:
    """Why an internal LINK is broken (None: it is not, or it leaves the site)."""
    if not link.startswith(root):
        return None  # another site, or a mailto: the build machine has no internet to try it
    address, _, fragment = link.partition("#")
    text = fetched(address)
    if text is None:
        return "no such page"
    if fragment and f'id="{urllib.parse.unquote(fragment)}"' not in text:
        return f"no heading #{fragment} on it"
    return None


def test_every_page_has_working_links_loaded_images_and_a_table_of_contents(site, served, browser):
    every = pages(site)
    assert len(every) >= 20 and "" in every and "reference/configs/" in every, every
    # the checks themselves can fail: a missing page and a missing heading are found
    assert broken(served + "no-such-page/", served) == "no such page"
    assert broken(served + "#no-such-heading", served) == "no heading #no-such-heading on it"
    problems, checked = [], 0
    for page in every:
        browser.go(served + page)
        browser.wait(
            f"page {page or 'home'}", lambda driver: driver.execute_script("return document.readyState") == "complete"
        )
        seen = browser.driver.execute_script(READ_PAGE)
        for link in sorted(set(seen["links"])):
            checked += link.startswith(served)
            why = broken(link, served)
            if why:
                problems.append(f"{page or 'home'}: link {link[len(served) :]}: {why}")
        problems += [f"{page or 'home'}: image {src} did not load" for src, loaded in seen["images"] if not loaded]
        if seen["sections"] >= 2 and seen["toc"] == 0:
            problems.append(f"{page or 'home'}: {seen['sections']} sections and an empty table of contents")
    assert not problems, "\n".join(problems)
    assert checked > 20 * len(every)  # every page's nav links to every page


def opened(browser, url: str, page: str) -> None:
    browser.go(url)
    browser.wait(
        f"page {page or 'home'}", lambda driver: driver.execute_script("return document.readyState") == "complete"
    )


def test_every_page_reads_whole_at_1280_px(site, served, browser):
    # the checks themselves can fail: each finds its problem on a page broken on purpose
    opened(browser, served + "troubleshooting/", "troubleshooting")
    browser.driver.execute_script(BROKEN_ON_PURPOSE)
    found = browser.driver.execute_script(READ_LAYOUT)
    for check in LAYOUT_CHECKS:
        assert any(problem.startswith(check) for problem in found), (check, found)
    assert browser.driver.execute_script("return window.innerWidth") == WIDTH
    problems = []
    for page in pages(site):
        opened(browser, served + page, page)
        problems += [f"{page or 'home'}: {problem}" for problem in browser.driver.execute_script(READ_LAYOUT)]
    assert not problems, f"{len(problems)} problems at {WIDTH} px:\n" + "\n".join(problems)
