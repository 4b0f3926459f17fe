"""The site's reference pages, written at build time from the code so that they cannot go stale.

- reference/configs.md: every config group, its choices (the YAML files in mlrb/conf/ and the task
  folders) and every key, with its type, default and the comment above it in the dataclass schema
  (mlrb/core/config.py and the schemas of tasks, agents and sandboxes it names), read with `ast` and
  `tokenize`: nothing is imported that a run does not import to check its config.
- reference/commands.md: each command's --help, from its parser, called in this process.

mkdocs.yml lists both pages in its nav's "Reference" section; this hook (mkdocs.yml's `hooks`)
adds their text to the build. tests/test_reference_pages.py checks that they cover every group,
choice, key and command.
"""

from __future__ import annotations

import ast
import functools
import html
import importlib
import importlib.util
import io
import os
import tokenize
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from mkdocs.structure.files import File, Files

from mlrb.core import registry
from mlrb.core.config import CONF_DIR

CONFIGS = "reference/configs.md"
COMMANDS = "reference/commands.md"
CONFIG_MODULE = "mlrb.core.config"
ROOT_SCHEMA = "MlrbConfig"
SCALE_SCHEMA = ("mlrb.tasks.base", "ScaleSpec")  # a task's `scales.NAME`
HYDRA_LAUNCHERS = CONF_DIR / "hydra" / "launcher"  # what each `launcher` choice sets under hydra.launcher
# Keys of the root schema that a user does not set: what sets them instead.
SET_BY_HARNESS = {"sweep": "the launcher, for each job of a sweep (`-m`)"}
# Each user command, as it is typed, and the module function that gives its --help.
COMMANDS_HELP = (
    ("python -m mlrb", "mlrb.cli", "help_text"),
    ("python -m mlrb.report", "mlrb.report.cli", "parser"),
    ("python -m mlrb.compare", "mlrb.compare", "parser"),
    ("python -m mlrb.rescore", "mlrb.rescore", "parser"),
    ("python -m mlrb.sync", "mlrb.sync", "parser"),
    ("python -m mlrb.export", "mlrb.export", "help_text"),
    ("python -m mlrb.export inspect", "mlrb.export.inspect_log", "parser"),
    ("python -m mlrb.prefetch", "mlrb.prefetch", "help_text"),
    ("python -m mlrb.preflight", "mlrb.preflight", "parser"),
    ("python -m mlrb.review", "mlrb.review.__main__", "parser"),
    ("python -m mlrb.tracking serve", "mlrb.store.tracking_server", "parser"),
)
HELP_COLUMNS = "80"  # argparse wraps --help to the terminal's width: the site's code column holds 80 characters


# ---- the schema, read from the source --------------------------------------------------------


class Key(NamedTuple):
    name: str
    type: str  # the annotation, as written
    default: str  # as written; "required" where there is none
    comment: str  # the comment above it (or after it), or the one of the keys just above
    schema: str | None = None  # the dataclass of its value, where it is one in the same module


def module_source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"no module {module}")
    return Path(spec.origin).read_text()


def comments_by_line(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (the comment's text, whether it is the line's only content)."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            alone = token.line.strip().startswith("#")
            found[token.start[0]] = (token.string.lstrip("#").strip(), alone)
    return found


@functools.cache
def parsed(source: str) -> tuple[ast.Module, list[str], dict[int, tuple[str, bool]]]:
    """A module's tree, lines and comments, once per source text: a page reads many classes of one
    module, and `ast.get_source_segment` splits the whole source again on each call."""
    return ast.parse(source), io.StringIO(source).readlines(), comments_by_line(source)


def segment(lines: list[str], node: ast.AST) -> str:
    """NODE's source text, as `ast.get_source_segment` gives it (its columns count UTF-8 bytes)."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start, end = node.col_offset, node.end_col_offset
    if first == last:
        return lines[first].encode()[start:end].decode()
    middle = lines[first + 1 : last]
    return "".join([lines[first].encode()[start:].decode(), *middle, lines[last].encode()[:end].decode()])


def find_class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise ValueError(f"no class {name}")


def default_of(lines: list[str], value: ast.expr | None) -> str:
    """The default as one would write it on the command line (true, null, 400000), or "required"."""
    if value is None:
        return "required"
    text = segment(lines, value)
    if text == "MISSING":
        return "required"
    if isinstance(value, ast.Call) and text.split("(")[0] in ("field", "dataclasses.field"):
        factory = next((k.value for k in value.keywords if k.arg == "default_factory"), None)
        name = getattr(factory, "id", "")
        if isinstance(factory, ast.Lambda):
            return "(set in code)"
        return {"list": "[]", "dict": "{}"}.get(name, "(below)")
    try:
        return as_yaml(ast.literal_eval(value))
    except ValueError:
        return text


def as_yaml(value: Any) -> str:
    if isinstance(value, str) and value and value == value.strip() and "${" not in value:
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def comment_above(comments: dict[int, tuple[str, bool]], line: int) -> str:
    """The comment lines just above LINE, joined; a trailing comment on LINE itself if none."""
    lines = []
    above = line - 1
    while above in comments and comments[above][1]:
        lines.insert(0, comments[above][0])
        above -= 1
    if not lines and line in comments and not comments[line][1]:
        lines = [comments[line][0]]
    return " ".join(lines)


def schema_keys(module: str, class_name: str) -> tuple[str, list[Key]]:
    """A dataclass's docstring and its fields, each with its comment. A field with no comment of
    its own, right below another of the same type (no blank line between), shares that one's."""
    tree, lines, comments = parsed(module_source(module))
    node = find_class(tree, class_name)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    keys: list[Key] = []
    previous_end = -1
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        annotation = segment(lines, item.annotation)
        comment = comment_above(comments, item.lineno)
        if not comment and keys and item.lineno == previous_end + 1 and keys[-1].type == annotation:
            comment = keys[-1].comment
        named = [n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name) and n.id in classes]
        keys.append(Key(item.target.id, annotation, default_of(lines, item.value), comment, next(iter(named), None)))
        previous_end = item.end_lineno or item.lineno
    return " ".join((ast.get_docstring(node) or "").split()), keys


def keys_table(module: str, class_name: str, prefix: str) -> list[str]:
    """A table of the class's keys, then one of each nested dataclass's keys, under their prefix
    (`KEY.NAME.` for a mapping of them)."""
    doc, keys = schema_keys(module, class_name)
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for k in keys:
        shown = k.type.replace(k.schema, "mapping") if k.schema else k.type
        rows.append(f"| `{prefix}{k.name}` | {type_cell(shown)} | {code_cell(k.default)} | {cell(k.comment)} |")
    lines = ([doc, ""] if doc else []) + rows
    for key in keys:
        if key.schema:
            below = f"{prefix}{key.name}." + ("NAME." if key.type.startswith("dict[") else "")
            lines += ["", f"`{below}*`:", ""] + keys_table(module, key.schema, below)
    return lines


def cell(text: str) -> str:
    """Text safe in a table's cell: a bar would end it, a newline the row."""
    return " ".join(text.split()).replace("|", "\\|")


def code_cell(text: str) -> str:
    """Code in a table's cell. A bar escaped in Markdown's backticks would show as `\\|`: a type's
    bar reads "or" (`str or None`), and other code with a bar is HTML, the bar an entity."""
    text = " ".join(text.split())
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def type_cell(annotation: str) -> str:
    return code_cell(annotation.replace(" | ", " or "))


# ---- the choices, read from the config files ------------------------------------------------


def leading_comment(path: Path) -> str:
    """The file's first comment lines, up to a line that shows a command: what the choice is."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.startswith("#   ") or line.startswith("# @package"):
            if lines or not line.startswith("# @package"):
                break
            continue
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def first_sentence(text: str) -> str:
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def scalar_settings(config: dict[str, Any]) -> str:
    """A choice's own top-level values (not its name or options) and the choices it overrides."""
    shown = [f"`{key}: {as_yaml(value)}`" for key, value in config.items()
             if key not in ("name", "defaults", "options") and not isinstance(value, dict)]  # fmt: skip
    for entry in config.get("defaults") or []:
        if isinstance(entry, dict):
            shown += [f"`{key.removeprefix('override ').lstrip('/')}: {value}`" for key, value in entry.items()]
    return ", ".join(shown)


def yaml_choices(group: str) -> list[tuple[str, Path]]:
    return [(path.stem, path) for path in sorted((CONF_DIR / group).glob("*.yaml"))]


def groups_with_files() -> list[str]:
    """mlrb/conf/'s groups (folders) but Hydra's own."""
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def choices_table(group: str) -> list[str]:
    rows = ["| choice | what it is | sets |", "|---|---|---|"]
    for name, path in yaml_choices(group):
        config = yaml.safe_load(path.read_text()) or {}
        rows.append(f"| `{name}` | {cell(first_sentence(leading_comment(path)))} | {cell(scalar_settings(config))} |")
    return rows


def task_choices_table() -> list[str]:
    rows = ["| choice | competition | page |", "|---|---|---|"]
    for name, (_, folder) in sorted(registry.task_folders().items()):
        config = yaml.safe_load((folder / registry.TASK_CONFIG).read_text()) or {}
        page = (
            f"[{name}](../tasks/{name}.md)" if (folder / "page.md").is_file() else "[Task folders](../task-folders.md)"
        )
        title = str(config.get("title", ""))
        title = "(named after the folder)" if "${" in title else title
        rows.append(f"| `{name}` | {cell(title)} | {page} |")
    return rows


def class_of(target: str) -> tuple[str, ast.ClassDef, ast.Module]:
    module, name = target.split(":")
    tree = ast.parse(module_source(module))
    return module, find_class(tree, name), tree


def sandbox_options(kind: str) -> tuple[str, str] | None:
    """The module and dataclass of a sandbox kind's `options` (its class's `options_class`)."""
    module, node, _ = class_of(registry.SANDBOXES[kind])
    for item in node.body:
        if isinstance(item, ast.Assign) and getattr(item.targets[0], "id", "") == "options_class":
            return module, getattr(item.value, "id", "")
    return None


def agent_options(kind: str) -> tuple[str, str] | None:
    """The module and dataclass of an agent kind's `options`: what its module's parse_options returns."""
    module, _, tree = class_of(registry.AGENTS[kind])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "parse_options" and node.returns is not None:
            return module, getattr(node.returns, "id", "")
    return None


def options_tables(group: str, kinds: list[str], find: Any) -> list[str]:
    lines = []
    for kind in kinds:
        found = find(kind)
        if found is None or not schema_keys(*found)[1]:
            lines += ["", f"`{group}.options` of kind `{kind}`: none.", ""]
            continue
        lines += ["", f"`{group}.options` of kind `{kind}`:", ""] + keys_table(*found, f"{group}.options.")
    return lines


def launcher_keys() -> list[str]:
    """The keys each `launcher` choice sets under hydra.launcher (its file in conf/hydra/launcher/)."""
    lines = []
    for path in sorted(HYDRA_LAUNCHERS.glob("*.yaml")):
        rows = ["| key | default | what it does |", "|---|---|---|"]
        comments = {n: c for n, c in yaml_comments(path).items()}
        for key, value in (yaml.safe_load(path.read_text()) or {}).items():
            if key.startswith("_"):
                continue
            rows.append(f"| `hydra.launcher.{key}` | {code_cell(as_yaml(value))} | {cell(comments.get(key, ''))} |")
        lines += ["", f"`{path.stem}` ({cell(leading_comment(path))}):", ""] + rows
    return lines


def yaml_comments(path: Path) -> dict[str, str]:
    """Top-level key -> the comment at the end of its line."""
    found = {}
    for line in path.read_text().splitlines():
        if line[:1].isalpha() and "#" in line and ":" in line:
            found[line.split(":", 1)[0]] = line.split("#", 1)[1].strip()
    return found


# ---- the pages ------------------------------------------------------------------------------


def section(title: str, *parts: list[str]) -> list[str]:
    lines = ["", f"## {title}", ""]
    for part in parts:
        lines += part + [""]
    return lines


def configs_page() -> str:
    _, root = schema_keys(CONFIG_MODULE, ROOT_SCHEMA)
    groups = {key.name: key for key in root if key.schema}
    top = [key for key in root if not key.schema]
    lines = [
        "# Config reference",
        "",
        "This page lets you look up every config group, its choices, and every key you can set, with its type,",
        "its default and what it does. It is written from the schema (`mlrb/core/config.py`) and the config files",
        "each time the site is built, so it matches the code. How to set a key or choose a group's choice:",
        "[Configs and the command line](../configs.md).",
        "",
        "A group's choice is set with `GROUP=CHOICE` (`agent=claude`), a key with `KEY=VALUE` (`seed=3`).",
        "`required` means the choice's file must set it. `null` means none.",
    ]
    lines += section(
        "Top-level keys",
        ["| key | type | default | what it does |", "|---|---|---|---|"]
        + [f"| `{k.name}` | {type_cell(k.type)} | {code_cell(k.default)} | {cell(k.comment)} |" for k in top],
    )
    lines += section(
        "task",
        ["Choose with `task=NAME`. Each choice is a task folder and its `task.yaml`."],
        task_choices_table(),
        keys_table(CONFIG_MODULE, groups["task"].schema or "", "task."),
        ["Each scale, `task.scales.SCALE.*` (`tiny`, `full`, `plumbing`). `assets` differs by task: see its page."],
        keys_table(*SCALE_SCHEMA, "task.scales.SCALE."),
    )
    for group in ("agent", "sandbox"):
        kinds = sorted(registry.AGENTS if group == "agent" else registry.SANDBOXES)
        find = agent_options if group == "agent" else sandbox_options
        lines += section(
            group,
            [f"Choose with `{group}=NAME`. Each choice is a file in `mlrb/conf/{group}/`."],
            choices_table(group),
            keys_table(CONFIG_MODULE, groups[group].schema or "", f"{group}."),
            options_tables(group, kinds, find),
        )
    for group in ("budget", "tracking"):
        lines += section(
            group,
            [f"Choose with `{group}=NAME`. Each choice is a file in `mlrb/conf/{group}/`."],
            choices_table(group),
            keys_table(CONFIG_MODULE, groups[group].schema or "", f"{group}."),
        )
    lines += section(
        "launcher",
        ["Choose with `launcher=NAME`: how a sweep (`-m`) runs its jobs. Each choice is a file in",
         "`mlrb/conf/launcher/` that picks Hydra's launcher; its keys are under `hydra.launcher`."],
        choices_table("launcher"),
        launcher_keys(),
    )  # fmt: skip
    for name, key in groups.items():
        if name in ("task", "agent", "sandbox", "budget", "tracking"):
            continue
        if name in SET_BY_HARNESS:
            lines += section(
                name,
                [f"Not set by hand: {SET_BY_HARNESS[name]} sets these keys."],
                keys_table(CONFIG_MODULE, key.schema or "", f"{name}."),
            )
            continue
        lines += section(
            name,
            ["Keys only: this group has no choices."],
            keys_table(CONFIG_MODULE, key.schema or "", f"{name}."),
        )
    return "\n".join(lines).rstrip() + "\n"


def command_help(module: str, function: str) -> str:
    """The command's --help text, from its module's function, in this process."""
    made = getattr(importlib.import_module(module), function)()
    return made if isinstance(made, str) else made.format_help()


def commands_page() -> str:
    lines = [
        "# Command reference",
        "",
        "This page shows what each command prints for `--help`: its arguments and options.",
        "It is written from the commands' own parsers each time the site is built, so it matches the code.",
        "How to use them: [Configs and the command line](../configs.md), [Reports](../reports.md),",
        "[Runs](../runs.md) and [Tracking on a cluster](../tracking.md).",
    ]
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        for command, module, function in COMMANDS_HELP:
            lines += ["", f"## `{command}`", "", "```text", command_help(module, function).rstrip(), "```"]
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(lines) + "\n"


# MkDocs' events (https://www.mkdocs.org/dev-guide/plugins/#events).


def on_files(files: Files, config: Any) -> None:
    files.append(File.generated(config, CONFIGS, content=configs_page()))
    files.append(File.generated(config, COMMANDS, content=commands_page()))
