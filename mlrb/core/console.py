"""A quiet console by default, a complete log file always.

The console of a run shows mlrb's own lines, warnings and errors; libraries'
progress bars, their INFO lines and Python warnings (FutureWarning and the like)
go to the run's log file only, unless `verbose=true`. Nothing is dropped from
the log file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: `extra=` for a record that belongs in the log file only, such as a failure's traceback:
#: the console says the failure in one line that names the log file (shown with verbose=true).
LOG_FILE_ONLY = {"log_file_only": True}


class ConsoleFilter(logging.Filter):
    """mlrb's records at any level; a library's from WARNING up; Python warnings never (they are in
    the log file); nor records meant for the log file only."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "py.warnings" or getattr(record, "log_file_only", False):
            return False
        return record.name == "mlrb" or record.name.startswith("mlrb.") or record.levelno >= logging.WARNING


def log_file() -> str | None:
    """The path of the run's log file, where one is being written."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.baseFilename
    return None


def log_file_stream() -> Any | None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return handler.stream
    return None


def move_log(folder: Path) -> None:
    """Write the run's log file in FOLDER from now on (a resumed run's folder), appended to
    the one there."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.acquire()
            try:
                handler.close()
                handler.baseFilename = str(Path(folder) / Path(handler.baseFilename).name)
                handler.mode = "a"
                handler.stream = handler._open()
            finally:
                handler.release()


@contextlib.contextmanager
def quiet(verbose: bool) -> Iterator[None]:
    """While a run runs: library noise to its log file only (unless verbose)."""
    logging.captureWarnings(True)  # warnings become log records, so the log file has them
    log_file = log_file_stream()
    if verbose or log_file is None:
        yield
        return
    console = [h for h in logging.getLogger().handlers if not isinstance(h, logging.FileHandler)]
    console_filter = ConsoleFilter()
    for handler in console:
        handler.addFilter(console_filter)
    # Standard error itself (file descriptor 2) goes to the log file: progress bars, and what
    # libraries' own subprocesses say there (lm-eval runs `git` in the current folder).
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log_file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        for handler in console:
            handler.removeFilter(console_filter)
