"""``--practice``: each planted practitioner's fault is caught by exactly its check; the standard spec and
``nn.MultiheadAttention`` pass."""

import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from axiomformer.audit.adapters import FunctionAdapter
from axiomformer.audit.practice import run_practice
from axiomformer.cli import app


def sdpa(q, k, v, causal=False):
    return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[:, 0]


def _failed(target) -> list[str]:
    return run_practice(target).failed


def test_standard_spec_and_multihead_attention_pass():
    for target in ("spec:standard", "torch.nn.MultiheadAttention", FunctionAdapter(sdpa, "sdpa")):
        report = run_practice(target)
        assert report.passed, report.to_text()
    assert run_practice("spec:standard")["cache_decode"].passed  # axiomformer's KVCache is exercised


def test_a_dropped_causal_mask_fails_future_tokens_only():
    def dropped(q, k, v, causal=False):  # accepts the flag and ignores it
        return sdpa(q, k, v)

    assert _failed(FunctionAdapter(dropped, "dropped mask")) == ["future_tokens"]


def test_a_drifting_cache_fails_cache_decode_only():
    def attend(q, k, v, causal=False):
        return sdpa(q, k, v, causal)

    def decode(q, k, v):
        """Token by token; the cache stores each key with a drift that grows with its age."""
        outs, keys, values = [], [], []
        for t in range(q.shape[1]):
            keys = [key * (1 + 1e-3) for key in keys] + [k[:, t : t + 1]]
            values.append(v[:, t : t + 1])
            outs.append(sdpa(q[:, t : t + 1], torch.cat(keys, 1), torch.cat(values, 1)))
        return torch.cat(outs, 1)

    attend.decode = decode
    assert _failed(FunctionAdapter(attend, "drifting cache")) == ["cache_decode"]
    attend.decode = lambda q, k, v: torch.cat(
        [sdpa(q[:, t : t + 1], k[:, : t + 1], v[:, : t + 1]) for t in range(q.shape[1])], 1
    )
    assert _failed(FunctionAdapter(attend, "exact cache")) == []


def test_a_kernel_wrong_at_odd_lengths_fails_odd_lengths_only():
    def kernel(q, k, v, causal=False):
        if q.shape[1] % 2:  # the tail of an odd length is mishandled: the last value is read at half weight
            v = torch.cat([v[:, :-1], 0.5 * v[:, -1:]], 1)
        return sdpa(q, k, v, causal)

    assert _failed(FunctionAdapter(kernel, "odd-length kernel")) == ["odd_lengths"]


def test_a_kernel_wrong_only_under_compile_fails_compiled_eager_only():
    def kernel(q, k, v, causal=False):
        out = sdpa(q, k, v, causal)
        return 1.01 * out if torch.compiler.is_compiling() else out

    assert _failed(FunctionAdapter(kernel, "compiled kernel")) == ["compiled_eager"]


def test_a_gradient_that_reaches_masked_keys_fails_masked_keys_only():
    def leaky(q, k, v, causal=False):
        total = k.sum(1, keepdim=True)  # zero in the forward pass, a gradient to every key (the future ones too)
        return sdpa(q, k, v, causal) + 1e-3 * (total - total.detach())

    assert _failed(FunctionAdapter(leaky, "gradient leak")) == ["masked_keys"]


def test_cli_practice_prints_one_verdict_per_check():
    result = CliRunner().invoke(app, ["audit", "spec:standard", "--practice"])
    assert result.exit_code == 0, result.output
    verdicts = [line for line in result.output.splitlines() if line.startswith(("  pass", "  FAIL"))]
    assert len(verdicts) == 5
