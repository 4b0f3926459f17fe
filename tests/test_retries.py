"""The tracking store's retry policy (mlrb/core/retries.py) against a real SQLite lock: a write
waits while another connection holds the database, and other errors are not retried.
(The LLM agent's policy is tested through its runs in test_llm_agent.py.)"""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from mlrb.core.retries import STORE_LOCKED, with_retries

pytestmark = pytest.mark.fast


def test_a_store_call_waits_while_another_writer_holds_the_sqlite_lock(tmp_path):
    db = tmp_path / "store.db"
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("create table runs (name text)")
    holder.execute("begin exclusive")  # another process's write in progress
    release = threading.Timer(1.0, lambda: holder.execute("commit"))
    release.start()
    writer = sqlite3.connect(db, timeout=0, isolation_level=None)  # no wait of the driver's own
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        writer.execute("insert into runs values ('a')")
    started = time.monotonic()
    with_retries(writer.execute, "insert into runs values (?)", ("b",))
    assert time.monotonic() - started >= 0.9
    assert writer.execute("select name from runs").fetchall() == [("b",)]
    release.join()


def test_other_store_errors_are_raised_at_once(tmp_path):
    writer = sqlite3.connect(tmp_path / "store.db")
    tries = []

    def insert() -> None:
        tries.append(1)
        writer.execute("insert into no_such_table values (1)")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        with_retries(insert)
    assert len(tries) == 1


def test_the_store_waits_on_a_doubling_schedule_with_jitter_up_to_its_cap():
    pauses = [STORE_LOCKED.pause_s(n) for n in range(1, STORE_LOCKED.retries + 1)]
    for n, pause in enumerate(pauses, start=1):
        plain = min(0.2 * 2 ** (n - 1), 5.0)
        assert plain <= pause <= 2 * plain
    assert sum(pauses) >= 30  # a busy sweep's writers get half a minute at least before one gives up
