"""The site's task pages, found the way the code finds tasks: by their folders.

A task is a folder (mlrb/core/registry.py, `task_folders`) and its page is the folder's `page.md`;
a folder with a page but no `task.yaml` is a page several tasks share (mlrb/tasks/from_scratch/).
This MkDocs hook (mkdocs.yml's `hooks`) adds each page to the site as tasks/FOLDER.md, lists
it in the nav's "Tasks" section after tasks/index.md, and writes the index's table of tasks
where its marker line is: a new task folder with a page needs no other edit.

A task's page may hold two more marker lines, where this hook writes two tables: the keys that
differ between its tiny and full scales (from the composed task.yaml), and its rules with how
each is enforced (the rule ids of its `rules.yaml`, and the `unenforced_rules` of each scale).
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

from mlrb.core import registry

PAGE = "page.md"
NAV_SECTION = "Tasks"
INDEX = "tasks/index.md"
TABLE_MARKER = "<!-- tasks: generated from mlrb/tasks/*/task.yaml by docs/hooks/tasks.py -->"
SCALES_MARKER = "<!-- scales: generated from task.yaml by docs/hooks/tasks.py -->"
RULES_MARKER = "<!-- rules: generated from rules.yaml and task.yaml by docs/hooks/tasks.py -->"
COMPARED = ("tiny", "full")
# Keys of a scale that the scales table leaves out: the words shown to the agent (the rules
# table has its rules), and what only the harness reads.
NOT_COMPARED = ("prompt.task", "prompt.dataset", "prompt.result", "prompt.evaluation", "prompt.rules",
                "prompt.additional_info", "unenforced_rules", "baseline_command", "do_nothing_command",
                "reference_command", "extends", "plumbing")  # fmt: skip


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
        # a name never breaks inside itself: a narrow column would split `edge_llm_compression` mid-word
        name = f'<span style="white-space: nowrap">`{page.title}`</span>'
        rows.append(f"| {name} | {competition} | [{page.title}]({link}) |")
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


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A mapping's leaves by dotted key."""
    if not isinstance(value, dict):
        return {prefix: value}
    found: dict[str, Any] = {}
    for key, inner in value.items():
        found |= flat(inner, f"{prefix}.{key}" if prefix else str(key))
    return found


def shown(value: Any) -> str:
    """A value for a table's cell: as YAML would write it, bars escaped."""
    if value is None:
        return "—"
    if value == "???":
        return "(you set it)"
    if isinstance(value, str):
        text = value
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return " ".join(text.split()).replace("|", "\\|")


def scales_table(task: str) -> str:
    """The keys whose values differ between the task's tiny and full scales, side by side."""
    from mlrb.core.config import packaged_task  # Hydra: imported only when a task page is built

    scales = packaged_task(task)["scales"]
    tiny, full = (flat(scales[name]) for name in COMPARED)
    rows = ["| key | tiny | full |", "|---|---|---|"]
    for key in [*tiny, *(k for k in full if k not in tiny)]:
        if key.startswith(NOT_COMPARED) or tiny.get(key) == full.get(key):
            continue
        rows.append(f"| `{key}` | {shown(tiny.get(key))} | {shown(full.get(key))} |")
    return "\n".join(rows)


def rules_of(folder: Path) -> dict[str, dict[str, str]]:
    """The task's rules.yaml: rule id -> `rule` (the rule in words) and, where a check enforces
    it, `enforced` (how, one short phrase)."""
    path = folder / registry.TASK_RULES
    if not path.is_file():
        raise PluginError(f"{path}: a task page's rules table is written from this file")
    return {str(rule): dict(entry) for rule, entry in (yaml.safe_load(path.read_text()) or {}).items()}


def rules_table(task: str, folder: Path) -> str:
    """One row per rule: how it is enforced, or at which scale it is not and why (its `unenforced_rules`)."""
    from mlrb.core.config import packaged_task

    scales = packaged_task(task)["scales"]
    rows = ["| rule | how it is enforced |", "|---|---|"]
    for rule, entry in rules_of(folder).items():
        how = [entry["enforced"]] if entry.get("enforced") else []
        for name in COMPARED:
            why = (scales[name].get("unenforced_rules") or {}).get(rule)
            if why:
                how.append(f"**not enforced** at {name} scale: {why}")
        rows.append(f"| {shown(entry['rule'])} (`{rule}`) | {shown('; '.join(how) or 'not stated at these scales')} |")
    return "\n".join(rows)


def fill_task_page(markdown: str, page: TaskPage) -> str:
    """A task's page with its two tables where their marker lines are (a page without one gets none)."""
    if SCALES_MARKER in markdown:
        markdown = markdown.replace(SCALES_MARKER, scales_table(page.title))
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_table(page.title, page.source.parent))
    return markdown


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    task = next((p for p in found if p.site_path == page.file.src_uri and p.competition is not None), None)
    if task is not None:
        return fill_task_page(markdown, task)
    if page.file.src_uri != INDEX:
        return markdown
    if TABLE_MARKER not in markdown:
        raise PluginError(f"docs/{INDEX} lost its line '{TABLE_MARKER}', where the table of tasks goes")
    return markdown.replace(TABLE_MARKER, tasks_table(found))
