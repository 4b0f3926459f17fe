"""The docs site's task pages come from the task folders (docs/hooks/tasks.py): a task folder with a
`page.md` is on the site, in its nav and in the index's table, with no other file to edit."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO, tasks_hook
from mlrb.core import registry


@pytest.mark.fast
def test_a_new_task_folder_is_on_the_site_with_no_other_edit(tmp_path, monkeypatch):
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    package = tmp_path / "more_tasks"
    (package / "my_task").mkdir(parents=True)
    (package / "my_task" / registry.TASK_CONFIG).write_text("name: my_task\ntitle: My Challenge 2025\n")
    (package / "my_task" / "page.md").write_text("# The my_task task\n\nSee [Results](../results.md).\n")
    monkeypatch.setitem(registry.TASK_PACKAGES, "more_tasks", package)
    monkeypatch.chdir(REPO)  # mkdocs.yml's snippets are relative to the working folder

    site = tmp_path / "site"
    build(load_config(config_file=str(REPO / "mkdocs.yml"), site_dir=str(site), strict=True))

    assert "The my_task task" in (site / "tasks" / "my_task" / "index.html").read_text()
    index = (site / "tasks" / "index.html").read_text()
    assert (
        '<td><span style="white-space: nowrap"><code>my_task</code></span></td>' in index
        and "My Challenge 2025" in index
    )
    assert '<a href="my_task/">my_task</a>' in index
    assert 'href="tasks/my_task/"' in (site / "index.html").read_text()  # in every page's nav


@pytest.mark.fast
def test_the_table_and_the_nav_name_every_task_with_a_page():
    hook = tasks_hook()
    pages = hook.task_pages()
    table = hook.tasks_table(pages)
    with_a_page = [name for name, (_, folder) in registry.task_folders().items() if (folder / "page.md").is_file()]
    assert len(with_a_page) >= 7
    for name in with_a_page:
        assert f'| <span style="white-space: nowrap">`{name}`</span> |' in table and f"[{name}]({name}.md)" in table, (
            name
        )
    assert len(table.splitlines()) == 2 + len(with_a_page)  # a shared page is no row of its own
    assert hook.TABLE_MARKER in (REPO / "docs" / "tasks" / "index.md").read_text().splitlines()
    # the shared page is in the nav under its heading
    assert ("Tasks that pretrain from scratch", "tasks/from_scratch.md") in [(p.title, p.site_path) for p in pages]
    # nothing lists the tasks by hand: mkdocs.yml's "Tasks" holds only the index, docs/tasks/ only index.md
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert [item["Tasks"] for item in nav if isinstance(item, dict) and "Tasks" in item] == [["tasks/index.md"]]
    assert sorted(p.name for p in (REPO / "docs" / "tasks").iterdir()) == ["index.md"]


# Every packaged task's page, in this order: the hand-written parts, then the generated tables.
TASK_PAGE_SECTIONS = ["## What it is", "## What the agent gets", "## How it is scored", "## Tiny and full", "## Rules"]


@pytest.mark.fast
def test_every_task_page_has_one_layout_and_its_generated_tables():
    hook = tasks_hook()
    for page in hook.task_pages():
        if page.competition is None:  # a page several tasks share
            continue
        text = page.source.read_text()
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        assert headings == TASK_PAGE_SECTIONS, f"{page.source}: sections {headings}"
        filled = hook.fill_task_page(text, page)
        assert hook.SCALES_MARKER not in filled and hook.RULES_MARKER not in filled, page.source
        tiny_full = filled.split("## Tiny and full", 1)[1].split("\n## ", 1)[0]
        assert "| key | tiny | full |" in tiny_full and "| `time_limit_s` |" in tiny_full, page.source
        assert "| rule | how it is enforced |" in filled.split("\n## Rules\n", 1)[1], page.source
