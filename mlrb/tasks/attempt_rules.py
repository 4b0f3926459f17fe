"""A task's rules for an attempt: the part that says what is scored, what the agent may not
change, whether it may reach the network, and which of the rules the task states nothing
enforces. The harness reads them from here: the sandbox (network), the run and
the rescorers (the submission, the read-only files restored before scoring), the run's tags
and the report (the rules no score can vouch for).

What a submission itself must be (its format, size, lineage) is checked by each task's
scorer, with the checks of rules.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Rules:
    # The file or folder in the workspace that is scored.
    submission: str
    # Whether the agent's sandbox may reach the network.
    network: bool = False
    # Workspace globs that are restored before scoring.
    read_only: tuple[str, ...] = ()
    # A file of the assets that lists more of them, one glob a line (a task folder's
    # hidden/read_only_files.txt); None: none.
    read_only_listed_in: str | None = None
    # Rules stated to the agent that nothing checks: id -> why.
    unenforced: Mapping[str, str] = field(default_factory=dict)

    def read_only_globs(self, assets: Path) -> list[str]:
        """The globs restored before scoring, the assets' list included."""
        listed = read_globs(Path(assets) / self.read_only_listed_in) if self.read_only_listed_in else []
        return list(self.read_only) + listed


def read_globs(file: Path) -> list[str]:
    """One glob a line, relative to the workspace; blank lines and # comments skipped; no file: none."""
    if not file.is_file():
        return []
    lines = (line.strip() for line in file.read_text().splitlines())
    return [line[2:] if line.startswith("./") else line for line in lines if line and not line.startswith("#")]
