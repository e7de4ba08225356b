"""Peak memory per run in a reused process: heap pages freed by an earlier run are given back before a measurement,
so every run's own peak shows (a reused worker once read 0.0 MB), and a reading of 0 is stored as unavailable."""

from __future__ import annotations

import os

import pytest
import torch

from axiomformer import memory
from axiomformer.memory import RSS_METHOD, PeakMemory, owning_process_memory

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux VmHWM method")

survivors: list[torch.Tensor] = []


def _heap_work() -> int:
    """47 MiB in 16 KiB tensors (glibc serves them from its heap), then a small survivor that pins the heap's top."""
    blocks = [torch.ones(4 * 1024) for _ in range(3000)]
    survivors.append(torch.ones(16))
    return len(blocks)


def _three_peaks() -> list[float]:
    with owning_process_memory():
        meters = [PeakMemory("cpu") for _ in range(3)]
        assert all(m.method == RSS_METHOD for m in meters)
        return [m.measure(_heap_work) for m in meters]


def test_every_run_in_a_reused_process_shows_its_own_peak():
    if memory._malloc_trim() is None:
        pytest.skip("no glibc")
    peaks = _three_peaks()
    assert all(p > 30 for p in peaks), peaks  # 47 MiB of blocks each time


def test_the_peak_check_sees_heap_reuse_without_the_trim(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)  # the old meter
    peaks = _three_peaks()
    assert min(peaks[1:]) < 10, peaks


def test_a_run_with_no_measured_growth_is_stored_as_unavailable(monkeypatch):
    from axiomformer import train as trainer
    from axiomformer.study import runner

    class Result:
        def to_dict(self):
            return {"peak_mem_mb": 0.0, "memory_method": RSS_METHOD}

    monkeypatch.setattr(trainer, "train", lambda *a, **k: Result())
    out = runner.execute({"task": "needle", "seq_len": 8, "steps": 1}, threads=1)
    assert out["peak_mem_mb"] is None and out["memory_source"].startswith("unavailable")
