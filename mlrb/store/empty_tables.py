"""MLflow's tables for a new SQLite store, copied from an empty store this MLflow made once.

MLflow makes a SQLite store's tables by running each of its schema migrations in turn: more
than half a CPU second per new store here, and a test suite or a set of sweeps with a store
each pays it every time. So the first store made with an MLflow version is made that way, and
a copy of it without its default experiment is kept in the cache (`$MLRB_CACHE_DIR`, else
~/.cache/mlrb, in mlflow-tables/, named after the versions that shape the schema). A later new
store starts as a copy of that file: MLflow finds its tables, checks their schema as it does for
any store it opens, and adds the default experiment with the new store's artifact folder. A kept
file that holds an experiment or a run, or that MLflow refuses, is removed and the store is made
by the migrations again. Nothing here
fails a store's creation: a cache that cannot be written is only not used."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)


@functools.cache
def kept_path() -> Path:
    """Where this MLflow's empty store is kept: its name changes with MLflow's version and
    migrations, SQLAlchemy's version and SQLite's."""
    import mlflow
    import sqlalchemy

    migrations = Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions"
    names = sorted(path.name for path in migrations.glob("*.py"))
    shaped_by = [mlflow.__version__, sqlalchemy.__version__, sqlite3.sqlite_version, *names]
    digest = hashlib.sha256("\n".join(shaped_by).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("MLRB_CACHE_DIR") or "~/.cache/mlrb").expanduser()
    return cache / "mlflow-tables" / f"mlflow-{mlflow.__version__}-{digest}.db"


def copy_to(db: Path) -> bool:
    """DB as a copy of the kept empty store; False where there is none yet, or where the kept file
    is not an empty store (then removed). A full disk raises (OSError), as creating the tables would."""
    kept = kept_path()
    if not kept.is_file():
        return False
    try:
        shutil.copyfile(kept, db)
    except OSError as e:
        if not kept.exists():
            return False  # removed meanwhile: another process found it refused
        raise OSError(e.errno, e.strerror, str(db)) from None  # the copy's error may name the kept file
    if not holds_nothing(db):
        forget()
        db.unlink(missing_ok=True)
        return False
    return True


def holds_nothing(db: Path) -> bool:
    """Whether DB is a SQLite database with no experiment and no run: a new store starts empty."""
    return all(rows(db, table) == 0 for table in ("experiments", "runs"))


def rows(db: Path, table: str) -> int | None:
    """How many rows TABLE of the SQLite database DB holds, read only; None where it cannot be read
    (not a database, no such table)."""
    try:
        connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        finally:
            connection.close()
    except sqlite3.Error:
        return None


def keep(db: Path) -> None:
    """Keep a copy of DB, a store MLflow has just made, without its default experiment (the
    experiment's artifact folder is DB's own), for the next new store."""
    kept = kept_path()
    if kept.is_file():
        return
    partial = kept.with_name(f"{kept.stem}.{os.getpid()}.creating")
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(db, partial)
        connection = sqlite3.connect(partial)
        try:
            with connection:
                connection.execute("DELETE FROM experiments WHERE experiment_id = 0")
        finally:
            connection.close()
        os.replace(partial, kept)  # whole or not at all: new stores may be made at once
    except (OSError, sqlite3.Error) as e:
        log.debug("an empty MLflow store is not kept in %s: %s", kept.parent, e)
        with contextlib.suppress(OSError):  # as where the folder could not be made
            partial.unlink(missing_ok=True)


def forget() -> None:
    """The kept copy, refused, removed: the next new store is made by the migrations."""
    log.warning("the empty store kept in %s was refused; removed, and this store made afresh", kept_path())
    kept_path().unlink(missing_ok=True)
