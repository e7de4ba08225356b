"""Peak memory of a stretch of work, in MiB: one meter for the trainer, the study and the bench.

A library does not reset its host's counters: the exact methods below reset the process's peak-memory reading
(Linux's VmHWM, the CUDA allocator's peak) and, for the bench, glibc's allocator thresholds, so they are used only
inside :func:`owning_process_memory`, which the command line enters for each command (a program that owns its
process may enter it too). Outside it the meter only reads: ``ru_maxrss`` growth on CPU, the allocator's peak growth
on CUDA (:data:`CUDA_READ_METHOD`).

Methods (our choice; the chosen one is reported as ``PeakMemory.method``):
    CUDA  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus the memory allocated before.
    CPU   Linux's peak resident set size: ``/proc/self/clear_refs`` resets VmHWM, and the peak is VmHWM minus the
          resident size at the start. Memory that glibc keeps in its heap from earlier work would be reused without
          raising the resident size (a run in a reused worker then read 0.0 MB), so where glibc is present the start
          first gives the heap's free pages back to the OS (``malloc_trim(0)``, process-wide, cheap, changes no
          mode): the run's own allocations fault their pages in again and raise VmHWM.
          With ``allocator_modes=True`` (the bench's choice, never the trainer's: it changes the allocator of the
          whole process) glibc is told (``mallopt``) while measuring to serve every block over 64 KiB by mmap and
          to return freed memory at once, so that an earlier, larger peak does not hide this one. That strict mode
          makes every large allocation a fresh, zero-filled mapping (2x slower chunked engines in our
          measurements), so :meth:`PeakMemory.stop` puts glibc back in a fast mode (blocks below 32 MiB, glibc's
          own dynamic ceiling, from the heap) and timed work outside a measurement is not slowed down.
    else  growth of ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (0 when an earlier peak was higher); for a single
          call, :meth:`PeakMemory.measure` replays ``torch.profiler`` allocation events instead.
Each counts everything allocated in between: outputs, saved activations, workspace, gradients.
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
from collections.abc import Callable, Iterator

import torch

RSS_METHOD = "peak resident set size (Linux VmHWM reset by /proc/self/clear_refs)"
RSS_STRICT_METHOD = (
    "peak resident set size (Linux VmHWM reset by /proc/self/clear_refs; glibc mmap threshold 64 KiB while measuring)"
)
CUDA_METHOD = "torch.cuda.max_memory_allocated (allocator peak minus memory allocated before)"
CUDA_READ_METHOD = (
    "torch.cuda.max_memory_allocated growth (peak not reset: an earlier, larger peak of the process hides this one)"
)
FALLBACK_METHOD = "ru_maxrss growth (torch.profiler allocation replay for single calls)"

_owned = 0
"""Depth of :func:`owning_process_memory` blocks: above 0, the meter may reset process-wide counters."""


@contextlib.contextmanager
def owning_process_memory() -> Iterator[None]:
    """Let :class:`PeakMemory` meters created in this block reset the process's peak-memory counters (Linux VmHWM via
    ``/proc/self/clear_refs``, ``torch.cuda.reset_peak_memory_stats``) and, with ``allocator_modes=True``, set glibc's
    allocator thresholds (``mallopt``, not undone: glibc has no way back to its dynamic threshold).

    For a process that owns its memory readings: the ``axiomformer`` command enters it for every command.
    """
    global _owned
    _owned += 1
    try:
        yield
    finally:
        _owned -= 1


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where there is no glibc."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise OSError(key)


class PeakMemory:
    """``start()`` ... ``stop() -> MiB``, or ``measure(fn) -> MiB`` for one call, on ``device``.

    The method is chosen when the meter is created: the exact ones only inside :func:`owning_process_memory`.

    Args:
        device: where the measured work allocates (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        allocator_modes: on CPU, switch glibc's allocator to a strict mode while measuring (process-wide; see the
            module docstring). Only for a process that does nothing else, such as the bench.
    """

    def __init__(self, device: torch.device | str, *, allocator_modes: bool = False) -> None:
        self.device = torch.device(device)
        self.allocator_modes = allocator_modes
        self._trim: Callable[[int], int] | None = None
        self.method = self._choose()
        self._base = 0

    def _choose(self) -> str:
        if self.device.type == "cuda":
            return CUDA_METHOD if _owned else CUDA_READ_METHOD
        if not _owned:
            return FALLBACK_METHOD
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if not self.allocator_modes:
                self._trim = _malloc_trim()
                return RSS_METHOD
            self._libc = ctypes.CDLL("libc.so.6")
            _ = self._libc.mallopt  # AttributeError where there is no glibc
            return RSS_STRICT_METHOD
        except (OSError, AttributeError):
            return FALLBACK_METHOD

    def _allocator(self, strict: bool) -> None:
        """glibc's mmap and trim thresholds: 64 KiB while measuring (strict), 32 MiB / 64 MiB otherwise (fast)."""
        mmap_threshold, trim_threshold = (1 << 16, 1 << 16) if strict else (32 << 20, 64 << 20)
        self._libc.mallopt(-3, mmap_threshold)  # M_MMAP_THRESHOLD (fixed: no dynamic raise)
        self._libc.mallopt(-1, trim_threshold)  # M_TRIM_THRESHOLD

    def start(self) -> None:
        """Begin a measurement: reset the peak and remember the current level."""
        if self.method == CUDA_METHOD:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.method == CUDA_READ_METHOD:
            torch.cuda.synchronize(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.method in (RSS_METHOD, RSS_STRICT_METHOD):
            if self.method == RSS_STRICT_METHOD:
                self._allocator(strict=True)
                self._libc.malloc_trim(0)
            elif self._trim is not None:
                self._trim(0)  # free heap pages back to the OS (module docstring)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._base = _status_bytes("VmRSS:")
        else:
            self._base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def stop(self) -> float:
        """Peak since :meth:`start`, above the level at the start, in MiB."""
        if self.method in (CUDA_METHOD, CUDA_READ_METHOD):
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method in (RSS_METHOD, RSS_STRICT_METHOD):
            peak = _status_bytes("VmHWM:")
            if self.method == RSS_STRICT_METHOD:
                self._allocator(strict=False)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0.0, (peak - self._base) / 2**20)

    def measure(self, fn: Callable[[], object]) -> float:
        """Peak memory of one call ``fn()`` in MiB."""
        if self.method != FALLBACK_METHOD:
            self.start()
            fn()
            return self.stop()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
        current = peak = 0
        for event in events:
            current += event.self_cpu_memory_usage
            peak = max(peak, current)
        return peak / 2**20
