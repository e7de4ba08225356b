"""A library does not change its host process: no floating-point, thread, allocator or environment changes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

import axiomformer
from axiomformer import Attention, AttentionSpec

ROOT = Path(axiomformer.__file__).parent

FORBIDDEN = {
    "environment write": (r"os\.environ\s*\[[^\]]*\]\s*=|os\.environ\.(setdefault|update|pop)\(|os\.putenv\(|"
                          r"del os\.environ", ()),
    "flush-to-zero": (r"set_flush_denormal\(", ("runtime.py",)),
    "thread count": (r"set_num_threads\(", ("runtime.py", "commands/")),
    "pyplot backend switch": (r"matplotlib\.use\(|import matplotlib\.pyplot", ()),
    "allocator mode": (r"mallopt\(", ("memory.py",)),
    "private aten op": (r"torch\.ops\.aten\.", ()),
}
"""Pattern and the files allowed to use it: the command-line entry points, the scoped context manager of
``runtime.py``, and the bench's opt-in allocator meter in ``memory.py``."""


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        for what, (pattern, allowed) in FORBIDDEN.items():
            if re.search(pattern, code) and not any(rel.startswith(a) for a in allowed):
                found.append(f"{rel}: {what}")
    return found


def test_library_code_changes_no_process_wide_setting():
    assert violations() == []


def test_the_scan_catches_a_planted_environment_write_and_thread_change(tmp_path):
    (tmp_path / "bad.py").write_text('import os\nos.environ["X"] = "1"\ntorch.set_num_threads(1)\n')
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "ok.py").write_text("torch.set_num_threads(2)\n")
    assert violations(tmp_path) == ["bad.py: environment write", "bad.py: thread count"]


def _flushing() -> bool:
    return float(torch.tensor(1e-30) * 1e-10) == 0.0


def test_running_attention_and_the_bench_plot_leave_the_process_as_it_was(tmp_path):
    from axiomformer import bench

    before = (dict(os.environ), torch.get_num_threads(), _flushing())
    att = Attention(AttentionSpec.standard(16, 2, causal=True).relax(position="alibi"))
    att(torch.randn(1, 40, 16, requires_grad=True)).sum().backward()
    rows = [bench.Row("standard", "sdpa", n, True, 1.0, 1.0, 1.0, 1.0, 1.0) for n in (8, 16)]
    bench.plot(rows, tmp_path / "bench.png")
    assert (dict(os.environ), torch.get_num_threads(), _flushing()) == before
