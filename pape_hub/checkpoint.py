"""Checkpoint folders that load from both faces, written atomically.

A folder is what the transformers face's ``save_pretrained`` writes (``model.safetensors``, ``config.json`` with
``auto_map``, the code files) with timm's fields (``architecture``, ``model_args``, ``pretrained_cfg``,
``label_names``) and a ``pape_hub`` block (encoding, training facts) in the same ``config.json``. It loads with
``timm.create_model("local-dir:PATH", pretrained=True)``, ``AutoModelForImageClassification.from_pretrained(PATH)``
and, once pushed, ``"hf-hub:org/name"`` / ``from_pretrained("org/name")``. A folder is built beside its target and
swapped in whole; single files go through a temporary name and a rename. An interrupted save never leaves a
half-written checkpoint.
"""

from __future__ import annotations

import copy
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

from .hf.configuration_pape_vit import check_config_agreement
from .hf.remote_code import write_remote_code
from .records import EVALUATION_FILE, Evaluation

__all__ = ["atomic_write", "load_checkpoint", "newest_complete", "read_config", "recover_dir",
           "replace_dir", "save_checkpoint"]

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are as readable as every other file written here
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _swap_names(dst: Path) -> tuple[Path, Path]:
    """(complete new copy, previous copy) beside ``dst`` during a swap."""
    return dst.with_name(f".{dst.name}.new"), dst.with_name(f".{dst.name}.old")


def replace_dir(src: Path, dst: Path) -> None:
    """Move the finished folder ``src`` onto ``dst`` so that a kill at any point leaves a complete copy that
    :func:`recover_dir` puts back: ``src`` is first renamed to ``.dst.new`` (complete by construction), then the
    old ``dst`` to ``.dst.old``, then ``.dst.new`` to ``dst``; the old copy is removed last."""
    new, old = _swap_names(dst)
    recover_dir(dst)
    os.replace(src, new)
    if dst.exists():
        os.replace(dst, old)
    os.replace(new, dst)
    if old.exists():
        shutil.rmtree(old)


def recover_dir(dst: Path) -> Path:
    """Finish or undo a swap that :func:`replace_dir` did not complete; returns ``dst``. The newest complete copy
    wins: ``.dst.new`` (the swap stopped before moving it in), else ``dst``, else ``.dst.old`` (it stopped between
    the two renames). A ``.tmp`` folder that was never handed to ``replace_dir`` is not complete and is ignored."""
    new, old = _swap_names(dst)
    if new.is_dir():
        if dst.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(dst, old)
        os.replace(new, dst)
    elif not dst.exists() and old.is_dir():
        os.replace(old, dst)
    if dst.exists() and old.exists():
        shutil.rmtree(old)
    return dst


def newest_complete(dst: Path) -> Path:
    """Where a reader finds the newest complete copy of ``dst`` without changing anything on disk (see
    :func:`recover_dir`, which a writer calls)."""
    new, old = _swap_names(dst)
    return new if new.is_dir() else dst if dst.exists() or not old.is_dir() else old


def save_checkpoint(model: torch.nn.Module, directory: str | Path,
                    results: Evaluation | dict[str, Any] | None = None, *, label_names: list[str] | None = None,
                    data_config: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` (a pape_hub timm model, or the transformers face) to ``directory`` in the layout both faces
    load: what the transformers face's ``save_pretrained`` writes (safetensors with the ``vit.`` prefix,
    ``auto_map``, code files) with timm's fields in the same ``config.json``, and the processor. ``results`` (an
    :class:`~pape_hub.records.Evaluation`, or its dict) is written as ``eval.json``, which the model card is made
    from. Each
    file is written once, from the model's own tensors (no second model is built); the folder is written beside
    ``directory`` and swapped in whole, so an interrupted save leaves the previous checkpoint intact."""
    from .hf.convert import config_from_timm, processor_for, transformers_class
    from .hf.modeling_pape_vit import folder_fields

    directory = Path(directory)
    face = hasattr(model, "vit") and hasattr(model, "config")  # the transformers face: its core is the timm model
    core = model.vit if face else model
    if face:
        mean, std = model.config.normalisation()
        data_config = data_config or dict(mean=mean, std=std)
        cfg = timm.models.get_pretrained_cfg(model.config.timm_name()).to_dict()  # what timm builds it with
    else:
        cfg = getattr(model, "pretrained_cfg", None) or {}
    # how inputs are cropped and resized travels with the model (a converted source's crop_pct), unless given
    data_config = {**{k: cfg[k] for k in ("crop_pct", "crop_mode", "interpolation") if cfg.get(k) is not None},
                   **(data_config or {})}
    if face:
        hf_config = model.config
        if label_names:  # the given labels win over the model's, as for a timm model; the model is left as it is
            hf_config = copy.deepcopy(hf_config)
            hf_config.id2label = dict(enumerate(label_names))
            hf_config.label2id = {name: i for i, name in enumerate(label_names)}
    else:
        hf_config = config_from_timm(model, label_names, data_config.get("mean"), data_config.get("std"))
    hf_class = transformers_class(hf_config, head=bool(core.num_classes))
    config = {**hf_config.to_diff_dict(), "architectures": [hf_class.__name__],
              "dtype": str(next(core.parameters()).dtype).removeprefix("torch."),
              **folder_fields(hf_class.auto_map, hf_config, core), "pape_hub": dict(extra or {})}
    keys = ("input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation")
    config["pretrained_cfg"].update({k: list(v) if isinstance(v, (list, tuple)) else v
                                     for k, v in data_config.items() if k in keys})
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {f"vit.{k}": v.detach().contiguous() for k, v in core.state_dict().items()}  # the transformers keys
    save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
    (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_remote_code(tmp, entries=[v.split(".")[0] for v in hf_class.auto_map.values()])
    processor_for(hf_config).save_pretrained(tmp)  # pipeline("image-classification", model=folder)
    if results is not None:
        record = results.to_dict() if isinstance(results, Evaluation) else results
        (tmp / EVALUATION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    replace_dir(tmp, directory)
    return directory


def read_config(directory: str | Path) -> dict[str, Any]:
    """A checkpoint folder's config.json (after finishing a save that was interrupted), checked to be an object."""
    path = newest_complete(Path(directory)) / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{directory} is not a pape_hub checkpoint: {CONFIG} is missing")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is corrupt (not valid JSON): {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object of model settings, got a JSON {type(config).__name__}")
    return config


def load_checkpoint(directory: str | Path, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model, config) from a checkpoint folder; ``overrides`` are extra model constructor arguments."""
    directory = newest_complete(Path(directory))
    config = read_config(directory)
    if "architecture" not in config:
        raise ValueError(f"{directory / CONFIG} has no 'architecture': not a timm/pape_hub checkpoint")
    check_config_agreement(config, str(directory / CONFIG))
    args = {**config.get("model_args", {}), **overrides}
    args.setdefault("num_classes", config.get("num_classes"))
    # the checkpoint's data config (its normalisation, input size, labels), not the registered name's defaults
    data_keys = ("input_size", "interpolation", "crop_pct", "mean", "std", "num_classes", "label_names")
    overlay = {k: v for k, v in config.get("pretrained_cfg", {}).items() if k in data_keys}
    if config.get("label_names"):
        overlay["label_names"] = list(config["label_names"])
    model = timm.create_model(config["architecture"], pretrained_cfg_overlay=overlay, **args)
    weights = directory / WEIGHTS
    if not weights.exists():
        raise FileNotFoundError(f"{directory} has no {WEIGHTS}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights} is corrupt or not a safetensors file: {err}") from err
    state = {k.removeprefix("vit."): v for k, v in state.items()}  # the transformers face's keys
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights} does not match {config['architecture']}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]} - a checkpoint of another encoding or size?")
    return model, config
