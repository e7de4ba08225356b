"""Device paths: every engine against the reference, the compiled flex engine and the trainer, on CPU and on CUDA.

The ``cuda`` parametrizations carry the ``cuda`` marker and are skipped without a CUDA device (``tests/conftest.py``);
``benchmarks/gpu_check.sh`` runs them on a GPU machine. The ``cpu`` parametrizations run everywhere and keep the checks
themselves honest.
"""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.engines import ENGINES
from axiomformer.engines.flex import FlexEngine

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-4}
"""Relative error bound in float32 (summation order)."""
BF16_FACTOR, BF16_SLACK = 2.0, 2e-2
"""In bfloat16 (unit roundoff 2^-8) the error against the float32 reference is dominated by rounding the parameters
and activations themselves (up to 0.3 relative on a parameter gradient through sparsemax, measured on CPU), so an
engine in bf16 must be as accurate as the reference engine in bf16: error <= 2 x the reference's own + 0.02, per
tensor. The reference computes scores, weights and the weighted sum in float32 (``axiomformer.precision``), so its own
error is only the rounding of inputs and outputs (0.0056 on the standard spec, CPU); a fused kernel also rounds the
weights to bf16 before multiplying the values (sdpa: 0.020-0.025 there, about 5 unit roundoffs), hence 0.02."""

DIM, HEADS, BATCH, Q_LEN, K_LEN = 32, 2, 2, 37, 70
ENGINE_CASES = [
    ("sdpa", "standard"),
    ("sdpa", "A4=cosine"),
    ("sdpa", "position=rope"),
    ("linear", "A5=linear"),
    ("chunked", "A5=sigmoid"),
    ("chunked", "A5=sparsemax"),
    ("chunked", "A4=additive"),
    ("elementwise", "A5=sigmoid"),
    ("elementwise", "A5=relu"),
    ("sparse", "A5=sparsemax"),
    ("sparse", "A5=entmax15"),
    ("flex", "position=alibi"),
]
"""(engine, spec) pairs: each engine on specs it runs exactly."""
UNMASKED = ("elementwise", "sparse")
"""Engines whose closed forms take at most a causal mask, in float32/64: run without the key padding mask."""


def _inputs(device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, Q_LEN, DIM, generator=g)
    kv = torch.randn(BATCH, K_LEN, DIM, generator=g)
    keep = torch.ones(BATCH, K_LEN, dtype=torch.bool)
    keep[1, 50:] = False
    return x.to(device, dtype), kv.to(device, dtype), keep.to(device)


def _run(spec: AttentionSpec, engine: str, device: str, dtype: torch.dtype, padded: bool = True):
    torch.manual_seed(3)  # identical parameters for every engine
    att = Attention(spec, engine=engine).to(device, dtype).eval()
    x, kv, keep = _inputs(device, dtype)
    x.requires_grad_()
    kv.requires_grad_()
    out = att(x, kv, key_padding_mask=keep if padded else None)
    probe = torch.linspace(-1, 1, out.numel(), device=device).view_as(out).to(dtype)
    (out * probe).sum().backward()
    grads = [x.grad, kv.grad] + [p.grad for p in att.parameters() if p.grad is not None]
    return [t.detach().double().cpu() for t in [out, *grads]], att.last_engine


def _relative_errors(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> list[float]:
    """Relative error of the output and of every gradient; exactly-zero gradients (a key bias under softmax) are
    measured against 1e-3 of the largest gradient."""
    floor = 1e-3 * max(float(t.norm()) for t in expected[1:])
    return [float((a - e).norm()) / max(float(e.norm()), floor) for a, e in zip(actual, expected)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine,relax", ENGINE_CASES)
def test_engine_matches_the_float32_reference(engine, relax, device, dtype, monkeypatch):
    if engine == "flex" and device == "cpu":
        pytest.skip("the flex engine runs on CUDA only (no FlexAttention backward on CPU)")
    if engine in UNMASKED and dtype != "fp32":
        pytest.skip(f"the {engine} engine runs float32/64 only (half types go to the chunked engine)")
    monkeypatch.setitem(ENGINES, "flex", FlexEngine())  # a fresh engine: no compile failure remembered
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)
    padded = engine not in UNMASKED
    actual, ran = _run(spec, engine, device, DTYPES[dtype], padded)
    expected, _ = _run(spec, "reference", device, torch.float32, padded)
    assert ran == engine and not ENGINES["flex"].failed
    errors = _relative_errors(actual, expected)
    if dtype == "fp32":
        assert max(errors) <= TOLERANCE["fp32"], errors
    else:
        same_precision, _ = _run(spec, "reference", device, DTYPES[dtype], padded)
        bounds = [BF16_FACTOR * e + BF16_SLACK for e in _relative_errors(same_precision, expected)]
        assert all(e <= b for e, b in zip(errors, bounds)), (errors, bounds)


@pytest.mark.cuda
def test_compiled_flex_engine_runs_alibi_on_cuda(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    engine = FlexEngine(compile=True)
    monkeypatch.setitem(ENGINES, "flex", engine)
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("position=alibi")
    actual, ran = _run(spec, "auto", "cuda", torch.float32)  # automatic routing picks flex on CUDA
    expected, _ = _run(spec, "reference", "cuda", torch.float32)
    assert ran == "flex"
    assert engine.failed == {} and engine._kernel() is not None  # compiled, not fallen back
    assert max(_relative_errors(actual, expected)) <= TOLERANCE["fp32"]


def test_relative_errors_catch_a_wrong_engine():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True)
    expected, _ = _run(spec, "reference", "cpu", torch.float32)
    wrong, _ = _run(spec.relax("scale=none"), "sdpa", "cpu", torch.float32)  # the 1/sqrt(d) temperature dropped
    same_precision, _ = _run(spec, "reference", "cpu", torch.bfloat16)
    bf16_bound = max(BF16_FACTOR * e + BF16_SLACK for e in _relative_errors(same_precision, expected))
    assert max(_relative_errors(wrong, expected)) > max(TOLERANCE["fp32"], bf16_bound)


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_on_device_starts_from_the_cpu_loss(device):
    from axiomformer.train import TrainConfig, train

    config = dict(
        task="needle", seq_len=16, steps=4, dim=32, layers=1, batch_size=8, eval_batches=1, target_accuracy=None
    )
    on_device = train(TrainConfig(**config, device=device), progress=False)
    on_cpu = train(TrainConfig(**config, device="cpu"), progress=False)
    assert len(on_device.losses) == 4 and all(map(torch.isfinite, torch.tensor(on_device.losses)))
    # same seed, same initial weights, same first batch: the first loss agrees across devices
    assert on_device.losses[0] == pytest.approx(on_cpu.losses[0], rel=1e-4)
    assert on_device.config["device"] == device and on_device.engine
