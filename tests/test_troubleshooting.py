"""The troubleshooting page (docs/troubleshooting.md) lists every one-line error the commands can
print, read from the code, so that none is missing and none is stale.

What counts as a one-line error, found with `ast` in every module of mlrb/ (the starter code given to
agents aside):
- the message of a call to a class the commands print as one line (`mlrb: error: ...`): ConfigError,
  ReportError, CompareError, ServeError, and every class of mlrb's that derives from one of them;
- the text a command prints to standard error itself (`print(..., file=sys.stderr)`), without its
  `PROGRAM: error: ` prefix, unless it only prints an error's own text (`{e}`: listed where raised).

A message is a template: the string, with each `{...}` of an f-string as a placeholder. A message
passed as a variable is followed to what that variable is set to in its function, and one returned by
a function of mlrb's to what that function returns. One that is still not a string (an error's own
text, passed on) must be in PASSED_ON with the reason.

How a new error gets listed: run this file's test; it names the template the page lacks (and where it
is raised). Add it to the page's section for its situation as a list item that starts with the
template in backticks (double ones, `` like this ``, where it holds one; placeholders as `{name}`, any name), then a sentence on what it means and one
on what to do. A template the page lists that the code no longer has fails the test too.
"""

from __future__ import annotations

import ast
import re

import pytest

from conftest import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
PACKAGE = REPO / "mlrb"
# The classes the commands catch and print as one line (mlrb/cli.py, mlrb/report/cli.py, mlrb/compare.py,
# mlrb/store/tracking_server.py, mlrb/sync.py, mlrb/rescore.py, mlrb/prefetch.py, mlrb/export/).
ONE_LINE_ERRORS = {"ConfigError", "ReportError", "CompareError", "ServeError"}
# Modules that print to standard error but are no command a user runs: the warm Python server's child
# (prints what the task's own code exits with) and the scorer's worker (its parent is gone).
NOT_COMMANDS = {"task_kit/warm_python.py", "scoring/worker.py"}
# Functions of mlrb's whose every error (ValueError included) a command prints as one line: a SLURM
# sweep's cluster profile, read by the launcher before any job starts.
ONE_LINE_FUNCTIONS = {"load_profile"}
# Messages that are another error's own text, passed on (module, line's code) -> why it is listed elsewhere.
PASSED_ON = {
    ("rescore.py", "str(e)"): "a ReportError's message, listed under reports",
    ("prefetch.py", "str(e).splitlines()[0]"): "the first line of a task's config error, listed where it is raised",
    ("sweep.py", "str(e)"): "a ConfigError's message or one of ONE_LINE_FUNCTIONS', listed where raised",
    ("cli.py", "message"): "argparse's own message for a bad flag (HydraFlagParser.error)",
    ("cli.py", "str(cause).splitlines()[0]"): "Hydra's or OmegaConf's own message for a bad override",
    ("cli.py", "text.splitlines()[0] if text else type(error).__name__"): "Hydra's own message for a bad override",
    (
        "core/config.py",
        "str(e).splitlines()[0] if str(e) else type(e).__name__",
    ): "OmegaConf's own message for a bad value",
}
PREFIX = re.compile(r"^mlrb(\.[a-z_]+)*( [a-z]+)?: (error: |warning: )?")
PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def template(node: ast.AST) -> str | None:
    """The message a string expression writes, `{}` for each value; None if it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template(node.left), template(node.right)
        return None if left is None or right is None else left + right
    return None


def normal(text: str) -> str:
    """A template as compared: each placeholder `{}`, spaces collapsed, backticks aside (the page may
    leave out a message's own, around a command with placeholders that no page's block runs)."""
    return " ".join(PLACEHOLDER.sub("{}", text.replace("`", "")).split())


def error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """ONE_LINE_ERRORS and every class of mlrb's derived from one of them."""
    found = set(ONE_LINE_ERRORS)
    grew = True
    while grew:
        grew = False
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name not in found:
                    if any(getattr(b, "id", getattr(b, "attr", None)) in found for b in node.bases):
                        found.add(node.name)
                        grew = True
    return found


def called_name(call: ast.Call) -> str | None:
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None)


def functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def raised_in(function: ast.FunctionDef) -> list[ast.expr]:
    """The messages of the errors FUNCTION raises."""
    return [r.exc.args[0] for r in ast.walk(function)
            if isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call) and r.exc.args]  # fmt: skip


def enclosing(tree: ast.Module, target: ast.AST) -> ast.FunctionDef | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(child is target for child in ast.walk(node)):
            if best is None or node.lineno > best.lineno:
                best = node
    return best


def resolve(node: ast.expr, module: str, trees: dict[str, ast.Module], every: dict, seen: set) -> list[str]:
    """The templates an expression in MODULE can be: itself, what a variable is set to in its
    function, what a function of mlrb's returns, `{}` for an error's own text in PASSED_ON. Fails on
    anything else."""
    found = template(node)
    if found is not None:
        return [found]
    if (module, ast.unparse(node)) in PASSED_ON:
        return ["{}"]
    if isinstance(node, ast.IfExp):
        return resolve(node.body, module, trees, every, seen) + resolve(node.orelse, module, trees, every, seen)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        lefts = resolve(node.left, module, trees, every, seen)
        return [a + b for a in lefts for b in resolve(node.right, module, trees, every, seen)]
    if isinstance(node, ast.Name):
        function = enclosing(trees[module], node)
        values = [
            a.value
            for a in ast.walk(function or trees[module])
            if isinstance(a, ast.Assign | ast.AnnAssign) and a.value is not None
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
            if getattr(t, "id", None) == node.id
        ]
        if values:
            return [t for v in values for t in resolve(v, module, trees, every, seen)]
    if isinstance(node, ast.Call) and called_name(node) in every:
        name = called_name(node)
        if name in seen:
            return []
        seen.add(name)
        returns = [(where, r.value) for where, function in every[name] for r in ast.walk(function)
                   if isinstance(r, ast.Return) and r.value is not None]  # fmt: skip
        return [t for where, r in returns for t in resolve(r, where, trees, every, seen)]
    raise AssertionError(f"{module}:{node.lineno}: the message {ast.unparse(node)} is not a string this test can "
                         "read: make it one, or add it to PASSED_ON with the reason")  # fmt: skip


def messages_in_code() -> dict[str, str]:
    """Every one-line error's template (normalised) -> where it is (module:line)."""
    trees = {
        str(path.relative_to(PACKAGE)): ast.parse(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
        if "starter" not in path.relative_to(PACKAGE).parts
    }
    classes = error_classes(trees)
    every: dict[str, list] = {}
    for module, tree in trees.items():
        for name, function in functions(tree).items():
            every.setdefault(name, []).append((module, function))
    found: dict[str, str] = {}
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call | ast.FunctionDef):
                continue
            where = f"{module}:{node.lineno}"
            if isinstance(node, ast.FunctionDef) and node.name in ONE_LINE_FUNCTIONS:
                texts = [t for m in raised_in(node) for t in resolve(m, module, trees, every, set())]
            elif isinstance(node, ast.FunctionDef):
                continue
            elif called_name(node) in classes and node.args:
                texts = resolve(node.args[0], module, trees, every, set())
            elif (
                called_name(node) == "print"
                and module not in NOT_COMMANDS
                and any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in node.keywords)
            ):
                texts = [PREFIX.sub("", t) for t in resolve(node.args[0], module, trees, every, set())]
            else:
                continue
            for text in texts:
                if normal(text) not in ("{}", ""):  # an error's own text, printed: listed where it is raised
                    found.setdefault(normal(text), where)
    return found


def messages_on_page() -> list[str]:
    """The templates the page lists: each list item's leading `code`."""
    items = re.finditer(r"^- (`+) ?(.+?) ?\1(?!`)", PAGE.read_text(), re.MULTILINE)  # `text` or `` text ``
    return [normal(m.group(2)) for m in items]


@pytest.mark.fast
def test_the_troubleshooting_page_lists_every_one_line_error_and_no_other():
    in_code = messages_in_code()
    assert len(in_code) > 100, len(in_code)  # the extraction finds them: ConfigError alone has over 100
    listed = messages_on_page()
    missing = [f"{where}: {text}" for text, where in sorted(in_code.items(), key=lambda kv: kv[1])
               if text not in listed]  # fmt: skip
    assert not missing, "not on docs/troubleshooting.md:\n" + "\n".join(missing)
    stale = [text for text in listed if text not in in_code]
    assert not stale, "on docs/troubleshooting.md, but no longer in the code:\n" + "\n".join(stale)
    assert len(listed) == len(set(listed)), "listed twice: " + ", ".join({t for t in listed if listed.count(t) > 1})
