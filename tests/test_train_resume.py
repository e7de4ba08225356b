"""A run stopped part-way resumes from its progress file (``train(progress_file=...)``) and ends exactly as the run
that was never stopped: the same losses, validation history and test accuracy. Planted resumes that lose the
optimizer's state or the random state (the Gumbel noise) are caught, and a progress file of another config is
ignored."""

from __future__ import annotations

import pytest
import torch

from axiomformer.train import TrainConfig, train


def _config(**changes) -> TrainConfig:
    fields = {
        "task": "copy",
        "seq_len": 12,
        "model": "transformer",
        "dim": 16,
        "heads": 2,
        "layers": 1,
        "steps": 30,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup": 3,
        "eval_every": 10,
        "eval_batches": 1,
        "test_batches": 1,
        "target_accuracy": None,
        "patience": None,
        "seed": 0,
        "device": "cpu",
        "spec": "normalizer=gumbel_softmax",  # draws from the global generator while training
    }
    return TrainConfig(**(fields | changes))


def _stopped_at_second_evaluation(config: TrainConfig, path) -> None:
    seen = []

    def log(line: str) -> None:
        seen.append(line)
        if len(seen) == 2:
            raise KeyboardInterrupt  # what Ctrl-C raises in the middle of a run

    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, log=log, progress_file=path)


def _same(a, b) -> bool:
    return a.losses == b.losses and a.history == b.history and (a.accuracy, a.loss) == (b.accuracy, b.loss)


def _resumed(config: TrainConfig, tmp_path):
    path = tmp_path / "run.pt"
    _stopped_at_second_evaluation(config, path)
    assert path.is_file()  # written at the first evaluation
    lines: list[str] = []
    result = train(config, progress=False, log=lines.append, progress_file=path)
    assert not path.exists()  # removed once the run is done
    return result, lines


def test_a_stopped_run_resumes_at_its_last_evaluation_and_ends_as_if_never_stopped(tmp_path):
    config = _config()
    whole = train(config, progress=False)
    resumed, lines = _resumed(config, tmp_path)
    assert lines[0] == f"step 10: resumed from {tmp_path / 'run.pt'}"
    assert _same(resumed, whole) and resumed.steps == whole.steps == 30


@pytest.mark.parametrize("lost", ["optimizer", "random state"])
def test_a_resume_that_loses_part_of_the_state_is_caught(tmp_path, monkeypatch, lost):
    config = _config()
    whole = train(config, progress=False)
    if lost == "optimizer":
        monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", lambda self, state: None)
    else:
        monkeypatch.setattr(torch, "set_rng_state", lambda state: None)
    resumed, _ = _resumed(config, tmp_path)
    assert not _same(resumed, whole)


def test_a_progress_file_of_another_config_is_ignored(tmp_path):
    path = tmp_path / "run.pt"
    _stopped_at_second_evaluation(_config(), path)
    other = _config(lr=1e-3)
    lines: list[str] = []
    result = train(other, progress=False, log=lines.append, progress_file=path)
    assert not any("resumed" in line for line in lines)
    assert _same(result, train(other, progress=False))


def test_an_unwritable_progress_file_warns_and_the_run_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="not written"):
        result = train(_config(), progress=False, progress_file=blocker / "run.pt")
    assert _same(result, train(_config(), progress=False))


def test_a_run_warm_started_from_a_moved_state_file_still_resumes(tmp_path):
    # A study's out dir can move (a committed store resumed elsewhere): init_from is then another absolute path to
    # the same state file, and the run must continue from its progress, not start over.
    first = train(_config(steps=10), progress=False, save_state=tmp_path / "a" / "state.safetensors")
    assert first.steps == 10
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "state.safetensors").write_bytes((tmp_path / "a" / "state.safetensors").read_bytes())
    path = tmp_path / "run.pt"
    _stopped_at_second_evaluation(_config(init_from=str(tmp_path / "a" / "state.safetensors")), path)
    moved = _config(init_from=str(tmp_path / "b" / "state.safetensors"))
    lines: list[str] = []
    result = train(moved, progress=False, log=lines.append, progress_file=path)
    assert lines[0].startswith("step 10: resumed from")
    assert _same(result, train(moved, progress=False))


@pytest.mark.parametrize("content", [b"", b"not a progress file"])
def test_an_unreadable_progress_file_warns_and_the_run_starts_over(tmp_path, content):
    path = tmp_path / "run.pt"
    path.write_bytes(content)  # what a power cut or another program can leave
    with pytest.warns(UserWarning, match="not read"):
        result = train(_config(), progress=False, progress_file=path)
    assert _same(result, train(_config(), progress=False)) and not path.exists()


def test_another_state_file_of_the_same_name_is_not_resumed_from(tmp_path):
    for folder, seed in (("a", 0), ("b", 1)):
        train(_config(steps=10, seed=seed), progress=False, save_state=tmp_path / folder / "state.safetensors")
    path = tmp_path / "run.pt"
    _stopped_at_second_evaluation(_config(init_from=str(tmp_path / "a" / "state.safetensors")), path)
    other = _config(init_from=str(tmp_path / "b" / "state.safetensors"))  # other weights, the same file name
    lines: list[str] = []
    result = train(other, progress=False, log=lines.append, progress_file=path)
    assert not any("resumed" in line for line in lines) and _same(result, train(other, progress=False))


def test_a_run_stopped_after_its_last_step_resumes_with_the_annealed_temperature(tmp_path):
    # No progress is written at the last evaluation: a resume runs at least one step, so an annealed Gumbel
    # temperature is set again before the test (a resume with nothing left to train tested at the first one).
    config = _config(gumbel_tau_final=0.1)
    whole = train(config, progress=False)
    path = tmp_path / "run.pt"

    def stop(model, task):
        raise KeyboardInterrupt  # in the end probes, after the last evaluation

    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, on_end=stop, progress_file=path)
    lines: list[str] = []
    result = train(config, progress=False, log=lines.append, progress_file=path)
    assert lines[0].startswith("step 20: resumed") and _same(result, whole)


def test_a_resumed_run_reports_the_time_its_earlier_process_spent(tmp_path):
    path = tmp_path / "run.pt"
    _stopped_at_second_evaluation(_config(), path)
    before_wall, before_cpu = torch.load(path, weights_only=True)["spent"]  # what the stopped process spent
    assert before_wall > 0 and before_cpu > 0
    result = train(_config(), progress=False, progress_file=path)
    assert result.earlier_cpu_seconds == before_cpu
    assert result.seconds > before_wall  # the earlier part plus this process's own


def test_a_run_in_one_process_has_no_earlier_time(tmp_path):
    assert train(_config(steps=10), progress=False, progress_file=tmp_path / "run.pt").earlier_cpu_seconds == 0.0


def test_the_study_counts_a_resumed_runs_earlier_cpu_time(monkeypatch):
    from axiomformer import train as trainer
    from axiomformer.study import runner

    monkeypatch.setattr(trainer, "train", lambda *a, **k: {"earlier_cpu_seconds": 1234.5})
    cpu = runner.execute({"task": "needle", "seq_len": 8, "steps": 1}, threads=1)["cpu_seconds"]
    assert 1234.5 <= cpu < 1234.5 + 60  # the earlier processes' time plus this one's (a stand-in: almost none)
