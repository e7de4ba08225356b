"""What a newcomer hit (issue 36): ``flow --out`` and ``bench --out`` in a folder that cannot be written fail at
once with one ``error:`` line (before any computing); ``train --checkpoint x.safetensors`` writes that file;
``audit module:myattn:Attn`` finds ``myattn.py`` in the current folder; ``train --help`` says how threads are
chosen."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "src"


def _without_root_powers() -> list[str] | None:
    """A command prefix under which file modes apply (root drops its override capabilities); None: impossible."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def _cli(args: list[str], cwd: Path | None = None, prefix: list[str] | None = None, timeout: float = 120):
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*(prefix or []), sys.executable, "-m", "axiomformer", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args", [["flow", "--quick", "--quiet"], ["bench", "--quick", "--variants", "standard"]], ids=["flow", "bench"]
)
@pytest.mark.parametrize("where", ["the folder", "a new folder inside"])
def test_an_unwritable_out_folder_fails_at_once_with_one_error_line(tmp_path, args, where):
    prefix = _without_root_powers()
    if prefix is None:
        pytest.skip("root without setpriv: file modes cannot be made to apply")
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, stat.S_IRUSR | stat.S_IXUSR)
    out = locked if where == "the folder" else locked / "new"
    try:
        # a timeout of 60 s: the check must come before the minutes of computing
        done = _cli([*args, "--out", str(out)], prefix=prefix, timeout=60)
    finally:
        os.chmod(locked, stat.S_IRWXU)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: --out {out}: cannot write in {locked}") and done.stderr.count("\n") == 1
    assert list(locked.iterdir()) == []  # nothing created, no probe left
