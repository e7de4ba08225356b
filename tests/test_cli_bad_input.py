"""Bad input on the command line, for every command: one clear line naming the input and what was expected, exit code
2, no traceback, and whatever was there is left byte-for-byte as it was."""

import hashlib
import sqlite3

import pytest
from typer.testing import CliRunner

from axiomformer.cli import COMMANDS, app


def _invoke(args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    text = result.output.strip()
    return result, text


def _assert_one_clear_line(result, text, *expected):
    assert result.exit_code == 2, (result.exit_code, text, result.exception)
    assert "Traceback" not in text and not isinstance(result.exception, (TypeError, sqlite3.Error)), text
    last = text.splitlines()[-1]
    assert last.lower().startswith("error: "), text
    for fragment in expected:
        assert fragment in last, (fragment, last)


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def corrupt_store(tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "results.sqlite").write_bytes(b"this is not a database\n" * 40)
    return folder


@pytest.fixture
def foreign_db(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    conn = sqlite3.connect(folder / "results.sqlite")
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    return folder


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file.txt"
    path.write_text("precious\n")
    return path


@pytest.mark.parametrize("store", ["corrupt_store", "foreign_db"])
@pytest.mark.parametrize("command", [["report"], ["study", "--quick", "--out"]])
def test_store_that_is_not_a_results_store_is_left_untouched(command, store, request):
    folder = request.getfixturevalue(store)
    before = _digest(folder)
    result, text = _invoke([*command, folder])
    _assert_one_clear_line(result, text, str(folder / "results.sqlite"), "not an axiomformer results store")
    assert _digest(folder) == before  # same files, same bytes, nothing added


def test_study_out_is_a_file(a_file):
    result, text = _invoke(["study", "--quick", "--out", a_file])
    _assert_one_clear_line(result, text, str(a_file), "expected a")
    assert a_file.read_text() == "precious\n"


def test_study_bad_config(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("seeds = [\n")
    result, text = _invoke(["study", "--config", config, "--out", tmp_path / "out"])
    _assert_one_clear_line(result, text, str(config), "TOML")


def test_report_missing_folder(tmp_path):
    result, text = _invoke(["report", tmp_path / "nowhere"])
    _assert_one_clear_line(result, text, "nowhere")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("module:os:getcwd", "expected a callable (q, k, v) -> out"),
        ("module:no_such_module_xyz:fn", "No module named"),
        ("spec:normalizer=nope", "choose one of"),
    ],
)
def test_audit_bad_target(target, fragment):
    result, text = _invoke(["audit", target])
    _assert_one_clear_line(result, text, target if target.startswith("module:os") else "", fragment)


def test_audit_out_under_a_file(a_file):
    result, text = _invoke(["audit", "--matrix", "--out", a_file / "matrix.md"])
    _assert_one_clear_line(result, text, str(a_file), "expected a folder")


def test_derive_out_under_a_file(a_file):
    result, text = _invoke(["derive", "--out", a_file / "derive.md"])
    _assert_one_clear_line(result, text, str(a_file), "expected a folder")
    assert a_file.read_text() == "precious\n"


def test_train_bad_task_and_checkpoint(a_file):
    _assert_one_clear_line(*_invoke(["train", "--task", "nope"]), "unknown task 'nope'")
    result, text = _invoke(["train", "--task", "copy", "--seq-len", "8", "--steps", "1", "--checkpoint", a_file])
    _assert_one_clear_line(result, text, str(a_file), "expected a folder")
    assert a_file.read_text() == "precious\n"


def test_flow_bad_data_folder_and_out(tmp_path, a_file):
    result, text = _invoke(["flow", "--data", "fashion-mnist", "--data-dir", tmp_path, "--quick"])
    _assert_one_clear_line(result, text, str(tmp_path))
    _assert_one_clear_line(*_invoke(["flow", "--out", a_file, "--quick"]), str(a_file), "expected a folder")


def test_bench_bad_out_and_lengths(a_file):
    _assert_one_clear_line(*_invoke(["bench", "--out", a_file, "--quick"]), str(a_file), "expected a folder")
    _assert_one_clear_line(*_invoke(["bench", "--lengths", "x"]), "--lengths expects comma-separated integers")
    assert a_file.read_text() == "precious\n"


def test_surgery_bad_model_folder(tmp_path):
    pytest.importorskip("transformers")
    result, text = _invoke(["surgery", "--model-dir", tmp_path])
    _assert_one_clear_line(result, text, str(tmp_path), "config.json")


def test_spec_bad_spec():
    _assert_one_clear_line(*_invoke(["spec", "A4=nope"]), "unknown score 'nope'", "choose one of")


def test_every_command_has_a_bad_input_test():
    tested = {"spec", "derive", "audit", "train", "study", "flow", "bench", "surgery"}
    assert set(COMMANDS) <= tested


def test_unknown_command_and_option():
    _assert_one_clear_line(*_invoke(["nosuchcommand"]), "No such command")
    _assert_one_clear_line(*_invoke(["derive", "--nosuch"]), "No such option")


def test_a_bug_is_not_disguised_as_bad_input(monkeypatch):
    """The check can fail: an unexpected exception still surfaces as itself (exit 1), not as a user error line."""
    from axiomformer.spec import AttentionSpec

    def broken(self, *args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(AttentionSpec, "describe", broken)
    result, _ = _invoke(["spec", "A4=cosine"])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)
