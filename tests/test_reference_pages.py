"""The site's reference pages (docs/hooks/reference.py) cover every config group, choice and key and
every command, so that nothing new can be left out of them; and the pages a researcher reads keep
maintainers' references (issue numbers, commit hashes, test files) to the development pages."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from conftest import REPO, reference_hook, tasks_hook
from mlrb.core import registry
from mlrb.core.config import CONF_DIR, MlrbConfig

pytestmark = pytest.mark.fast

# Modules with a `__main__` that are no command a user types: the harness (or install.sh) starts them itself.
STARTED_BY_THE_HARNESS = {
    "mlrb.sandbox.exec_server": "the sandbox's first process",
    "mlrb.sandbox.model_bridge": "the model connection inside a sandbox",
    "mlrb.store.recording_process": "a single run's MLflow process",
    "mlrb.scoring.worker": "the scoring process",
    "mlrb.task_kit.warm_python": "the anchors' warm interpreter at asset build",
    "mlrb.tracking": "the same command as mlrb.store.tracking_server: `python -m mlrb.tracking serve`",
    "mlrb.core.bytecode": "install.sh's compile of what runs import",
}
# The pages for maintainers, where issue numbers, commits and test files belong.
FOR_MAINTAINERS = {"docs/development.md", "docs/ARCHITECTURE.md"}
# Pages written before this rule, still naming test files or issues: each to be cleaned, then removed here.
NOT_YET_CLEANED: set[str] = set()
MAINTAINERS_ONLY = re.compile(r"\b[Ii]ssues? #?\d+|\b[0-9a-f]{40}\b|tests/test_\w+\.py")


@pytest.fixture(scope="module")
def configs_page() -> str:
    return reference_hook().configs_page()


def schema_keys(cls: type, prefix: str) -> list[str]:
    """Every key of a dataclass, the keys of the dataclasses it holds included."""
    keys = []
    for f in dataclasses.fields(cls):
        keys.append(prefix + f.name)
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(factory):
            keys += schema_keys(factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
    return keys


def test_the_config_reference_names_every_group_choice_and_key(configs_page):
    sections = re.findall(r"^## (\S+)$", configs_page, re.MULTILINE)
    groups = [f.name for f in dataclasses.fields(MlrbConfig) if f.name not in ("seed", "resume", "verbose")]
    assert set(groups) | {"launcher"} <= set(sections)
    assert {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"} <= set(sections)
    for group in sections:
        for choice in (CONF_DIR / group).glob("*.yaml"):
            assert f"| `{choice.stem}` |" in configs_page, f"{group}={choice.stem}"
    for task in registry.task_folders():
        assert f"| `{task}` |" in configs_page, task
    for key in schema_keys(MlrbConfig, ""):
        if "." in key or key in ("seed", "resume", "verbose"):
            assert f"| `{key}` |" in configs_page, key
    for launcher in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"):
        for key in yaml.safe_load(launcher.read_text()):
            assert key.startswith("_") or f"| `hydra.launcher.{key}` |" in configs_page, key
    assert "Not set by hand" in configs_page.split("## sweep")[1]


def test_the_config_reference_names_every_option_of_every_kind(configs_page):
    from mlrb.agents.command import CommandOptions
    from mlrb.agents.llm import LlmOptions

    for kind in registry.SANDBOXES:
        for f in dataclasses.fields(registry.load(registry.SANDBOXES[kind]).options_class):
            assert f"| `sandbox.options.{f.name}` |" in configs_page, (kind, f.name)
    for options in (LlmOptions, CommandOptions):
        for f in dataclasses.fields(options):
            assert f"| `agent.options.{f.name}` |" in configs_page, f.name
    for kind in registry.AGENTS:
        assert f"of kind `{kind}`" in configs_page, kind


def test_every_key_of_the_config_reference_says_what_it_is(configs_page):
    # a key's row ends with the comment above it in its schema or config file: none may be blank
    rows = [line for line in configs_page.splitlines() if line.startswith("| `")]
    blank = [row.split("|")[1].strip() for row in rows if not row.rstrip().removesuffix("|").rsplit("|", 1)[1].strip()]
    assert len(rows) > 100 and not blank, blank


def test_the_command_reference_shows_every_command():
    hook = reference_hook()
    page = hook.commands_page()
    commands = {module for _, module, _ in hook.COMMANDS_HELP}
    mains = []
    for path in (REPO / "mlrb").rglob("*.py"):
        if "starter" in path.parts or 'if __name__ == "__main__"' not in path.read_text():
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__main__")
        mains.append(module)
    for module in mains:
        entry = {"mlrb": "mlrb.cli", "mlrb.report": "mlrb.report.cli"}.get(module, module)
        assert entry in commands or f"{module}.__main__" in commands or module in STARTED_BY_THE_HARNESS, (
            f"python -m {module}: not on the commands page"
        )
    for command, _, _ in hook.COMMANDS_HELP:
        assert f"## `{command}`" in page
    assert "usage: python -m mlrb.sync" in page and "agent: baseline, claude" in page
    assert "from_scratch" not in page  # --help lists no internal group


def user_pages() -> dict[str, str]:
    """Every page a researcher reads, by its source, the generated reference pages included."""
    pages = {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "docs").rglob("*.md")}
    pages |= {str(p.source.relative_to(REPO)): p.source.read_text() for p in tasks_hook().task_pages()}
    hook = reference_hook()
    pages |= {hook.CONFIGS: hook.configs_page(), hook.COMMANDS: hook.commands_page()}
    return {name: text for name, text in pages.items() if name not in FOR_MAINTAINERS}


def test_user_pages_name_no_issue_commit_or_test_file():
    found = []
    for name, text in sorted(user_pages().items()):
        hits = MAINTAINERS_ONLY.findall(text)  # check marks too: they name a test by its topic
        if hits and name not in NOT_YET_CLEANED:
            found.append(f"{name}: {hits}")
        if not hits:
            assert name not in NOT_YET_CLEANED, f"{name} is clean now: remove it from NOT_YET_CLEANED"
    assert not found, f"maintainers' references belong in docs/development.md: {found}"


def test_check_marks_reasons_on_user_pages_name_no_test_file():
    """A mark names the file that runs its block; its reason says how (`it runs ...`), naming no other test."""
    found = []
    for name, text in sorted(user_pages().items()):
        for reason in re.findall(r"<!-- check: elsewhere [^\s:]+:\s*(.*?) -->", text):
            if MAINTAINERS_ONLY.search(reason):
                found.append(f"{name}: {reason}")
    assert not found, f"a check mark's reason names a test file: {found}"


def test_how_to_guides_say_what_they_let_you_do_in_short_sentences_and_numbered_steps():
    import statistics

    guides = sorted((REPO / "docs" / "how-to").glob("*.md"))
    assert len(guides) == 6
    for guide in guides:
        text = guide.read_text()
        assert re.search(r"^# .+\n\nThis guide lets ", text), f"{guide.name}: open with what it lets you do"
        assert re.search(r"^1\. ", text, re.MULTILINE), f"{guide.name}: numbered steps"
        prose = re.sub(r"```.*?```|<!--.*?-->|^\s*\|.*$", "", text, flags=re.DOTALL | re.MULTILINE)
        sentences = [s for s in re.split(r"(?<=[.!?:])\s+", prose) if len(s.split()) > 2]
        median = statistics.median(len(s.split()) for s in sentences)
        assert median < 20, f"{guide.name}: median sentence of {median} words"
