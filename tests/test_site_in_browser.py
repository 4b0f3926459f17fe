"""The docs site as a reader sees it: built strictly, served over HTTP, and every page opened in
Debian's headless Chromium (driven by Selenium, as tests/test_mlflow_ui.py does). A page fails on
a link to a page or a heading that is not there, an image that does not load, or an empty table
of contents where the page has sections. mkdocs --strict checks the links it can see in the
Markdown; this checks what the browser gets, generated pages and tables included."""

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
