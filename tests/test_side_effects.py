"""A library does not change its host process: no floating-point, thread, allocator, environment, random-state or
peak-memory-counter changes outside a scoped helper or the command line's entry point."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import torch

import axiomformer
from axiomformer import Attention, AttentionSpec

ROOT = Path(axiomformer.__file__).parent

FORBIDDEN = {
    "environment write": (
        (
            r"os\.environ\s*\[[^\]]*\]\s*=|os\.environ\.(setdefault|update|pop)\(|os\.putenv\(|"
            r"del os\.environ"
        ),
        (),
    ),
    "flush-to-zero": (r"set_flush_denormal\(", ("runtime.py",)),
    "thread count": (r"set_num_threads\(", ("runtime.py", "commands/")),
    "pyplot backend switch": (r"matplotlib\.use\(|import matplotlib\.pyplot", ()),
    "allocator mode": (r"mallopt\(", ("memory.py",)),
    "peak-memory counter reset": (r"reset_peak_memory_stats\(|clear_refs", ("memory.py",)),
    "private aten op": (r"torch\.ops\.aten\.", ()),
}
"""Pattern and the files allowed to use it: the command-line entry points, the scoped context manager of
``runtime.py``, and the meter of ``memory.py`` (whose resets run only inside ``owning_process_memory``, tested
below)."""

SEEDING = {
    ("torch", "manual_seed"),
    ("torch", "seed"),
    ("cuda", "manual_seed"),
    ("cuda", "manual_seed_all"),
    ("random", "seed"),
    ("np.random", "seed"),
    ("numpy.random", "seed"),
}
"""Calls that seed a process-global random generator; allowed only inside ``with ...fork_rng(...)`` or
``with seeded(...)`` (``axiomformer.runtime``), which put the caller's state back."""


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def unscoped_seeding(root: Path = ROOT) -> list[str]:
    """``file:line`` of every global seeding call that is not inside a scoping ``with`` block."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        scoped: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call)
                and _dotted(item.context_expr.func).split(".")[-1] in ("fork_rng", "seeded")
                for item in node.items
            ):
                scoped.update(id(inner) for inner in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and id(node) not in scoped:
                owner = _dotted(node.func.value)
                if (owner.split(".")[-1], node.func.attr) in SEEDING or (owner, node.func.attr) in SEEDING:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return [f for f in found if not f.startswith("runtime.py:")]


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


def test_library_code_seeds_no_global_generator_outside_a_scope():
    assert unscoped_seeding() == []


def test_the_seeding_scan_catches_a_planted_global_seed_and_passes_a_scoped_one(tmp_path):
    (tmp_path / "bad.py").write_text("import torch\n\ndef f():\n    torch.manual_seed(0)\n    return 1\n")
    (tmp_path / "ok.py").write_text(
        "import torch\n\ndef f():\n    with torch.random.fork_rng(devices=[]):\n        torch.manual_seed(0)\n"
    )
    (tmp_path / "np_bad.py").write_text("import numpy as np\nnp.random.seed(3)\n")
    assert unscoped_seeding(tmp_path) == ["bad.py:4", "np_bad.py:2"]


def test_train_leaves_the_callers_random_stream_where_it_was():
    from axiomformer.train import TrainConfig, train

    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    first = train(
        TrainConfig(task="copy", seq_len=8, steps=2, dim=16, layers=1, eval_batches=1, eval_every=2), progress=False
    )
    assert torch.equal(torch.rand(3), expected)
    second = train(
        TrainConfig(task="copy", seq_len=8, steps=2, dim=16, layers=1, eval_batches=1, eval_every=2), progress=False
    )
    assert first.losses == second.losses  # still reproducible from config.seed alone


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append(name)


def test_the_memory_meter_resets_nothing_outside_owning_process_memory(monkeypatch):
    from axiomformer import memory

    libc = _Recorder()
    monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: libc)
    writes = []
    real_open = open

    def spy_open(path, mode="r", *args, **kwargs):
        if "clear_refs" in str(path):
            writes.append(path)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy_open)
    meter = memory.PeakMemory("cpu", allocator_modes=True)
    meter.measure(lambda: torch.ones(1000).sum())
    assert (libc.calls, writes, meter.method) == ([], [], memory.FALLBACK_METHOD)
    if not Path("/proc/self/clear_refs").exists():
        return
    with memory.owning_process_memory():  # the command line's scope: the exact method
        meter = memory.PeakMemory("cpu", allocator_modes=True)
        meter.measure(lambda: torch.ones(1000).sum())
    assert "mallopt" in libc.calls and writes and meter.method == memory.RSS_STRICT_METHOD
