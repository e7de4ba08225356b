"""Checkpoints: weights as safetensors, everything else as JSON — nothing is ever unpickled.

A checkpoint directory holds ``model.safetensors`` (the state dict) and ``config.json``:
``{"model": model.config, ...extra}``, where ``model.config`` is what :func:`axiomformer.models.build_from_config`
rebuilds the model from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def save_checkpoint(directory: str | Path, model: nn.Module, **extra: Any) -> Path:
    """Write ``model`` (which must carry a ``config`` dict, as every axiomformer model does) into ``directory``.

    Args:
        extra: JSON-serializable entries stored next to ``"model"`` in config.json (e.g. ``train=config``).

    Returns:
        The directory. Raises ValueError if the model has no ``config``.
    """
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        raise ValueError(f"{type(model).__name__} has no .config dict; build it with axiomformer.models.build_model")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path / WEIGHTS))
    (path / CONFIG).write_text(json.dumps({"model": config, **extra}, indent=2, default=str) + "\n")
    return path


def load_checkpoint(directory: str | Path, *, device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
    """Rebuild the model saved in ``directory`` and load its weights; returns ``(model, config.json contents)``.

    Raises:
        FileNotFoundError: the directory lacks ``model.safetensors`` or ``config.json``.
    """
    from axiomformer.models import build_from_config

    path = Path(directory)
    for name in (WEIGHTS, CONFIG):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} not found: not an axiomformer checkpoint directory")
    meta = json.loads((path / CONFIG).read_text())
    model = build_from_config(meta["model"])
    load_model(model, str(path / WEIGHTS), strict=True, device=str(device))
    return model.to(device), meta
