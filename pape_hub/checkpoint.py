"""Checkpoint folders: ``model.safetensors`` + ``config.json`` in timm's Hub layout, written atomically.

``config.json`` is what ``timm.save_for_hf`` writes (``architecture``, ``model_args``, ``pretrained_cfg``,
``label_names``) plus a ``pape_hub`` block (encoding, its arguments, training facts), so a folder loads with
``timm.create_model("local-dir:PATH", pretrained=True)`` or, once pushed, ``"hf-hub:org/name"``.
Every file is written to a temporary name in the same folder and renamed over the old one, so an interrupted
save never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from timm.models._hub import save_config_for_hf

__all__ = ["atomic_write", "load_checkpoint", "read_config", "replace_dir", "save_checkpoint"]

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def replace_dir(src: Path, dst: Path) -> None:
    """Move a finished folder onto ``dst``; the old ``dst`` is removed only after the new one is in place."""
    old = dst.with_name(f".{dst.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    if old.exists():
        shutil.rmtree(old)


def save_checkpoint(model: torch.nn.Module, directory: str | Path, label_names: list[str] | None = None,
                    data_config: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (a pape_hub timm model) to ``directory`` in the Hub layout."""
    directory = Path(directory)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    enc = model.pos_encoding
    model_config = {"pape_hub": {"encoding": enc.name, **(extra or {})}}
    if label_names:
        model_config["label_names"] = list(label_names)

    def write_config(tmp: Path) -> None:
        save_config_for_hf(model, str(tmp), model_config=model_config, data_config=data_config)

    atomic_write(directory / CONFIG, write_config)
    return directory


def read_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{directory} is not a pape_hub checkpoint: {CONFIG} is missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is corrupt (not valid JSON): {err}") from err


def load_checkpoint(directory: str | Path, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model, config) from a checkpoint folder; ``overrides`` are extra model constructor arguments."""
    directory = Path(directory)
    config = read_config(directory)
    if "architecture" not in config:
        raise ValueError(f"{directory / CONFIG} has no 'architecture': not a timm/pape_hub checkpoint")
    args = {**config.get("model_args", {}), **overrides}
    args.setdefault("num_classes", config.get("num_classes"))
    model = timm.create_model(config["architecture"], **args)
    weights = directory / WEIGHTS
    if not weights.exists():
        raise FileNotFoundError(f"{directory} has no {WEIGHTS}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights} is corrupt or not a safetensors file: {err}") from err
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights} does not match {config['architecture']}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]} - a checkpoint of another encoding or size?")
    return model, config
