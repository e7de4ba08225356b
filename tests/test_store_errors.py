"""The results store: read-only access works wherever nothing is written, a closed store is one file (no -wal/-shm
left behind, also after reading it), every error surfaces as what it is (a full disk as a full disk), and a failed
write leaves nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from axiomformer.study.store import ResultsStore, StoreError

ROW = dict(
    key="k1",
    label="standard",
    model="transformer",
    spec="",
    assumptions={},
    task="copy",
    seq_len=8,
    task_config={},
    seed=0,
    dim=16,
    layers=1,
    train_config={},
)


def _store_with_one_run(folder: Path) -> Path:
    with ResultsStore(folder) as store:
        store.set_meta("config", {"name": "archived"})
        store.add_run(ROW)
    return folder / "results.sqlite"


def _side_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(("-wal", "-shm", "-journal")))


def test_a_closed_store_is_one_file_and_reading_it_leaves_no_side_files(tmp_path):
    _store_with_one_run(tmp_path)
    assert _side_files(tmp_path) == []
    before = (tmp_path / "results.sqlite").read_bytes()
    with ResultsStore(tmp_path, readonly=True) as store:
        assert store.count() == 1 and store.get_meta("config") == {"name": "archived"}
        assert _side_files(tmp_path) == []
    assert _side_files(tmp_path) == [] and (tmp_path / "results.sqlite").read_bytes() == before


def test_a_reader_sees_what_a_live_writer_committed(tmp_path):
    with ResultsStore(tmp_path) as writer:
        writer.add_run(ROW)
        assert (tmp_path / "results.sqlite-wal").exists()  # the writer is live: WAL mode
        with ResultsStore(tmp_path, readonly=True) as reader:
            assert reader.count() == 1


def test_a_read_only_store_refuses_writes_with_one_clear_error(tmp_path):
    _store_with_one_run(tmp_path)
    with ResultsStore(tmp_path, readonly=True) as store:
        with pytest.raises(StoreError, match="read-only"):
            store.add_run(dict(ROW, key="k2"))
        with pytest.raises(StoreError, match="read-only"):
            store.set_meta("x", 1)
        assert store.count() == 1


def test_readonly_of_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        ResultsStore(tmp_path / "nothing", readonly=True)
    assert not (tmp_path / "nothing").exists()


def test_a_full_disk_is_reported_as_a_full_disk_and_nothing_is_half_written(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.add_run(ROW)
        pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
        store.conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
        with pytest.raises(StoreError, match="full") as err:
            store.add_run(dict(ROW, key="k2", losses=[0.5] * 20000))
        assert "rollback" not in str(err.value)
        assert store.count() == 1 and store.finished_keys() == {"k1"}
        store.conn.execute(f"PRAGMA max_page_count = {2**30}")
        store.add_run(dict(ROW, key="k2"))  # and the store goes on
        assert store.count() == 2


def test_the_full_disk_check_sees_the_rollback_error_masking_it(tmp_path):
    # The planted fault: a rollback after SQLite already rolled back raises its own error instead.
    conn = sqlite3.connect(str(tmp_path / "x.sqlite"), isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="cannot rollback"):
        conn.execute("ROLLBACK")


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    with ResultsStore(tmp_path) as store:
        real = store.conn.cursor

        class Interrupting:
            def __init__(self):
                self.cur, self.calls = real(), 0

            def execute(self, sql, params=()):
                self.calls += 1
                if self.calls == 3:  # after the INSERT, before the COMMIT
                    raise KeyboardInterrupt
                return self.cur.execute(sql, params)

            def __getattr__(self, name):
                return getattr(self.cur, name)

        monkeypatch.setattr(
            store,
            "conn",
            type(
                "C",
                (),
                {
                    "cursor": lambda self: Interrupting(),
                    "in_transaction": property(lambda self: True),
                    "execute": lambda self, *a: real().execute(*a),
                },
            )(),
        )
        with pytest.raises(KeyboardInterrupt):
            store.add_run(ROW)
        monkeypatch.undo()
        assert store.count() == 0


def _without_root_powers() -> list[str] | None:
    """A command prefix that drops root's permission override (so file modes apply), or None where impossible."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def test_a_store_in_a_read_only_folder_is_read_and_writing_says_why(tmp_path):
    prefix = _without_root_powers()
    if prefix is None:
        pytest.skip("root without setpriv: file modes cannot be made to apply")
    folder = tmp_path / "archive"
    _store_with_one_run(folder)
    os.chmod(folder / "results.sqlite", stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        script = (
            "import sys\nfrom axiomformer.study.store import ResultsStore, StoreError\n"
            "with ResultsStore(sys.argv[1]) as s:\n    print(s.count(), s.get_meta('config')['name'])\n"
            "    try:\n        s.set_meta('x', 1)\n    except StoreError as e:\n        print('refused', e)\n"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            prefix + [sys.executable, "-c", script, str(folder)], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "1 archived"
        assert lines[1].startswith("refused cannot write") and "read" in lines[1]
        assert _side_files(folder) == []
    finally:
        os.chmod(folder, stat.S_IRWXU)


def test_reading_a_committed_store_leaves_no_side_files(tmp_path):
    from axiomformer.study.report import study_json

    committed = Path(__file__).parent.parent / "benchmarks" / "results" / "study-default" / "results.sqlite"
    if not committed.is_file():
        pytest.skip("no committed study store in this checkout")
    shutil.copy(committed, tmp_path / "results.sqlite")
    before = (tmp_path / "results.sqlite").read_bytes()
    assert study_json(tmp_path)["cells"]
    assert _side_files(tmp_path) == [] and (tmp_path / "results.sqlite").read_bytes() == before


@pytest.mark.slow
def test_report_in_a_read_only_folder_answers_json_and_refuses_files_in_one_line(tmp_path):
    prefix = _without_root_powers()
    committed = Path(__file__).parent.parent / "benchmarks" / "results" / "study-default" / "results.sqlite"
    if prefix is None or not committed.is_file():
        pytest.skip("needs file modes that apply and the committed study store")
    folder = tmp_path / "archive"
    folder.mkdir()
    shutil.copy(committed, folder / "results.sqlite")
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MPLBACKEND": "Agg"}
    try:
        files = subprocess.run(
            prefix + [sys.executable, "-m", "axiomformer", "report", str(folder)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert files.returncode == 2 and "Traceback" not in files.stderr
        assert len(files.stderr.strip().splitlines()) == 1 and files.stderr.startswith("error: ")
        verdicts = subprocess.run(
            prefix + [sys.executable, "-m", "axiomformer", "report", str(folder), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert verdicts.returncode == 0, verdicts.stderr
        assert json.loads(verdicts.stdout)["cells"]
        assert _side_files(folder) == []
    finally:
        os.chmod(folder, stat.S_IRWXU)


def test_report_json_is_a_reader_and_writes_nothing(tmp_path):
    """``axiomformer report DIR --json`` prints the verdicts and leaves the folder as it was: no report.md, report.html
    or figures/ appear (only ``report`` without --json rebuilds them)."""
    from typer.testing import CliRunner

    from axiomformer.cli import app

    committed = Path(__file__).parent.parent / "benchmarks" / "results" / "study-default" / "results.sqlite"
    if not committed.is_file():
        pytest.skip("no committed study store in this checkout")
    shutil.copy(committed, tmp_path / "results.sqlite")
    done = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert done.exit_code == 0, done.output
    assert '"cells"' in done.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite"]
