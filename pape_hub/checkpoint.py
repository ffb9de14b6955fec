"""Checkpoint folders that load from both faces, written atomically.

A folder is what the transformers face's ``save_pretrained`` writes (``model.safetensors``, ``config.json`` with
``auto_map``, the code files) with timm's fields (``architecture``, ``model_args``, ``pretrained_cfg``,
``label_names``) and a ``pape_hub`` block (encoding, training facts) in the same ``config.json``. It loads with
``timm.create_model("local-dir:PATH", pretrained=True)``, ``AutoModelForImageClassification.from_pretrained(PATH)``
and, once pushed, ``"hf-hub:org/name"`` / ``from_pretrained("org/name")``. A folder is built beside its target and
swapped in whole; single files go through a temporary name and a rename. An interrupted save never leaves a
half-written checkpoint.

A writer deletes only what it wrote: each folder lists its files in a hidden manifest (:data:`MANIFEST`). A folder
that holds anything else (the user's files, or a folder that is no checkpoint at all) is refused by name; with
``overwrite=True`` the checkpoint's files are written into it and only files an earlier save listed are replaced or
removed. Saves into one folder take turns (a lock beside it), so concurrent writers never mix two models: the last
complete save wins whole.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import timm
import torch
from filelock import FileLock
from safetensors import SafetensorError
from safetensors.torch import save_file

from .folder import (
    CONFIG,
    IMAGE_PROCESSOR,
    MANIFEST,
    VIDEO_PROCESSOR,
    WEIGHTS,
    WEIGHTS_INDEX,
    DataConfig,
    atomic_write,
    read_manifest,
    read_weights,
    weight_files,
    write_manifest,
)
from .hf.configuration_pape_vit import check_checkpoint_config
from .hf.remote_code import write_remote_code
from .models.free_tokens import FreeTokenTransformer
from .models.weights import check_finite_weights
from .records import EVALUATION_FILE, Evaluation

__all__ = ["MANIFEST", "atomic_write", "check_checkpoint_target", "check_output_path", "check_weights_shapes",
           "foreign_files", "load_checkpoint", "owned_files",
           "newest_complete", "read_config", "record_outputs", "recover_dir", "replace_dir", "save_checkpoint",
           "warn_interrupted_save"]

#: what a checkpoint folder written before the manifest existed holds of pape_hub's (its remote code: ``*.py``)
_LEGACY_NAMES = (WEIGHTS, CONFIG, IMAGE_PROCESSOR, VIDEO_PROCESSOR, EVALUATION_FILE,
                 "comparison.json", "accuracy_vs_size.png")


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
    """Where a reader finds ``dst`` without changing anything on disk: ``dst`` itself, as timm's ``local-dir:`` and
    transformers' ``from_pretrained`` read it (so every loader loads the same model), with a warning when an
    interrupted save left a newer complete copy beside it; only where a save was killed between its two renames and
    ``dst`` is missing, the complete copy it left. :func:`recover_dir` (a writer's) finishes the swap."""
    new, old = _swap_names(dst)
    if dst.exists():
        warn_interrupted_save(dst)
        return dst
    return new if new.is_dir() else old if old.is_dir() else dst


def warn_interrupted_save(dst: Path) -> None:
    """Warn when an interrupted save left a complete newer copy of ``dst`` that no loader reads yet."""
    new, _ = _swap_names(dst)
    if new.is_dir():
        warnings.warn(f"an interrupted save left a newer complete copy of {dst} at {new}; loading {dst} as every "
                      f"loader does. pape_hub.checkpoint.recover_dir({str(dst)!r}) (or the next save) moves the newer "
                      "copy in", RuntimeWarning, stacklevel=3)


def _owned(directory: Path) -> set[str]:
    """What pape_hub wrote in ``directory``: its manifest's names, or for a checkpoint folder saved before manifests
    existed (a pape_hub ``config.json``) the names a save and its evaluation write there."""
    listed = read_manifest(directory)
    if listed is not None:
        return listed | {MANIFEST}
    try:
        config = json.loads((directory / CONFIG).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(config, dict) or "position_encoding" not in config or "pape_hub" not in config:
        return set()
    return {p.name for p in directory.iterdir()
            if p.is_file() and not p.is_symlink() and (p.name in _LEGACY_NAMES or p.suffix == ".py")}


def owned_files(directory: str | Path) -> list[str]:
    """The regular files (no links) in ``directory`` that pape_hub wrote there, by its manifest (sorted)."""
    directory = Path(directory)
    return sorted(name for name in _owned(directory)
                  if (directory / name).is_file() and not (directory / name).is_symlink())


def foreign_files(directory: Path) -> list[str]:
    """The entries of an existing folder that pape_hub did not write there (sorted; folders end in '/')."""
    owned = _owned(directory)  # pape_hub writes regular files only: a listed link or folder is not its own
    return sorted(p.name + ("/" if p.is_dir() else "") for p in directory.iterdir()
                  if p.name not in owned or p.is_symlink() or not p.is_file())


def record_outputs(directory: str | Path, *names: str) -> None:
    """Add files a writer put into a checkpoint folder after its save (an evaluation, a card, a plot) to the folder's
    manifest, so that a later save may replace them; a folder without a manifest is left as it is."""
    directory = Path(directory)
    listed = read_manifest(directory)
    if listed is not None and not set(names) <= listed:
        write_manifest(directory, listed | set(names))


#: the files that make a checkpoint folder loadable: no other writer may put its output there
_LOADABLE = (WEIGHTS, WEIGHTS_INDEX, CONFIG, IMAGE_PROCESSOR, VIDEO_PROCESSOR, MANIFEST)


def check_output_path(output: str | Path, flag: str = "--output") -> Path:
    """Refuse an output path that is one of a checkpoint folder's own files (its weights, config, processor config,
    code or manifest): an evaluation or a card written there would break the checkpoint."""
    output = Path(output)
    is_checkpoint = (output.parent / CONFIG).is_file() or (output.parent / MANIFEST).is_file()
    if is_checkpoint and (output.name in _LOADABLE or output.suffix == ".py"):
        raise ValueError(f"{flag} {output} is a file of the checkpoint folder {output.parent} (it would overwrite "
                         "what loading it needs); write elsewhere, or leave the option out")
    return output


def check_checkpoint_target(directory: str | Path, overwrite: bool = False) -> list[str]:
    """Refuse a place :func:`save_checkpoint` may not write, before any work: a file, or a folder holding files
    pape_hub did not write there (unless ``overwrite``, which keeps them). Returns those files (empty: the folder
    is missing, empty or a pape_hub checkpoint, and is replaced whole)."""
    if Path(directory).name in ("", ".", ".."):  # "", ".", "..", "/": a save replaces the folder it names
        raise ValueError(f"{str(directory)!r} names no checkpoint folder of its own: give a folder path such as "
                         "'my_model' (a save swaps the whole folder in)")
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} is a file, not a checkpoint folder: save to a folder path (the "
                                 "file is left as it is)")
    if not directory.is_dir():
        return []
    foreign = foreign_files(directory)
    if foreign and not overwrite:
        shown = ", ".join(foreign[:6]) + (f" and {len(foreign) - 6} more" if len(foreign) > 6 else "")
        raise FileExistsError(f"{directory} is not empty and is not a checkpoint pape_hub wrote: it holds {shown}. "
                              "Save to a new folder, or pass overwrite=True (--overwrite) to write the checkpoint's "
                              "files into it, replacing only files pape_hub wrote there")
    return foreign


def save_checkpoint(model: torch.nn.Module, directory: str | Path,
                    results: Evaluation | dict[str, Any] | None = None, *, label_names: list[str] | None = None,
                    data_config: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
                    overwrite: bool = False) -> Path:
    """Write ``model`` (a pape_hub timm model, or the transformers face) to ``directory`` in the layout both faces
    load, and return the folder.

    The folder holds what the transformers face's ``save_pretrained`` writes (safetensors with the ``vit.`` prefix,
    ``auto_map``, code files) with timm's fields in the same ``config.json``, and the processor. Each file is written
    once, from the model's own tensors (no second model is built); the folder is written beside ``directory`` and
    swapped in whole, so an interrupted save leaves the previous checkpoint intact.

    Args:
        model: a model of ``timm.create_model("vit_*"/"vivit_*")`` or of the transformers face.
        directory: the checkpoint folder: new, empty, or one pape_hub wrote (replaced whole). A folder holding
            anything else is refused, naming what it holds.
        results: an :class:`~pape_hub.records.Evaluation` (or its dict), written as ``eval.json`` for the model card.
        label_names: class names (default: the model's own, or ``LABEL_i``).
        data_config: normalisation and input size the model was trained with (default: the model's pretrained cfg).
        extra: facts kept in ``config.json``'s ``pape_hub`` block (dataset, recipe, source of a conversion).
        overwrite: write into a folder that holds other files too; only files an earlier save listed are replaced
            or removed, the others stay.

    Example:
        >>> import pape_hub, timm
        >>> model = timm.create_model("vit_t4_pape", embed_dim=32, depth=2, num_heads=2)
        >>> folder = pape_hub.save_checkpoint(model, "my_model")
        >>> restored, config = pape_hub.load_checkpoint(folder)
        >>> config["position_encoding"]
        'pape'
    """
    directory = Path(directory)
    if directory.is_symlink():  # a linked folder (e.g. onto a larger disk): write where it points, keep the link
        directory = directory.resolve()
    check_checkpoint_target(directory, overwrite)  # before any work, without the lock
    directory.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory.with_name(f".{directory.name}.lock"))):  # concurrent saves take turns
        foreign = check_checkpoint_target(directory, overwrite)  # again: the folder may have changed meanwhile
        tmp = directory.with_name(f".{directory.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # what a killed save of ours left: never complete
        tmp.mkdir()
        _write_checkpoint_files(tmp, model, results, label_names, data_config, extra)
        write_manifest(tmp, {p.name for p in tmp.iterdir()})
        if foreign:
            _move_into(tmp, directory, set(foreign))
        else:
            replace_dir(tmp, directory)
    return directory


def _move_into(tmp: Path, directory: Path, foreign: set[str]) -> None:
    """``overwrite`` into a folder with other files: each file of the new save replaces only a file of the earlier
    save (one rename each); files the earlier save listed and this one does not are removed; the rest stay."""
    new = {p.name for p in tmp.iterdir()}
    clash = sorted(new & {name.rstrip("/") for name in foreign})
    if clash:
        shutil.rmtree(tmp)
        raise FileExistsError(f"{directory} holds {', '.join(clash)}, which pape_hub did not write and a checkpoint "
                              "needs; move them or save to another folder")
    stale = _owned(directory) - new
    for name in sorted(new - {MANIFEST}) + [MANIFEST]:  # the manifest last: it lists what is there
        os.replace(tmp / name, directory / name)
    for name in stale:  # plain names (checked on read); a link or folder of that name is left as it is
        path = directory / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    tmp.rmdir()


def _write_checkpoint_files(tmp: Path, model: torch.nn.Module, results: Evaluation | dict[str, Any] | None,
                            label_names: list[str] | None, data_config: dict[str, Any] | None,
                            extra: dict[str, Any] | None) -> None:
    """The files of a checkpoint folder, each written once from the model's own tensors."""
    from .hf.convert import config_from_timm, processor_for, transformers_class
    from .hf.modeling_pape_vit import folder_fields

    face = hasattr(model, "vit") and hasattr(model, "config")  # the transformers face: its core is the timm model
    core = model.vit if face else model
    images = not isinstance(core, FreeTokenTransformer)  # points and events have no pixels and no processor
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
    if not images and core.num_classes and len(hf_config.id2label) != core.num_classes:
        raise ValueError(f"{len(hf_config.id2label)} label names for a model of {core.num_classes} classes")
    hf_class = transformers_class(hf_config, head=bool(core.num_classes))
    config = {**hf_config.to_diff_dict(), "architectures": [hf_class.__name__],
              "dtype": str(next(core.parameters()).dtype).removeprefix("torch."),
              **folder_fields(hf_class.auto_map, hf_config, core), "pape_hub": dict(extra or {})}
    if images:  # one data config, checked, from which timm's fields and the transformers processor are both written
        inputs = DataConfig.from_pretrained_cfg(config["pretrained_cfg"], **data_config)
        config["pretrained_cfg"].update(inputs.timm_fields())
    weights = {f"vit.{k}": v.detach().contiguous() for k, v in core.state_dict().items()}  # the transformers keys
    save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
    os.chmod(tmp / WEIGHTS, 0o644)  # safetensors writes 0600; the folder's files are all equally readable
    (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_remote_code(tmp, entries=[v.split(".")[0] for v in hf_class.auto_map.values()])
    if images:
        processor_for(hf_config, inputs).save_pretrained(tmp)  # pipeline("image-classification", model=folder)
    if results is not None:
        record = results.to_dict() if isinstance(results, Evaluation) else results
        (tmp / EVALUATION_FILE).write_text(json.dumps(record, indent=2) + "\n")


def is_free_token_config(config: dict[str, Any]) -> bool:
    """Whether a checkpoint's config.json describes a point or event model (no transformers fields to check)."""
    from .models.zoo import FREE_TOKEN_FAMILIES

    name = config.get("architecture")
    return isinstance(name, str) and name.split("_")[0] in FREE_TOKEN_FAMILIES


def read_config(directory: str | Path) -> dict[str, Any]:
    """A checkpoint folder's config.json (after finishing a save that was interrupted), checked to be an object."""
    path = newest_complete(Path(directory)) / CONFIG
    if not path.exists():
        kept = [name for name in ("best", "last") if (Path(directory) / name / CONFIG).exists()]
        hint = (f"; it is a training output folder: pass its checkpoint {Path(directory) / kept[0]}"
                + (f" (or {Path(directory) / kept[1]})" if len(kept) > 1 else "")) if kept else ""
        raise FileNotFoundError(f"{directory} is not a pape_hub checkpoint: {CONFIG} is missing{hint}")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is corrupt (not valid JSON): {err}") from err
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object of model settings, got a JSON {type(config).__name__}")
    return config


def check_architecture(config: dict[str, Any], where: str) -> str:
    """The config's ``architecture``: a model name pape_hub registers with timm (never ``hf-hub:``/``local-dir:``,
    which would make a local load contact the Hub or read another folder)."""
    from .models.zoo import list_pape_models

    name = config.get("architecture")
    if not isinstance(name, str) or name.split(".")[0] not in list_pape_models():
        raise ValueError(f"{where} has architecture {name!r}, which is no pape_hub model name (see "
                         "pape_hub.list_pape_models()): not a pape_hub checkpoint, or an edited config.json")
    return name


def check_weights_shapes(config: dict[str, Any], weights: str | Path | list[Path], where: str | None = None,
                         **overrides: Any) -> None:
    """Build the model ``config`` describes on the meta device (no memory) and compare every tensor's shape with the
    weights file's header (every shard's, for a list), before anything is allocated: a file of another size or
    encoding, or a config that asks for a far larger model than its weights, is refused naming the first tensors
    that differ."""
    from safetensors import safe_open

    args = {**config.get("model_args", {}), **overrides}
    args.setdefault("num_classes", config.get("num_classes"))
    model = timm.create_model(config["architecture"], device="meta", **args)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    files = weights if isinstance(weights, list) else [Path(weights)]
    weights = files[0] if len(files) == 1 else files[0].parent / WEIGHTS_INDEX
    found = {}
    for path in files:
        try:
            with safe_open(str(path), "pt") as fh:
                found.update({k.removeprefix("vit."): tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is corrupt or not a safetensors file: {err}") from err
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    shaped = [f"{k} {found[k]} (the config: {expected[k]})" for k in sorted(set(found) & set(expected))
              if found[k] != expected[k]]
    if missing or unexpected or shaped:
        raise ValueError(f"{weights} does not match the model {where or 'its config.json'} describes "
                         f"({config['architecture']}): " + "; ".join(filter(None, [
                             f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}"
                             if unexpected else "", f"other shapes {shaped[:3]}" if shaped else ""]))
                         + " - a checkpoint of another encoding or size, or an edited config.json?")


def load_checkpoint(directory: str | Path, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A checkpoint folder as a timm model: ``(model, config)``.

    Before anything is built, ``config.json`` is checked (sizes within bounds, both faces' fields in agreement) and
    compared with the weights file's tensor shapes; the weights must be finite.

    Args:
        directory: a folder :func:`save_checkpoint` (or training, or ``pape-hub convert``) wrote.
        overrides: extra model constructor arguments (e.g. ``drop_path_rate=0.1``).

    Example:
        >>> import pape_hub
        >>> model, config = pape_hub.load_checkpoint("my_model")  # the folder save_checkpoint's example wrote
        >>> config["architecture"]
        'vit_t4_pape'
    """
    directory = newest_complete(Path(directory))
    config = read_config(directory)
    if "architecture" not in config:
        raise ValueError(f"{directory / CONFIG} has no 'architecture': not a timm/pape_hub checkpoint")
    check_architecture(config, str(directory / CONFIG))
    check_checkpoint_config(config, str(directory / CONFIG))
    if not is_free_token_config(config):  # points and events have no pixels to prepare
        try:  # how inputs are prepared: sizes within bounds, one positive std per channel
            DataConfig.from_pretrained_cfg(config.get("pretrained_cfg") or {})
        except (ValueError, TypeError) as err:
            raise ValueError(f"{directory / CONFIG}: its pretrained_cfg (how inputs are prepared) is invalid: {err}"
                             ) from err
    files = weight_files(directory)  # model.safetensors, or the shards of a sharded save
    check_weights_shapes(config, files, str(directory / CONFIG), **overrides)
    args = {**config.get("model_args", {}), **overrides}
    args.setdefault("num_classes", config.get("num_classes"))
    # the checkpoint's data config (its normalisation, input size, labels), not the registered name's defaults
    data_keys = ("input_size", "interpolation", "crop_pct", "mean", "std", "num_classes", "label_names")
    overlay = {k: v for k, v in config.get("pretrained_cfg", {}).items() if k in data_keys}
    if config.get("label_names"):
        overlay["label_names"] = list(config["label_names"])
    model = timm.create_model(config["architecture"], pretrained_cfg_overlay=overlay, **args)
    weights = files[0] if len(files) == 1 else directory / WEIGHTS_INDEX
    try:
        state = read_weights(files)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{weights} is corrupt or not a safetensors file: {err}") from err
    state = {k.removeprefix("vit."): v for k, v in state.items()}  # the transformers face's keys
    check_finite_weights(state, str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights} does not match {config['architecture']}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]} - a checkpoint of another encoding or size?")
    return model, config
