"""What a task folder must hold, by layout, and how the layout is told apart.

Both benchmarks package a task as `env/` (what the agent sees, copied into its
workspace) and `scripts/` (hidden from the agent): `research_problem.txt` (the
prompt), `eval.py` with `get_score(folder)`, and optionally `prepare.py` (run once
to fetch or make data) and `read_only_files.txt` (globs the agent must not change).
MLRC-Bench adds a fixed entry point, `env/main.py -m METHOD -p dev|test`, the
methods behind it in `env/methods/`, and, hidden, the test split in
`scripts/test_data/` (copied over the workspace's `data/` for the test phase) and
`scripts/test_constants.py` (copied over `constants.py`).
"""

from __future__ import annotations

from pathlib import Path

from mlrb.core.config import ConfigError

FORMATS = ("mlagentbench", "mlrc")
REQUIRED = {
    "mlagentbench": ["env/", "scripts/research_problem.txt", "scripts/eval.py"],
    "mlrc": ["env/", "env/main.py", "scripts/research_problem.txt", "scripts/eval.py"],
}


def detect(folder: Path) -> str:
    """mlrc when the folder has MLRC-Bench's entry point and methods, else mlagentbench."""
    env = folder / "env"
    return "mlrc" if (env / "main.py").is_file() and (env / "methods").is_dir() else "mlagentbench"


def check(path: str, format: str) -> Path:
    """The task folder, checked: a ConfigError naming the first thing missing."""
    if not path:
        raise ConfigError("task.path is not set: give the task folder, e.g. task.path=/path/to/house-price")
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"task.path '{path}' is not a folder: give a task folder with env/ and scripts/")
    if format not in FORMATS:
        raise ConfigError(f"unknown task.format '{format}'; valid choices: {', '.join(FORMATS)} (or null: detected)")
    for rel in REQUIRED[format]:
        wanted = folder / rel.rstrip("/")
        if not (wanted.is_dir() if rel.endswith("/") else wanted.is_file()):
            needs = ", ".join(REQUIRED[format])
            raise ConfigError(f"task folder {folder} has no {rel} (a {format} task needs {needs})")
    return folder
