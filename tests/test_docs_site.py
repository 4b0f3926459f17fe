"""The docs site's task pages come from the task folders (docs/hooks/tasks.py): a task folder with a
`page.md` is on the site, in its nav and in the index's table, with no other file to edit."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO, tasks_hook
from mlrb import registry


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
    assert "<td><code>my_task</code></td>" in index and "My Challenge 2025" in index
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
        assert f"| `{name}` |" in table and f"[{name}]({name}.md)" in table, name
    assert len(table.splitlines()) == 2 + len(with_a_page)  # a shared page is no row of its own
    assert hook.TABLE_MARKER in (REPO / "docs" / "tasks" / "index.md").read_text().splitlines()
    # the shared page is in the nav under its heading
    assert ("Tasks that pretrain from scratch", "tasks/from_scratch.md") in [(p.title, p.site_path) for p in pages]
    # nothing lists the tasks by hand: mkdocs.yml's "Tasks" holds only the index, docs/tasks/ only index.md
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert [item["Tasks"] for item in nav if isinstance(item, dict) and "Tasks" in item] == [["tasks/index.md"]]
    assert sorted(p.name for p in (REPO / "docs" / "tasks").iterdir()) == ["index.md"]
