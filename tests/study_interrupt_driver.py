"""Run ``axiomformer study`` in this process with Ctrl-C delivered at fixed points of the work, not at a time.

Usage: ``python tests/study_interrupt_driver.py MODE -- <study arguments>``. Each MODE sends a real SIGINT to this
process (or to its whole process group, as a terminal's Ctrl-C does) from inside the study:

* ``after-run-K``: once the K-th run is stored (counted in this process);
* ``kill-after-run-K``: SIGKILL (``kill -9``) instead, once the K-th run is stored;
* ``twice``: once the first run is stored, and again while the study cleans up (closing the store);
* ``workers``: once the first run is stored (to the process group: workers get it too), and prints the worker pids
  (one line ``workers: <pid> ...`` on stdout) so the caller can check they are gone.
"""

import os
import signal
import sys

from axiomformer.study import runner, store

mode = sys.argv[1] if __name__ == "__main__" else "worker"  # spawned workers import this file again
stored = []
real_add, real_close, real_init = store.ResultsStore.add_run, store.ResultsStore.close, runner.worker_init


def add_run(self, row):
    inserted = real_add(self, row)
    stored.append(row.key)
    if "after-run-" in mode and len(stored) == int(mode.rsplit("-", 1)[1]):
        os.kill(os.getpid(), signal.SIGKILL if mode.startswith("kill") else signal.SIGINT)
    elif mode in ("twice", "workers") and len(stored) == 1:
        if mode == "workers":
            children = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == os.getpid()]
            print("workers:", *children, flush=True)
            os.killpg(os.getpgid(0), signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)
    return inserted


def close(self):
    if mode == "twice" and stored:
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the study cleans up
    real_close(self)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


if __name__ == "__main__":
    store.ResultsStore.add_run, store.ResultsStore.close = add_run, close
    from axiomformer.cli import app

    sys.argv = ["axiomformer", *sys.argv[sys.argv.index("--") + 1 :]]
    app()
