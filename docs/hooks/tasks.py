"""The site's task pages, found the way the code finds tasks: by their folders.

A task is a folder (mlrb/registry.py, `task_folders`) and its page is the folder's `page.md`;
a folder with a page but no `task.yaml` is a page several tasks share (mlrb/tasks/from_scratch/).
This MkDocs hook (mkdocs.yml's `hooks`) adds each page to the site as tasks/FOLDER.md, lists
it in the nav's "Tasks" section after tasks/index.md, and writes the index's table of tasks
where its marker line is: a new task folder with a page needs no other edit.
tests/test_documented_commands.py reads the pages through `task_pages` too.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from mlrb import registry

PAGE = "page.md"
NAV_SECTION = "Tasks"
INDEX = "tasks/index.md"
TABLE_MARKER = "<!-- tasks: generated from mlrb/tasks/*/task.yaml by docs/hooks/tasks.py -->"


class TaskPage(NamedTuple):
    title: str  # in the nav: the task's name, or a shared page's heading
    site_path: str  # where the site has it, relative to docs/
    source: Path  # the file it is read from
    competition: str | None  # the task.yaml's `title`; None for a shared page, which is no task


def task_pages() -> list[TaskPage]:
    """Every task that has a page, by name, then the pages tasks share, by folder name."""
    folders = registry.task_folders()
    pages = []
    for name, (_, folder) in sorted(folders.items()):
        if (folder / PAGE).is_file():
            config = yaml.safe_load((folder / registry.TASK_CONFIG).read_text()) or {}
            pages.append(TaskPage(name, f"tasks/{name}.md", folder / PAGE, str(config.get("title", ""))))
    shared = sorted(
        (page for root in registry.TASK_PACKAGES.values() for page in root.glob(f"*/{PAGE}")),
        key=lambda page: page.parent.name,
    )
    for page in shared:
        if page.parent.name not in folders:
            pages.append(TaskPage(heading_of(page), f"tasks/{page.parent.name}.md", page, None))
    return pages


def heading_of(page: Path) -> str:
    found = re.search(r"^# (.+)$", page.read_text(), re.MULTILINE)
    if not found:
        raise PluginError(f"{page}: a page several tasks share needs a '# ' heading: the nav shows it")
    return found.group(1).strip()


def fill_nav(nav: list[Any], pages: list[TaskPage]) -> None:
    """Append the pages to the nav's "Tasks" section (mkdocs.yml lists only its index there)."""
    sections = [item[NAV_SECTION] for item in nav if isinstance(item, dict) and NAV_SECTION in item]
    if len(sections) != 1 or INDEX not in sections[0]:
        raise PluginError(f"mkdocs.yml's nav needs one '{NAV_SECTION}' section that holds {INDEX}")
    for page in pages:
        entry = {page.title: page.site_path}
        if entry not in sections[0]:  # idempotent, should a config pass through twice
            sections[0].append(entry)


def tasks_table(pages: list[TaskPage]) -> str:
    """The index's table: one row per task, linking its page."""
    rows = ["| task | competition | page |", "|---|---|---|"]
    for page in pages:
        if page.competition is None:
            continue
        link = posixpath.relpath(page.site_path, posixpath.dirname(INDEX))
        competition = page.competition.replace("|", "\\|")  # a bar would end the cell
        rows.append(f"| `{page.title}` | {competition} | [{page.title}]({link}) |")
    return "\n".join(rows)


# MkDocs' events (https://www.mkdocs.org/dev-guide/plugins/#events). Each build starts with
# on_config, which finds the pages anew (so `mkdocs serve` follows a page added while it runs);
# the build's other events use what it found.
found: list[TaskPage] = []


def on_config(config: Any) -> None:
    found[:] = task_pages()
    fill_nav(config.nav, found)
    # `mkdocs serve` rebuilds when a page or a task.yaml changes, not only docs/
    config.watch.extend(str(root) for root in registry.TASK_PACKAGES.values())


def on_files(files: Files, config: Any) -> None:
    for page in found:
        files.append(File.generated(config, page.site_path, abs_src_path=str(page.source)))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri != INDEX:
        return markdown
    if TABLE_MARKER not in markdown:
        raise PluginError(f"docs/{INDEX} lost its line '{TABLE_MARKER}', where the table of tasks goes")
    return markdown.replace(TABLE_MARKER, tasks_table(found))
