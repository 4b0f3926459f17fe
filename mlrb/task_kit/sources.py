"""The code a task's built assets depend on, as one digest in their cache key.

The calibration stored with the assets is measured by the task's builder and scorer,
so assets built by other code are other assets: a changed builder, starter file or
scorer gets them built again, without anyone remembering to bump a version by hand.
The code is the task's package folder (its starter files included, its config and page not) and,
transitively, the task packages and modules of `mlrb.tasks`, `mlrb.task_kit` and `mlrb.scoring` that it imports.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

MLRB = Path(__file__).resolve().parent.parent
WATCHED = ("mlrb.tasks", "mlrb.task_kit", "mlrb.scoring")  # where the code that makes and scores assets lives


def digest(package_dir: Path) -> str:
    """SHA-256 (16 hex digits) of the task package at package_dir and what it imports."""
    return _digest(Path(package_dir).resolve())


@functools.cache
def _digest(package_dir: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(closure(package_dir)):
        # Named as inside the package, so that a clone and an installed copy agree.
        name = path.relative_to(MLRB if path.is_relative_to(MLRB) else package_dir.parent)
        h.update(f"{name}\0".encode())
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def closure(package_dir: Path) -> set[Path]:
    """Every file of package_dir (caches aside), and the files of the watched modules its Python
    files import, followed transitively."""
    files: set[Path] = set()
    todo = [package_dir, MLRB / "tasks" / "base.py", MLRB / "tasks" / "handling.py"]
    seen: set[Path] = set()
    while todo:
        place = todo.pop()
        if place in seen or not place.exists():
            continue
        seen.add(place)
        found = (
            [place]
            if place.is_file()
            else [
                p
                for p in place.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and not is_config_or_page(p, place)
            ]
        )
        files.update(found)
        for path in found:
            if path.suffix == ".py":
                todo.extend(imported_places(path))
    return files


def is_config_or_page(path: Path, package_dir: Path) -> bool:
    """A task folder's config (task.yaml, shared values) or its page (page.md): the config's values
    that make the assets are in their key already (the scale's spec), and the rest (a prompt, a
    time limit) makes none; nor does the page."""
    return path.parent == package_dir and path.suffix in (".yaml", ".md")


def imported_places(path: Path) -> list[Path]:
    """The watched task packages (folders) and modules (files) that a Python file imports."""
    try:
        tree = ast.parse(path.read_bytes())
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    places = []
    for name in names:
        if not name.startswith(WATCHED):
            continue
        parts = name.split(".")[1:]  # below mlrb
        if parts[0] == "tasks" and len(parts) > 1 and (MLRB / "tasks" / parts[1]).is_dir():
            places.append(MLRB / "tasks" / parts[1])  # a whole task package
            continue
        for n in range(len(parts), 0, -1):  # the longest prefix that is a module file
            module = MLRB.joinpath(*parts[:n]).with_suffix(".py")
            if module.is_file():
                places.append(module)
                break
    return places
