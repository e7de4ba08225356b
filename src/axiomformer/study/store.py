"""The results store: ``results.sqlite`` in the study's out dir (standard-library ``sqlite3``).

One row per *finished* run, keyed by the run key (see ``sweep.run_key``), each committed in its own transaction, so
an interrupted study (Ctrl-C, kill) loses at most the runs in flight and a rerun skips every stored one. Besides the
runs the store keeps the study config (``meta``), audit verdicts per spec (``audits``), the derive / flow sections
(``sections``) and the errors of failed runs (``failures``, retried on the next run).

Tables:

* ``runs``: key, label, model, spec, assumptions (JSON), task, seq_len, task_config (JSON), seed, dim, layers, heads,
  params, accuracy, loss, steps, seconds (wall time of training + eval), cpu_seconds (CPU time of the process during
  the run, all threads), tokens_per_second, peak_mem_mb (MB),
  memory_source (how the peak was measured), engine,
  losses (JSON), train_config (JSON), outcome (JSON: lr, val_accuracy, val_loss, best_step, converged, stop_reason,
  history), package_version, git_commit, backend, host, finished_at (UTC ISO 8601).
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from axiomformer.errors import UserInputError
from axiomformer.study.record import RunRecord

FILENAME = "results.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    key TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    model TEXT NOT NULL,
    spec TEXT,
    assumptions TEXT NOT NULL,
    task TEXT NOT NULL,
    seq_len INTEGER NOT NULL,
    task_config TEXT NOT NULL,
    seed INTEGER NOT NULL,
    dim INTEGER NOT NULL,
    layers INTEGER NOT NULL,
    heads INTEGER,
    params INTEGER,
    accuracy REAL,
    loss REAL,
    steps INTEGER,
    seconds REAL,
    cpu_seconds REAL,
    tokens_per_second REAL,
    peak_mem_mb REAL,
    memory_source TEXT,
    engine TEXT,
    losses TEXT,
    train_config TEXT NOT NULL,
    outcome TEXT,
    package_version TEXT,
    git_commit TEXT,
    backend TEXT,
    host TEXT,
    finished_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (key TEXT PRIMARY KEY, label TEXT, task TEXT, seq_len INTEGER, seed INTEGER,
                                     error TEXT, failed_at TEXT);
CREATE TABLE IF NOT EXISTS audits (spec TEXT PRIMARY KEY, report TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sections (name TEXT PRIMARY KEY, payload TEXT NOT NULL, seconds REAL,
                                     created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

_JSON_COLUMNS = ("assumptions", "task_config", "losses", "train_config", "outcome")


def _fields(err: ValidationError) -> str:
    """A pydantic ``ValidationError`` in one line that names each offending field."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in err.errors())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class StoreError(UserInputError):
    """A results store that cannot be read or written, naming the file and SQLite's own reason (e.g. "database or
    disk is full", "attempt to write a readonly database"): what went wrong, not a follow-up error of the cleanup."""


class ResultsStore:
    """SQLite store of a study's results.

    Args:
        path: the out dir that holds ``results.sqlite`` (created when missing), or a ``*.sqlite`` file.
        readonly: open only to read (``axiomformer report``): nothing is created or written, so reading a
            committed store leaves no ``-wal``/``-shm`` files. A store that exists but cannot be written (a
            read-only file or folder) is opened this way too, and only a write raises (:class:`StoreError`). A store
            whose writer has closed is read as the single file it is (SQLite's ``immutable``); one with a
            write-ahead log beside it (a writer open, or killed) through SQLite's read-only mode.

    Use as a context manager or call :meth:`close`. A writer leaves the store as one file when it closes (the
    write-ahead log folded in, journal mode back to ``delete``) unless another process still has it open.

    Raises:
        UserInputError: ``path`` is a file where a folder is expected, or an existing file that is not a results
            store (not SQLite, or SQLite without a ``runs`` table); the file is left untouched.
        FileNotFoundError: ``readonly`` and no store at ``path``.
        StoreError: the store cannot be read or written (read-only where a write is needed, disk full, ...).
    """

    def __init__(self, path: str | Path, *, readonly: bool = False):
        path = Path(path)
        if path.suffix != ".sqlite":
            if path.exists() and not path.is_dir():
                raise UserInputError(f"{path} is a file; expected a study out dir (a folder)")
            if not readonly:
                path.mkdir(parents=True, exist_ok=True)
            path = path / FILENAME
        self.path = path
        self.readonly = readonly
        self.why_readonly = "opened with readonly=True"
        if readonly:
            self.conn = self._connect_readonly(path)
            self._check_tables(self.conn, path)
            return
        existed = path.is_file() and path.stat().st_size > 0
        try:
            self._open_writable(path, existed)
        except StoreError as err:
            if not existed or not any(word in str(err) for word in ("readonly", "read-only", "unable to open")):
                raise
            # A store that cannot be written (read-only file or folder) is still read: the first write says why.
            self.readonly, self.why_readonly = True, str(err)
            self.conn = self._connect_readonly(path)
            self._check_tables(self.conn, path)

    def _open_writable(self, path: Path, existed: bool) -> None:
        # isolation_level=None: autocommit; every write below opens its own explicit transaction.
        try:
            self.conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
        except sqlite3.OperationalError as err:
            raise StoreError(f"cannot open {path} to write: {err}") from err
        self.conn.row_factory = sqlite3.Row
        try:
            # A store being created by another process may have no table yet; `runs` is always its first.
            if existed:
                self._check_tables(self.conn, path)
            self._journal_wal()
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.executescript(_SCHEMA)
            if "outcome" not in {row[1] for row in self.conn.execute("PRAGMA table_info(runs)")}:
                self.conn.execute("ALTER TABLE runs ADD COLUMN outcome TEXT")  # a store written before the column
        except sqlite3.OperationalError as err:
            self.conn.close()
            raise StoreError(f"cannot open {path} to write: {err}") from err
        except BaseException:
            self.conn.close()
            raise

    @staticmethod
    def _connect_readonly(path: Path) -> sqlite3.Connection:
        if not path.is_file():
            raise FileNotFoundError(f"no results store at {path}")
        logged = Path(f"{path}-wal").exists()
        uri = f"{path.resolve().as_uri()}?{'mode=ro' if logged else 'immutable=1'}"
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("SELECT name FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as err:
            raise StoreError(
                f"cannot read {path}: {err} (its write-ahead log {path.name}-wal is folded in by "
                "opening the store once where its folder is writable)"
            ) from err
        except sqlite3.DatabaseError as err:
            raise UserInputError(
                f"{path} is not an axiomformer results store ({err}); expected the {FILENAME} "
                "written by axiomformer study"
            ) from None
        return conn

    @staticmethod
    def _check_tables(conn: sqlite3.Connection, path: Path) -> None:
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as err:
            conn.close()
            raise UserInputError(
                f"{path} is not an axiomformer results store ({err}); expected the {FILENAME} "
                "written by axiomformer study"
            ) from None
        if tables and "runs" not in tables:
            conn.close()
            raise UserInputError(
                f"{path} is not an axiomformer results store (an SQLite database whose tables are "
                f"{', '.join(sorted(tables))}); expected the {FILENAME} written by axiomformer study"
            )

    def _journal_wal(self, wait: float = 30.0) -> None:
        # Switching to WAL takes an exclusive lock that SQLite's busy timeout does not wait for, so processes
        # opening one new store at once retry here for as long as the timeout would have waited.
        deadline = time.monotonic() + wait
        while self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as err:
                if ("locked" not in str(err) and "busy" not in str(err)) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.05))

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if not self.readonly:
            try:
                # Leave one file: fold the write-ahead log in and drop it (fails harmlessly, and is skipped, while
                # another connection still has the store open).
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self.conn.execute("PRAGMA journal_mode=DELETE")
            except sqlite3.Error:
                pass
        self.conn.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _transaction(self, statements: list[tuple[str, tuple]]) -> list[int]:
        """Run ``statements`` in one transaction; return each one's row count. On failure nothing is written and
        the first error is raised, as a :class:`StoreError` naming the store (the rollback's own error, e.g.
        "cannot rollback - no transaction is active" after SQLite rolled back a full disk itself, is not)."""
        if self.readonly:
            raise StoreError(f"cannot write {self.path}: the store is read-only here ({self.why_readonly})")
        cur = self.conn.cursor()
        counts = []
        try:
            cur.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                cur.execute(sql, params)
                counts.append(cur.rowcount)
            cur.execute("COMMIT")
        except BaseException as err:
            if self.conn.in_transaction:
                try:
                    cur.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(err, sqlite3.Error):
                raise StoreError(f"cannot write {self.path}: {err}") from err
            raise
        return counts

    def _write(self, sql: str, params: tuple) -> int:
        return self._transaction([(sql, params)])[0]

    # ------------------------------------------------------------------ runs
    def finished_keys(self) -> set[str]:
        """Keys of every stored run."""
        return {row[0] for row in self.conn.execute("SELECT key FROM runs")}

    def add_run(self, row: Any) -> bool:
        """Insert one finished run in its own transaction; returns False (and changes nothing) if the key exists.

        ``row`` holds the ``runs`` columns (a :class:`~axiomformer.study.record.RunRecord` or its dict); JSON columns
        may be given as Python objects; ``finished_at`` defaults to now. A successful insert clears a stored failure
        of the same key.

        Raises:
            pydantic.ValidationError (a ValueError): a row that is not a valid ``RunRecord``, naming the field;
                nothing is written.
        """
        given = row.row() if isinstance(row, RunRecord) else dict(row)
        if given.get("finished_at") is None:
            given["finished_at"] = _now()
        for name in _JSON_COLUMNS:
            if isinstance(given.get(name), str):
                given[name] = json.loads(given[name])
        row = RunRecord.model_validate(given).row()
        for name in _JSON_COLUMNS:
            if name in row and not isinstance(row[name], str):
                row[name] = json.dumps(row[name], sort_keys=True)
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        counts = self._transaction(
            [
                # only an existing key is skipped: any other constraint (a NOT NULL column) raises, never silently
                (f"INSERT INTO runs ({columns}) VALUES ({marks}) ON CONFLICT(key) DO NOTHING", tuple(row.values())),
                ("DELETE FROM failures WHERE key = ?", (row["key"],)),
            ]
        )
        return counts[0] == 1

    def runs(self) -> list[RunRecord]:
        """Every stored run as a validated :class:`~axiomformer.study.record.RunRecord`, in insertion order.

        Raises:
            StoreError: a stored row that is not a valid ``RunRecord``, naming its key and the field.
        """
        out = []
        for row in self.conn.execute("SELECT * FROM runs ORDER BY rowid"):
            item = dict(row)
            for name in _JSON_COLUMNS:
                if item.get(name) is not None:
                    item[name] = json.loads(item[name])
            try:
                out.append(RunRecord.model_validate({k: v for k, v in item.items() if v is not None}))
            except ValidationError as err:
                raise StoreError(f"{self.path}: stored run {item.get('key')!r} is malformed: {_fields(err)}") from None
        return out

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    # ------------------------------------------------------------------ failures
    def add_failure(self, key: str, label: str, task: str, seq_len: int, seed: int, error: str) -> None:
        self._write(
            "INSERT OR REPLACE INTO failures VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key, label, task, seq_len, seed, error, _now()),
        )

    def failures(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM failures ORDER BY failed_at")]

    # ------------------------------------------------------------------ audits, sections, meta
    def put_audit(self, spec: str, report: dict[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO audits VALUES (?, ?, ?)", (spec, json.dumps(report), _now()))

    def audits(self) -> dict[str, dict[str, Any]]:
        return {r[0]: json.loads(r[1]) for r in self.conn.execute("SELECT spec, report FROM audits")}

    def put_section(self, name: str, payload: Any, seconds: float | None = None) -> None:
        self._write(
            "INSERT OR REPLACE INTO sections VALUES (?, ?, ?, ?)",
            (name, json.dumps(payload, default=str), seconds, _now()),
        )

    def sections(self) -> dict[str, dict[str, Any]]:
        return {
            r[0]: {"payload": json.loads(r[1]), "seconds": r[2]}
            for r in self.conn.execute("SELECT name, payload, seconds FROM sections")
        }

    def set_meta(self, key: str, value: Any) -> None:
        self._write("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value, default=str)))

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])
