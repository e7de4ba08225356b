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
        [*(prefix or []), sys.executable, "-P", "-m", "axiomformer", *args],
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


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from axiomformer.cli import app

    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", ".json"])
def test_a_checkpoint_named_like_a_file_is_refused_before_training(tmp_path, suffix):
    target = tmp_path / f"tiny{suffix}"
    done = _invoke(["train", "--task", "copy", "--steps", "1", "--checkpoint", str(target)])
    assert done.exit_code == 2 and "a checkpoint is a folder" in done.output and "--checkpoint" in done.output
    assert str(tmp_path / "tiny") in done.output  # the folder name it suggests
    assert not target.exists()  # no folder named like a file


@pytest.mark.parametrize(("dim", "threads", "expected"), [(32, None, [1]), (256, None, []), (32, 3, [3])])
def test_train_s_default_threads_follow_the_model_width(monkeypatch, dim, threads, expected):
    import torch

    import axiomformer.train

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)

    def stop(*args, **kwargs):
        raise ValueError("stopped before training")

    monkeypatch.setattr(axiomformer.train, "train", stop)
    args = ["train", "--task", "copy", "--dim", str(dim), "--device", "cpu"]
    done = _invoke(args + ([] if threads is None else ["--threads", str(threads)]))
    assert done.exit_code == 2 and "stopped before training" in done.output
    assert calls == expected


def test_audit_finds_a_module_in_the_current_folder(tmp_path):
    (tmp_path / "myattn_issue36.py").write_text(
        "import torch.nn.functional as F\n\n\ndef attn(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)\n"
    )
    # python -P: the current folder is not put on sys.path, as with the installed `axiomformer` script
    found = _cli(["audit", "module:myattn_issue36:attn", "--json"], cwd=tmp_path, prefix=[], timeout=300)
    assert found.returncode == 0, found.stderr


def test_the_current_folder_is_on_sys_path_only_during_the_import(tmp_path, monkeypatch):
    from axiomformer.audit.adapters import _import_here_too

    (tmp_path / "myattn_issue36b.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    before = list(sys.path)
    assert _import_here_too("myattn_issue36b").X == 1
    assert sys.path == before
    sys.modules.pop("myattn_issue36b")
    with pytest.raises(
        ModuleNotFoundError, match=f"No module named 'not_here_issue36' on sys.path or in the current folder {tmp_path}"
    ):
        _import_here_too("not_here_issue36")
    assert sys.path == before
