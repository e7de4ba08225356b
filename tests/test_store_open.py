"""Opening one new study store from several connections at once: the switch to WAL waits for a lock held by
another opener (SQLite's busy timeout does not apply to it) instead of failing with 'database is locked'."""

import sqlite3
import threading
import time

import pytest

from axiomformer.study.store import ResultsStore


def _hold_lock(path, seconds):
    other = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process half-way through creating the store
    timer = threading.Timer(seconds, lambda: (other.execute("COMMIT"), other.close()))
    timer.start()
    return timer


def test_a_plain_wal_switch_fails_while_another_opener_holds_the_lock(tmp_path):
    """The planted fault: without the wait, the second opener dies at once."""
    path = tmp_path / "results.sqlite"
    timer = _hold_lock(path, 0.5)
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()
        timer.join()


def test_store_open_waits_for_the_other_opener(tmp_path):
    path = tmp_path / "results.sqlite"
    timer = _hold_lock(path, 0.5)
    start = time.monotonic()
    with ResultsStore(path) as store:
        store.set_meta("hello", 1)
        assert store.get_meta("hello") == 1
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    timer.join()
    assert time.monotonic() - start >= 0.4  # it waited for the lock rather than failing
