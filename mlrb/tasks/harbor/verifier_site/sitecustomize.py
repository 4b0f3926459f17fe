"""mlrb's start-up file for every Python a Harbor verifier runs (its folder, read-only, is the
verifier's PYTHONPATH; mlrb/tasks/harbor/verifier.py).

Python puts the working folder (or its script's folder) first on sys.path, where a `pytest.py` or
a `pluggy/` the agent left in the workspace would stand in for the test runner and its plugins.
At the first import after that, before any of the program's code runs, that folder is taken back
out when it is the workspace's copy and searched last instead, for module names only (a finder
at the end of sys.meta_path): a test still imports the agent's own module, while nothing
installed can be replaced and no package metadata there (a pytest plugin's entry point) is read.

It also has pytest load mlrb_pytest_report (PYTEST_PLUGINS, read as pytest starts). A test.sh
that replaces PYTHONPATH loses both: its Python is then as Harbor's, and its pytest, reporting
nothing, backs no reward."""

import importlib.machinery
import os
import sys

COPY = os.environ.get("MLRB_VERIFIER_COPY", "")  # where the verifier sees the copy, os.pathsep-separated
PLUGIN = "mlrb_pytest_report"


class WorkspaceFinder:
    """Finds a top-level module in the workspace's copy, asked only once no other finder has it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if path is not None:  # a submodule: its package's own __path__ finds it
            return None
        return importlib.machinery.PathFinder.find_spec(name, [self.folder])


class FirstImport:
    """Asked first for the first import after start-up, when Python has just put its first folder
    on sys.path: moves that folder to the end when it is the copy. Finds nothing itself."""

    def __init__(self) -> None:
        self.before: list[str] | None = list(sys.path)

    def find_spec(self, name, path=None, target=None):
        before, self.before = self.before, None
        if before is not None and len(sys.path) == len(before) + 1 and sys.path[1:] == before:
            folder = sys.path[0] or os.getcwd()  # "" (-c, standard input): the working folder
            if in_copy(folder):
                del sys.path[0]
                sys.meta_path.append(WorkspaceFinder(folder))
        return None


def in_copy(folder: str) -> bool:
    real = os.path.realpath(folder)
    copies = [os.path.realpath(path) for path in COPY.split(os.pathsep) if path]
    return any(real == copy or real.startswith(copy + os.sep) for copy in copies)


sys.meta_path.insert(0, FirstImport())
plugins = [name for name in os.environ.get("PYTEST_PLUGINS", "").split(",") if name]
os.environ["PYTEST_PLUGINS"] = ",".join(plugins if PLUGIN in plugins else [*plugins, PLUGIN])
