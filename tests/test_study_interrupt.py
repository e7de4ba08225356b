"""Ctrl-C and kill -9 on ``axiomformer study``, without timing: each signal is sent from inside the study at a
fixed point of its work (``tests/study_interrupt_driver.py``), and waits are for events, never for durations."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_study import tiny_study_toml

TESTS = Path(__file__).parent


def _config(tmp_path: Path, workers: int = 1, steps: int = 4) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(
        tiny_study_toml(
            name="interrupt test", seeds=2, variants=("standard", "A4=cosine"), baselines=("gru",), steps=steps
        ).replace("workers = 1", f"workers = {workers}")
    )
    return path


def _drive(mode: str, config: Path, out: Path, **kwargs) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(TESTS.parent / "src"), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )
    command = [
        sys.executable,
        str(TESTS / "study_interrupt_driver.py"),
        mode,
        "--",
        "study",
        "--config",
        str(config),
        "--out",
        str(out),
        "--no-progress",
    ]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, start_new_session=True, **kwargs
    )


def _keys(out: Path) -> list[str]:
    db = sqlite3.connect(out / "results.sqlite")
    try:
        return [r[0] for r in db.execute("SELECT key FROM runs")]
    finally:
        db.close()


def _stderr_lines(done) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.slow
def test_ctrl_c_after_the_kth_run_exits_130_with_one_line_and_resumes(tmp_path):
    config, out = _config(tmp_path), tmp_path / "study"
    done = _drive("after-run-2", config, out)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    lines = _stderr_lines(done)
    assert len(lines) == 1 and lines[0].startswith("interrupted:") and f"--out {out}" in lines[0]
    assert len(_keys(out)) == 2  # the interrupt came right after the second run
    resumed = _drive("none", config, out)
    assert resumed.returncode == 0, resumed.stderr
    keys = _keys(out)
    assert len(keys) == len(set(keys)) > 2


@pytest.mark.slow
def test_a_second_ctrl_c_ends_at_once_with_one_line_and_exit_130(tmp_path):
    done = _drive("twice", _config(tmp_path), tmp_path / "study")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert _stderr_lines(done) == ["interrupted again: stopped at once; finished runs are stored"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], limit: float = 120.0) -> list[int]:
    """The pids still alive once they are all gone or ``limit`` seconds passed (a safety net, not a measurement:
    the kernel kills them when their parent dies)."""
    deadline = time.monotonic() + limit
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


@pytest.mark.slow
def test_ctrl_c_with_workers_stops_them_and_prints_no_traceback(tmp_path):
    done = _drive("workers", _config(tmp_path, workers=2), tmp_path / "study")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert len(_stderr_lines(done)) == 1
    pids = [int(p) for p in done.stdout.split("workers:")[1].split()]
    assert pids and _wait_gone(pids) == []


DRIVER = """
import os, sys, threading, time
import sleeper
from axiomformer.study import runner

runner.execute_in_worker = sleeper.forever            # runs that never end (importable: the workers are spawned)


class Run:
    train_config, save_state, state_path, key = {}, False, None, "stand-in|run"


def workers():
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{pid}/cmdline") as f:
                command = f.read()
        except (OSError, IndexError):
            continue                                  # a process that came and went
        if parent == str(os.getpid()) and "spawn_main" in command:
            found.append(pid)
    return found


def report():
    while len(workers()) < 2:
        time.sleep(0.05)
    print(" ".join(workers()), flush=True)


threading.Thread(target=report, daemon=True).start()
next(runner._pool([Run(), Run()], 1, 2, "."))          # the main thread starts the pool and waits, as a study does
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_workers_exit_when_the_study_is_killed(tmp_path):
    # A driver that starts the study's worker pool with runs that never end, reports the worker pids, and waits.
    (tmp_path / "sleeper.py").write_text("import time\n\n\ndef forever(*args):\n    time.sleep(3600)\n")
    (tmp_path / "driver.py").write_text(DRIVER)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        workers = [int(p) for p in driver.stdout.readline().split()]
        assert len(workers) == 2
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    assert _wait_gone(workers) == []
