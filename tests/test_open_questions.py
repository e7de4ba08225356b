"""The building blocks of the open-question suites: Gumbel-softmax fields, set/order tasks, bidirectional and
attention-only models, length extrapolation without retraining, entropy at initialization against its closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.models import TransformerLM, count_parameters
from axiomformer.probes import entropy_closed_form, length_accuracy
from axiomformer.tasks import make_task
from axiomformer.tasks.multiset import multiset_targets
from axiomformer.train import TrainConfig, gumbel_tau_at, set_gumbel_tau, train


# ---------------------------------------------------------------------------------------------------- gumbel
def _is_one_hot_rows(w: torch.Tensor) -> bool:
    return bool(((w == 0) | (w == 1)).all() and torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1))))


def test_hard_gumbel_spec_builds_and_returns_one_hot_rows_in_training():
    spec = AttentionSpec.standard(32, 2).relax("normalizer=gumbel_softmax,gumbel_hard=true,gumbel_tau=0.5")
    assert (spec.gumbel_tau, spec.gumbel_hard) == (0.5, True)
    layer = Attention(spec).train()
    x = torch.randn(3, 9, 32, requires_grad=True)
    out, weights = layer(x, need_weights=True)
    assert _is_one_hot_rows(weights)
    out.square().sum().backward()  # straight-through: the soft sample's gradient reaches the input
    assert x.grad is not None and x.grad.abs().sum() > 0
    # The check itself can fail: soft Gumbel weights are not one-hot.
    soft = Attention(spec.relax("gumbel_hard=false")).train()
    assert not _is_one_hot_rows(soft(x, need_weights=True)[1])


def test_gumbel_eval_is_the_noise_free_limit():
    torch.manual_seed(0)
    spec = AttentionSpec.standard(16, 1).relax("normalizer=gumbel_softmax,gumbel_tau=0.25")
    layer = Attention(spec).eval()
    x = torch.randn(2, 6, 16)
    q, k = layer.q_proj(x), layer.k_proj(x)
    scores = q @ k.transpose(-2, -1) / math.sqrt(16)
    _, soft = layer(x, need_weights=True)
    assert torch.allclose(soft[:, 0], torch.softmax(scores / 0.25, -1), atol=1e-5)
    hard = Attention(spec.relax("gumbel_hard=true")).eval()
    hard.load_state_dict(layer.state_dict())
    _, one_hot = hard(x, need_weights=True)
    assert torch.equal(one_hot[:, 0].argmax(-1), scores.argmax(-1)) and _is_one_hot_rows(one_hot)


@pytest.mark.parametrize("options, engine", [("", "sdpa"), ("gumbel_tau=0.5", None), ("gumbel_hard=true", None)])
def test_router_sends_non_default_gumbel_in_eval_to_an_engine_that_applies_it(options, engine):
    from axiomformer.axes.normalizer import at_defaults, changed_options
    from axiomformer.engines import attend

    torch.manual_seed(0)
    spec = AttentionSpec.standard(16, 2, causal=True).relax("normalizer=gumbel_softmax").relax(options or None)
    q, k, v = (torch.randn(2, 2, 7, 8) for _ in range(3))
    got = attend(q, k, v, spec=spec)
    tau, hard = spec.gumbel_tau, spec.gumbel_hard
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(
        ~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf")
    )
    weights = torch.nn.functional.one_hot(scores.argmax(-1), 7).float() if hard else torch.softmax(scores / tau, -1)
    assert torch.allclose(got.out, weights @ v, atol=1e-5)
    assert at_defaults(spec) == (engine is not None) and (engine is None or got.engine == engine)
    assert got.engine != "sdpa" or not options
    assert spec.variant == ",".join(["normalizer=gumbel_softmax"] + ([options] if options else []))
    assert changed_options(spec) == dict([options.split("=")]) if options else not changed_options(spec)
    # The check can fail: plain softmax, what sdpa computes, differs from the non-default options' weights.
    if options:
        assert not torch.allclose(got.out, torch.softmax(scores, -1) @ v, atol=1e-3)


def test_chunked_engine_applies_the_gumbel_options_as_the_reference():
    from axiomformer.engines import attend

    spec = AttentionSpec.standard(16, 2, causal=True).relax("normalizer=gumbel_softmax,gumbel_tau=0.3")
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    ref = attend(q, k, v, spec=spec, engine="reference").out
    assert torch.allclose(attend(q, k, v, spec=spec, engine="chunked").out, ref, atol=1e-5)
    hard = spec.relax("gumbel_hard=true")
    ref = attend(q, k, v, spec=hard, engine="reference").out
    assert torch.allclose(attend(q, k, v, spec=hard, engine="chunked").out, ref, atol=1e-5)


@pytest.mark.parametrize("tau", ["0", "-0.5", "nan"])
def test_non_positive_gumbel_tau_is_rejected_naming_the_field(tau):
    with pytest.raises(ValueError, match="gumbel_tau"):
        AttentionSpec.standard(32, 2).relax(f"normalizer=gumbel_softmax,gumbel_tau={tau}")


def test_gumbel_temperature_anneals_exponentially_to_its_final_value():
    assert gumbel_tau_at(0, 11, 1.0, 0.5) == 1.0
    assert gumbel_tau_at(10, 11, 1.0, 0.5) == pytest.approx(0.5)
    assert gumbel_tau_at(5, 11, 1.0, 0.25) == pytest.approx(0.5)  # geometric midpoint
    model = TransformerLM(AttentionSpec.standard(16, 2, causal=True).relax("normalizer=gumbel_softmax"), 10, 2, 8)
    assert set_gumbel_tau(model, 0.3) == 2
    assert all(b.attn.spec.gumbel_tau == 0.3 for b in model.blocks)
    seen = {}
    train(
        TrainConfig(
            task="needle",
            seq_len=8,
            dim=16,
            heads=2,
            layers=1,
            steps=4,
            eval_every=4,
            eval_batches=1,
            spec="normalizer=gumbel_softmax",
            gumbel_tau_final=0.5,
            device="cpu",
        ),
        progress=False,
        on_end=lambda m, t: seen.update(tau=m.blocks[0].attn.spec.gumbel_tau) or {},
    )
    assert seen["tau"] == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------------- tasks
def _permutation_invariant(task, seed: int = 0) -> bool:
    """Do the targets stay the same when every row's tokens are shuffled?"""
    inputs, targets = task.sample(np.random.default_rng(seed), 64)
    rng = np.random.default_rng(seed + 1)
    shuffled = np.stack([row[rng.permutation(len(row))] for row in inputs])
    again = (
        multiset_targets(shuffled, task.target, task.num_symbols)
        if hasattr(task, "target")
        else (shuffled[:, ::-1] if task.kind == "reverse" else np.sort(shuffled, axis=1))
    )
    again = np.repeat(again[:, None], inputs.shape[1], axis=1) if again.ndim == 1 else again
    return bool((again == targets).all())


@pytest.mark.parametrize("name", ["majority", "distinct"])
def test_set_task_target_is_invariant_to_permuting_its_input(name):
    task = make_task(name, seq_len=12)
    assert _permutation_invariant(task)
    _inputs, targets = task.batch(16, seed=3, split="train")
    assert (targets == targets[:, :1]).all()  # the same answer at every position
    assert _permutation_invariant(task, seed=7)


def test_order_task_target_is_not_invariant_to_permuting_its_input():
    assert not _permutation_invariant(make_task("reverse", seq_len=12))


def test_distinct_counts_and_majority_are_the_counts_function():
    rows = np.array([[0, 0, 1, 2, 2, 2], [3, 3, 3, 3, 3, 3]])
    assert multiset_targets(rows, "majority", 4).tolist() == [2, 3]
    assert multiset_targets(rows, "distinct", 4).tolist() == [4 + 3 - 1, 4 + 1 - 1]


# ---------------------------------------------------------------------------------------------------- models
def test_encoder_is_bidirectional_and_the_decoder_is_not():
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 10
    for causal, moves in ((False, True), (True, False)):
        model = TransformerLM(AttentionSpec.standard(16, 2, causal=causal), 10, 2, 8, input_position="none").eval()
        delta = (model(ids)[0, 0] - model(changed)[0, 0]).abs().max().item()
        assert (delta > 1e-6) == moves


def test_attention_only_blocks_have_no_mlp_sublayer():
    spec = AttentionSpec.standard(16, 2)
    full, bare = TransformerLM(spec, 10, 1, 8), TransformerLM(spec, 10, 1, 8, mlp_ratio=0)
    assert bare.blocks[0].mlp is None
    assert count_parameters(full) - count_parameters(bare) == 2 * 16 * 64 + 64 + 16 + 2 * 16
    assert bare(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 10)


# ---------------------------------------------------------------------------------------------------- extrapolation
def test_extrapolation_lengths_are_evaluated_without_retraining():
    torch.manual_seed(0)
    model = TransformerLM(AttentionSpec.standard(16, 2, position="learned"), 16, 1, 64, input_position="none")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = length_accuracy(model.eval(), "majority", {}, [16, 32, 64], batch_size=4, eval_batches=1)
    assert set(out["length_accuracy"]) == {"16", "32", "64"}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_training_is_the_same_with_and_without_extrapolation_and_probes():
    base = dict(
        task="majority",
        seq_len=8,
        dim=16,
        heads=2,
        layers=1,
        steps=6,
        eval_every=6,
        eval_batches=1,
        causal=False,
        input_position="none",
        device="cpu",
    )
    plain = train(TrainConfig(**base), progress=False)
    probed = train(TrainConfig(**base, eval_lengths=[16, 64], probes=["init_entropy"]), progress=False)
    assert plain.losses == probed.losses and plain.accuracy == probed.accuracy
    assert set(probed.extra["end"]["length_accuracy"]) == {"16", "64"}
    assert len(probed.extra["init"]["init_entropy"]) == 1


# ---------------------------------------------------------------------------------------------------- entropy
def _measured_entropy(scale: str, d: int, n: int, rows: int = 400) -> float:
    """Mean attention entropy of one Attention layer (1 head, identity projections) for queries of norm sqrt(d)
    and n keys with iid N(0, 1) entries: the scores are iid N(0, c^2 d) with c the spec's scale."""
    torch.manual_seed(0)
    layer = Attention(AttentionSpec.standard(d, 1, bias=False).relax(f"scale={scale}")).eval()
    with torch.no_grad():
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
            proj.weight.copy_(torch.eye(d))
        q = torch.randn(rows, 1, d)
        q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(d)
        _, w = layer(q, torch.randn(rows, n, d), need_weights=True)
    return float(-(w * w.clamp_min(1e-30).log()).sum(-1).mean())


@pytest.mark.parametrize("scale, d", [("none", 2), ("none", 3), ("inv_sqrt_d", 2), ("inv_sqrt_d", 64)])
def test_entropy_at_initialization_matches_the_closed_form(scale, d):
    n = 4096
    variance = d * (1.0 / d if scale == "inv_sqrt_d" else 1.0)
    measured = _measured_entropy(scale, d, n, rows=max(50, 3200 // d))
    assert measured == pytest.approx(entropy_closed_form(n, variance), abs=0.05)
    # A wrong closed form (the scale forgotten for inv_sqrt_d, or applied when it is absent) misses by far more.
    wrong = d if scale == "inv_sqrt_d" else 1.0
    if wrong != variance:
        predicted = entropy_closed_form(n, wrong)
        assert math.isnan(predicted) or abs(measured - predicted) > 0.3


def test_without_the_scale_large_head_dims_freeze_the_attention_at_initialization():
    n = 64
    assert math.isnan(entropy_closed_form(n, 128.0))  # sigma^2 = d beyond 2 log n: frozen phase
    assert _measured_entropy("none", 128, n) < 1.0 < _measured_entropy("inv_sqrt_d", 128, n)
    with pytest.raises(ValueError):
        entropy_closed_form(0, 1.0)
