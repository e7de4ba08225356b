"""Checkpoints: weights as safetensors, everything else as JSON — nothing is ever unpickled.

A checkpoint directory holds ``model.safetensors`` (the state dict) and ``config.json``:
``{"model": model.config, ...extra}``, where ``model.config`` is what :func:`axiomformer.models.build_from_config`
rebuilds the model from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside its wrappers: ``torch.compile``'s ``OptimizedModule`` (``_orig_mod``), DDP and
    ``DataParallel`` (``module``). Their state dicts prefix every key (``_orig_mod.``, ``module.``), which the plain
    model rebuilt from ``config`` would not load (karpathy/nanoGPT#325)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(compiled := getattr(model, "_orig_mod", None), nn.Module):  # what torch.compile returns
            model = compiled
        else:
            return model


def save_checkpoint(directory: str | Path, model: nn.Module, **extra: Any) -> Path:
    """Write ``model`` (which must carry a ``config`` dict, as every axiomformer model does) into ``directory``.

    A compiled or data-parallel model is saved as the model it wraps (:func:`unwrap_model`), so the checkpoint loads
    into a plain model. Each file is written beside its final name and renamed into place: an interrupted save never
    leaves a half-written file under the final name.

    Args:
        extra: JSON-serializable entries stored next to ``"model"`` in config.json (e.g. ``train=config``).

    Returns:
        The directory. Raises ValueError if the model has no ``config``.
    """
    model = unwrap_model(model)
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        raise ValueError(f"{type(model).__name__} has no .config dict; build it with axiomformer.models.build_model")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    partial = path / (WEIGHTS + ".partial")
    save_model(model, str(partial))
    os.replace(partial, path / WEIGHTS)
    partial = path / (CONFIG + ".partial")
    partial.write_text(json.dumps({"model": config, **extra}, indent=2, default=str) + "\n")
    os.replace(partial, path / CONFIG)
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
