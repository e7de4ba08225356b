"""Data-parallel training under torchrun (2 CPU processes, gloo) against one process with the same global batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from axiomformer.checkpoint import load_checkpoint
from axiomformer.distributed import DataParallel
from axiomformer.tasks import IGNORE, make_task
from axiomformer.train import TrainConfig, evaluate, masked_loss, train

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"
CONFIG = dict(
    task="needle",
    seq_len=16,
    steps=8,
    dim=32,
    layers=1,
    batch_size=8,
    eval_every=4,
    eval_batches=3,
    target_accuracy=None,
    device="cpu",
)


def _torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_shards_and_scaled_losses_rebuild_the_global_batch_loss():
    task = make_task("needle", seq_len=16)
    inputs, targets = task.batch(8, seed=3)
    targets[0, :] = IGNORE  # rank 0's shard then has fewer scored positions than rank 1's
    logits = torch.randn(*targets.shape, task.vocab_size)
    ranks = [DataParallel(r, 2, torch.device("cpu")) for r in range(2)]
    shards = [rank.shard(inputs, targets) for rank in ranks]
    assert torch.equal(torch.cat([s[0] for s in shards]), inputs)
    assert torch.equal(torch.cat([s[1] for s in shards]), targets)
    assert shards[0][2] == shards[1][2] == int((targets != IGNORE).sum())
    halves = logits.chunk(2)
    scaled = [rank.loss(half, shard[1], shard[2]) for rank, half, shard in zip(ranks, halves, shards)]
    whole = masked_loss(logits, targets)
    assert torch.allclose(sum(scaled) / 2, whole, rtol=1e-6)
    # the planted wrong version, the mean of the per-shard means, differs when shards score unequal counts
    naive = sum(masked_loss(half, shard[1]) for half, shard in zip(halves, shards)) / 2
    assert not torch.allclose(naive, whole, rtol=1e-3)


def test_global_batch_must_split_over_ranks():
    with pytest.raises(ValueError, match="divisible by the number of processes 3"):
        DataParallel(0, 3, torch.device("cpu")).check_batch(8)


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    _torchrun(str(TESTS / "ddp_worker.py"), str(tmp_path), json.dumps(CONFIG))
    two = json.loads((tmp_path / "result.json").read_text())
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # every rank reports the reduced figures
    one = train(TrainConfig(**CONFIG), progress=False)
    assert len(two["losses"]) == len(one.losses) == CONFIG["steps"]
    assert two["losses"] == pytest.approx(one.losses, rel=1e-5)
    assert two["loss"] == pytest.approx(one.loss, rel=1e-5)
    assert two["accuracy"] == pytest.approx(one.accuracy)
    assert [h["step"] for h in two["history"]] == [4, 8]

    # the 2-process checkpoint loads in one process and scores the whole test set as the 2-process run reported
    model, meta = load_checkpoint(tmp_path / "checkpoint")
    assert meta["train"]["batch_size"] == CONFIG["batch_size"]
    task = make_task("needle", seq_len=CONFIG["seq_len"])
    eval_set = [task.batch(CONFIG["batch_size"], seed=i, split="test") for i in range(CONFIG["eval_batches"])]
    accuracy, loss = evaluate(model, eval_set)
    assert (accuracy, loss) == pytest.approx((two["accuracy"], two["loss"]), rel=1e-6)
    # rank 0's share alone (eval batches 0 and 2) is not what was reported: the reduction covered rank 1's batch
    _, share_loss = evaluate(model, eval_set[0::2])
    assert share_loss != pytest.approx(two["loss"], rel=1e-6)


@pytest.mark.slow
def test_torchrun_command_line_prints_once_and_matches(tmp_path):
    args = [
        "--task",
        "needle",
        "--seq-len",
        "16",
        "--steps",
        "6",
        "--dim",
        "32",
        "--layers",
        "1",
        "--batch-size",
        "8",
        "--device",
        "cpu",
        "--json",
    ]
    done = _torchrun("-m", "axiomformer", "train", *args, "--checkpoint", str(tmp_path / "ckpt"))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 alone prints
    two = json.loads(lines[0])
    one = train(
        TrainConfig(task="needle", seq_len=16, steps=6, dim=32, layers=1, batch_size=8, device="cpu"), progress=False
    )
    assert two["loss"] == pytest.approx(one.loss, rel=1e-4)
    assert load_checkpoint(tmp_path / "ckpt")[1]["result"]["steps"] == 6


def test_each_rank_draws_its_own_stream_and_the_same_seed_draws_it_again():
    def draws(rank: int) -> torch.Tensor:
        torch.manual_seed(5)  # what train() does on every rank before building the model
        DataParallel(rank, 2, torch.device("cpu")).seed_random_draws(5)
        return torch.rand(64)

    rank0, rank1 = draws(0), draws(1)
    assert not torch.equal(rank0, rank1)
    assert torch.equal(rank0, draws(0)) and torch.equal(rank1, draws(1))  # reproducible per rank
    torch.manual_seed(5)
    assert torch.equal(rank0, torch.rand(64))  # rank 0 keeps the single-process stream


@pytest.mark.slow
def test_under_torchrun_the_ranks_draw_different_dropout_masks(tmp_path, monkeypatch):
    config = dict(CONFIG, steps=1, dim=16, batch_size=4, eval_every=1, eval_batches=1, spec="dropout=0.5")
    monkeypatch.setenv("AXIOMFORMER_ENGINE", "reference")  # F.dropout draws the mask
    _torchrun(str(TESTS / "ddp_mask_worker.py"), str(tmp_path), json.dumps(config))
    m0, m1 = (json.loads((tmp_path / f"mask{r}.json").read_text()) for r in range(2))
    assert m0 is not None and m1 is not None and len(m0) == len(m1)
    assert m0 != m1


def _torchrun_any(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_uneven_eval_and_test_sets_under_torchrun_neither_hang_nor_change_the_result(tmp_path):
    # issue 36: 1 validation batch (rank 1 holds none) and 3 test batches (2 + 1) over 2 processes
    args = ["--task", "needle", "--seq-len", "16", "--steps", "4", "--dim", "16", "--layers", "1"]
    args += ["--batch-size", "4", "--eval-every", "2", "--eval-batches", "1", "--test-batches", "3"]
    args += ["--device", "cpu", "--no-early-stop", "--json"]
    done = _torchrun_any("-m", "axiomformer", "train", *args, timeout=300)  # a hang would time out here
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    fields = dict(task="needle", seq_len=16, steps=4, dim=16, layers=1, batch_size=4, eval_every=2)
    one = train(
        TrainConfig(**fields, eval_batches=1, test_batches=3, target_accuracy=None, device="cpu"), progress=False
    )
    # the same up to the order of the reductions: test accuracy and loss over the 3 test batches
    assert (two["accuracy"], two["loss"], two["steps"]) == pytest.approx((one.accuracy, one.loss, 4), rel=1e-5)


@pytest.mark.slow
def test_a_global_batch_that_does_not_split_fails_on_every_rank_without_a_hang():
    done = _torchrun_any("-m", "axiomformer", "train", "--task", "copy", "--steps", "1", "--batch-size", "7",
                         "--device", "cpu", timeout=240)  # fmt: skip
    assert done.returncode != 0
    assert (
        done.stderr.count("error: --batch-size 7 (the global batch) must be divisible by the number of processes 2")
        == 2
    )
