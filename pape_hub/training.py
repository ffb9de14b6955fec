"""One training loop on accelerate for every model and dataset (``pape-hub train`` / ``scripts/train.py``).

A recipe (:mod:`pape_hub.recipes`: ``default``, or a paper's own, e.g. ``paper-pape``) decides the init of the
linear layers, which parameters weight decay reaches, the schedule's shape and the values of the settings it states;
any setting given explicitly wins. The ``default`` recipe: AdamW, linear warm-up then cosine, no weight decay on
norms, biases and position parameters, label smoothing, drop path. Data augmentation comes from ``timm.data`` as a
preset (``aug``, e.g. ``default`` = DeiT's RandAugment / Mixup / CutMix) whose parts can each be overridden.
Pixels are normalised with the training split's own mean and std unless ``normalize="model"``.
Runs as ``python``, ``pape-hub`` or ``accelerate launch`` (CPU, one GPU or many).

Output folder (one run per folder: a non-empty folder is refused unless ``overwrite`` or ``resume``, and a lock
keeps a second run out while one is writing):
    best/, last/         model.safetensors + config.json (both faces' layout), written atomically each epoch
    state/               accelerate ``save_state`` (model, optimizer, scheduler, RNG, sampler) + trainer_state.json
    metrics.jsonl        one JSON line per epoch
    results.json         final numbers (test split scored with the best-on-validation checkpoint)
    .pape_hub_run.json   the manifest: what this package writes here. ``overwrite`` removes only what an earlier
                         run's manifest lists, after every setting, the data and the model have been checked;
                         it never removes a file it did not write.
Every folder is swapped in whole (:func:`~pape_hub.checkpoint.replace_dir`), so a kill at any point leaves a
complete copy that ``resume`` and loading find. A non-finite loss stops the run with an error before the
optimizer step; the checkpoints of the last finished epoch stay as they were.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import timm
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from accelerate.utils.constants import RNG_STATE_NAME
from filelock import FileLock, Timeout
from timm.data import Mixup, create_transform
from timm.loss import SoftTargetCrossEntropy
from timm.models import get_pretrained_cfg
from torch.utils.data import DataLoader
from torchvision import transforms

from .checkpoint import atomic_write, recover_dir, replace_dir, save_checkpoint
from .data import (
    DATASET_SPECS,
    ArrowConfig,
    MotionConfig,
    VideoTransform,
    build_data,
    channel_statistics,
    check_splits,
    generated_task,
    is_video_spec,
)
from .models import model_args_for
from .progress import Progress, duration
from .recipes import (
    AUGMENTATION_PRESETS,
    RECIPE_SETTINGS,
    RECIPES,
    build_optimizer,
    get_recipe,
    init_linear_layers,
    lr_schedule,
    resolve,
    setting_help,
)
from .settings import setting

__all__ = ["AUGMENTATION_PRESETS", "TrainConfig", "evaluate_loader", "train"]

#: settings a resumed run must share with the run it continues (``allow_changed_hparams`` permits changes)
RESUME_HPARAMS = ("recipe", "lr", "min_lr", "batch_size", "weight_decay", "warmup_epochs", "grad_accum", "clip_grad",
                  "label_smoothing", "drop_path", "aug", "crop_scale", "crop_padding", "hflip", "color_jitter",
                  "randaugment", "mixup", "cutmix", "normalize", "train_size", "val_fraction", "arrow", "motion",
                  "num_frames", "seed", "img_size")
LOCK_NAME, MANIFEST_NAME = ".pape_hub.lock", ".pape_hub_run.json"
#: what a training run writes in its output folder (and nothing else there is ever removed)
RUN_OUTPUTS = ("best", "last", "state", "metrics.jsonl", "results.json")
#: numeric settings and their allowed range, checked by name (all must also be finite)
RANGES: dict[str, tuple[float, float, str]] = {
    "lr": (0.0, 1.0, "(0, 1]"), "min_lr": (0.0, 1.0, "[0, lr]"), "weight_decay": (0.0, 10.0, "[0, 10]"),
    "warmup_epochs": (0.0, math.inf, "[0, epochs]"), "label_smoothing": (0.0, 1.0, "[0, 1)"),
    "drop_path": (0.0, 1.0, "[0, 1)"), "clip_grad": (0.0, math.inf, "[0, inf), 0 for none"),
    "hflip": (0.0, 1.0, "[0, 1]"),
    "color_jitter": (0.0, 10.0, "[0, 10]"), "mixup": (0.0, 100.0, "[0, 100]"), "cutmix": (0.0, 100.0, "[0, 100]"),
    "val_fraction": (0.0, 1.0, "(0, 1)"),
}


_PRESET = "(default: the preset's)"


@dataclass
class TrainConfig:
    """Every setting of a training run; each field is also a ``pape-hub train`` flag (``--field-name``), described
    here once. The settings a recipe states default to None and are filled from it (``__post_init__``)."""

    model: str = setting("vit_m12_rope_mixed", "a registered model name (pape_hub.list_pape_models(); vit_m12_* is "
                         "the arrow task's micro ViT, a minute an epoch on a laptop CPU)")
    model_kwargs: dict[str, Any] = setting(help='JSON object of extra model constructor arguments (e.g. {"in_chans": '
                                           '1} for grey images)', default_factory=dict)
    dataset: str = setting("arrows", DATASET_SPECS)
    output_dir: str = setting("outputs/run", "where the checkpoints, state and metrics go")
    epochs: int = setting(8, "passes over the training split")
    batch_size: int = setting(128, "images per optimizer step (per process)")
    lr: float = setting(2e-3, "peak learning rate")
    recipe: str = setting("default", "init, weight-decay groups, schedule and the settings below a source states "
                          "(pape_hub.recipes); a setting given explicitly wins: "
                          + "; ".join(f"{r.name}: {r.source}" for r in RECIPES.values()), choices=list(RECIPES))
    min_lr: float | None = setting(None, "end of the schedule; " + setting_help("min_lr"))
    weight_decay: float | None = setting(None, setting_help("weight_decay"))
    warmup_epochs: float | None = setting(None, setting_help("warmup_epochs"))
    label_smoothing: float | None = setting(None, setting_help("label_smoothing"))
    drop_path: float | None = setting(None, setting_help("drop_path"))
    clip_grad: float | None = setting(None, "max gradient norm, 0 for none; " + setting_help("clip_grad"))
    aug: str | None = setting(None, "augmentation preset for natural images; the flags below override its parts ("
                              + "; ".join(f"{k}: {v}" for k, v in AUGMENTATION_PRESETS.items()) + "); "
                              + setting_help("aug"), choices=list(AUGMENTATION_PRESETS))
    crop_scale: tuple[float, float] | None = setting(None, "random-resized-crop area range " + _PRESET,
                                                     metavar="MIN,MAX")
    crop_padding: int | None = setting(None, "pad by this much, then a random crop of the image size " + _PRESET)
    hflip: float | None = setting(None, "horizontal flip probability " + _PRESET)
    color_jitter: float | None = setting(None, "colour jitter strength " + _PRESET)
    randaugment: str | None = setting(None, "timm auto_augment string, '' for none " + _PRESET)
    mixup: float | None = setting(None, "Mixup alpha, 0 for none " + _PRESET)
    cutmix: float | None = setting(None, "CutMix alpha, 0 for none " + _PRESET)
    normalize: str = setting("dataset", "normalise pixels with the training split's mean/std or the model's "
                             "pretrained_cfg", choices=["dataset", "model"])
    grad_accum: int = setting(1, "batches per optimizer step")
    seed: int = setting(0, "seed of the init, the data order and the augmentation")
    mixed_precision: str = setting("no", "accelerate's mixed precision", choices=["no", "fp16", "bf16"])
    resume: str | None = setting(None, "an output dir (or its state/) to continue exactly")
    init_from: str | None = setting(None, "seed the model from a checkpoint folder or a converted public checkpoint "
                                    "(pape_hub.list_pretrained()): every non-positional weight, the encoding's own "
                                    "where it is the same, the head where the classes agree; the model's own init "
                                    "for the rest", metavar="CHECKPOINT|NAME.TAG")
    allow_changed_hparams: bool = setting(False, "let --resume continue with hyper-parameters other than the saved "
                                          "run's")
    overwrite: bool = setting(False, "replace what an earlier run left in --output-dir")
    stop_after_epoch: int | None = setting(None, "stop after this many epochs (the schedule still spans --epochs); "
                                           "--resume later")
    num_workers: int = setting(0, "data-loader worker processes")
    img_size: int | None = setting(None, "image size (default: the model's)")
    val_fraction: float = setting(0.1, "share of the training split held out for validation (datasets without one)")
    train_size: int = setting(16384, "generated tasks: training samples per epoch")
    eval_size: int = setting(2000, "generated tasks: validation and test samples")
    arrow: dict[str, Any] = setting(help="ArrowConfig fields (flags --arrow-*)", default_factory=dict, flag=False)
    motion: dict[str, Any] = setting(help="MotionConfig fields (flags --motion-*)", default_factory=dict, flag=False)
    num_frames: int | None = setting(None, "video folders: frames sampled per clip (default: the model's)")
    log_with: str | None = setting(None, "accelerate tracker: tensorboard, wandb, ...")
    flush_denormals: bool = setting(True, "on CPU, flush subnormal floats to zero (PaPE trains ~3x faster); "
                                    "--keep-denormals keeps them", negated="keep_denormals")
    image_column: str = setting("image", "hf datasets: image column")
    label_column: str = setting("label", "hf datasets: label column")
    quiet: bool = setting(False, "no progress bars or per-epoch lines")

    def __post_init__(self) -> None:
        """Refuse values that cannot train, naming the setting (and its command-line flag)."""
        def bad(name: str, rule: str) -> None:
            raise ValueError(f"{name} (--{name.replace('_', '-')}) {rule}, got {getattr(self, name)!r}")

        for f in fields(self):  # every number, wherever it is: finite (NaN and infinity train to NaN weights)
            value = getattr(self, f.name)
            numbers = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                bad(f.name, "must be a finite number")
        recipe = get_recipe(self.recipe)
        for name in RECIPE_SETTINGS:  # after the finiteness check: a value computed from lr is not blamed on lr
            if getattr(self, name) is None:
                setattr(self, name, resolve(recipe.settings[name], self))
        for name in ("epochs", "batch_size", "grad_accum", "train_size", "eval_size"):
            if getattr(self, name) < 1:
                bad(name, "must be at least 1")
        if self.stop_after_epoch is not None and self.stop_after_epoch < 1:
            bad("stop_after_epoch", "must be at least 1 (epochs to run before stopping)")
        if self.num_workers < 0:
            bad("num_workers", "must not be negative")
        if self.crop_padding is not None and self.crop_padding < 0:
            bad("crop_padding", "must not be negative")
        for name, (low, high, shown) in RANGES.items():
            value = getattr(self, name)
            open_low = name in ("lr", "val_fraction")
            open_high = name in ("label_smoothing", "drop_path", "val_fraction")
            if value is not None and not ((low < value if open_low else low <= value)
                                          and (value < high if open_high else value <= high)):
                bad(name, f"must be in {shown}")
        if self.min_lr > self.lr:
            bad("min_lr", f"must be in [0, lr={self.lr}]")
        if self.warmup_epochs > self.epochs:
            bad("warmup_epochs", f"must be in [0, epochs={self.epochs}]")
        if self.aug not in AUGMENTATION_PRESETS:
            bad("aug", f"must be one of {list(AUGMENTATION_PRESETS)}")
        if self.normalize not in ("dataset", "model"):
            bad("normalize", "must be 'dataset' or 'model'")
        if self.crop_scale is not None:
            self.crop_scale = tuple(float(v) for v in self.crop_scale)
            if len(self.crop_scale) != 2 or not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
                bad("crop_scale", "must be two numbers 0 < min <= max <= 1")
        if not isinstance(self.model_kwargs, dict):
            bad("model_kwargs", "must be a JSON object of model constructor arguments")

    def augmentation(self) -> dict[str, Any]:
        """The ``aug`` preset with this config's explicit overrides."""
        aug = dict(AUGMENTATION_PRESETS[self.aug])
        aug.update({k: getattr(self, k) for k in aug if getattr(self, k) is not None})
        return aug

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoint it resumes, always."""
        return dict(model=self.model, model_kwargs=self.model_kwargs, dataset=self.dataset, epochs=self.epochs)


@torch.no_grad()
def evaluate_loader(model: torch.nn.Module, loader: Any, accelerator: Accelerator | None = None,
                    position_interpolation: bool | None = None, progress: str | None = None) -> dict[str, float]:
    """Top-1, top-5 and cross-entropy over a loader (gathered across processes); ``position_interpolation``
    overrides the model's setting for these calls; ``progress`` names a progress bar over the batches."""
    model.eval()
    correct1 = correct5 = loss_sum = count = 0.0
    main = accelerator is None or accelerator.is_main_process
    for images, labels in Progress(loader, desc=progress or "", enabled=progress is not None and main, unit="batch"):
        if position_interpolation is None:
            logits = model(images).float()
        else:  # a pape_hub model (not wrapped): the setting passed down for this call
            logits = model.forward_head(model.forward_features(images, position_interpolation)).float()
        if accelerator is not None:
            logits, labels = accelerator.gather_for_metrics((logits, labels))
        loss_sum += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
        correct1 += (top[:, 0] == labels).sum().item()
        correct5 += (top == labels[:, None]).any(-1).sum().item()
        count += labels.numel()
    return dict(top1=correct1 / max(count, 1), top5=correct5 / max(count, 1), loss=loss_sum / max(count, 1),
                count=int(count))


def build_model(cfg: TrainConfig, num_classes: int, img_size: int, num_frames: int | None = None) -> torch.nn.Module:
    """The model, initialised as the recipe states (its model arguments, e.g. dropout, unless given explicitly)."""
    recipe = get_recipe(cfg.recipe)
    kwargs = dict(num_classes=num_classes, img_size=img_size, drop_path_rate=cfg.drop_path, **recipe.model_kwargs)
    if num_frames is not None:
        kwargs["num_frames"] = num_frames
    kwargs.update(cfg.model_kwargs)
    model = timm.create_model(cfg.model, **kwargs)
    init_linear_layers(model, recipe)
    return model


def seed_from(source: str, model: torch.nn.Module) -> str:
    """Transplant (:func:`pape_hub.transplant`) a checkpoint folder's or a converted entry's (``NAME.TAG``) weights
    into ``model``: the backbone always, position weights where the encoding is the same, the head where the
    classes agree; the model's own init for the rest. Says what was copied and what is new."""
    from .checkpoint import load_checkpoint
    from .models.pretrained import SOURCES, transplant

    if source in SOURCES:
        weights = timm.create_model(source, pretrained=True)
    elif Path(source).is_dir():
        weights, _ = load_checkpoint(source)
    else:
        raise ValueError(f"init_from (--init-from) {source!r} is neither a checkpoint folder nor a converted entry "
                         "(pape_hub.list_pretrained())")
    return f"seeded from {source}: {transplant(weights, model).summary()}"


def launched_processes() -> int | None:
    """How many processes ``accelerate launch`` was asked for when it started this one with its simple launcher (it
    sets MASTER_ADDR for several but starts one, and no WORLD_SIZE): the launcher's own ``--num_processes``, read
    from its command line (2 or more where that cannot be read); None when not launched that way."""
    if not os.environ.get("ACCELERATE_USE_CPU") or not os.environ.get("MASTER_ADDR") or os.environ.get("WORLD_SIZE"):
        return None
    try:
        words = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return 2
    for i, word in enumerate(words):
        flag, _, value = word.partition("=")
        if flag in ("--num_processes", "--num-processes"):
            value = value or (words[i + 1] if i + 1 < len(words) else "")
            return int(value) if value.isdigit() else 2
    return 2


def warn_if_launched_as_one(accelerator: Accelerator) -> None:
    """Say so when ``accelerate launch --num_processes N`` started one process: on a machine without GPUs accelerate
    starts N only with ``--multi_gpu`` (and ``--cpu``); the run goes on as one process."""
    asked = launched_processes()
    if asked and asked > 1 and accelerator.num_processes == 1:
        print(f"warning: accelerate launch was asked for {asked} processes but started one (this is process 1 of 1):"
              f" on a machine without GPUs, add --multi_gpu --cpu to the launch command for {asked} CPU processes "
              "(ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N ...); training continues "
              "as one process", file=sys.stderr, flush=True)


def seed_hub_id(source: str) -> str | None:
    """The Hub repo a seed's weights come from (a converted entry's source), None for a local folder."""
    from .models.pretrained import SOURCES, source_cfg

    return source_cfg(source).get("hf_hub_id") if source in SOURCES else None


def check_resume(cfg: TrainConfig, state_dir: Path) -> dict[str, Any]:
    """The saved trainer state, after checking the run can continue exactly as ``cfg`` describes."""
    path = state_dir / "trainer_state.json"
    if not path.exists():
        raise FileNotFoundError(f"cannot resume: {path} does not exist (was the run saved at least one epoch?)")
    saved = json.loads(path.read_text())
    if saved["identity"] != cfg.identity():
        raise ValueError(f"cannot resume: {state_dir} is a checkpoint of {saved['identity']}, "
                         f"but this run is {cfg.identity()}")
    if not any(state_dir.glob(f"{RNG_STATE_NAME}*.pkl")):
        raise FileNotFoundError(f"cannot resume exactly: {state_dir} has no random-number state "
                                f"({RNG_STATE_NAME}_*.pkl); the data order and augmentation would differ")
    check_state_files(state_dir)
    now = asdict(cfg)
    changed = {k: (_saved_setting(saved["config"], k), now[k]) for k in RESUME_HPARAMS
               if _comparable(_saved_setting(saved["config"], k)) != _comparable(now[k])}
    if changed and not cfg.allow_changed_hparams:
        listing = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"cannot resume {state_dir} with other hyper-parameters ({listing}); pass the saved values, "
                         "or --allow-changed-hparams to continue with the new ones")
    return saved


def check_state_files(state_dir: Path) -> None:
    """Read every file of a saved training state as accelerate will (``weights_only``: no code runs from them), so
    that a truncated or corrupt one is named now: accelerate itself skips random-number states it cannot read and
    would resume silently with another data order."""
    from accelerate.utils import load as accelerate_load
    from safetensors import SafetensorError, safe_open

    for path in sorted(state_dir.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as fh:
                    [fh.get_slice(k) for k in fh.keys()]
            elif path.suffix in (".pkl", ".bin", ".pt"):
                accelerate_load(path, map_location="cpu")
        except (OSError, RuntimeError, ValueError, EOFError, SafetensorError, pickle.UnpicklingError) as err:
            raise ValueError(f"cannot resume: {path} is truncated or corrupt ({type(err).__name__}: "
                             f"{str(err)[:200]}); resume from an intact copy, or start again") from err


def _saved_setting(config: dict[str, Any], name: str) -> Any:
    """A saved run's setting, in today's terms: runs saved before recipes existed trained with the default one, and
    wrote "no clipping" as None (today 0)."""
    value = config.get(name, "default" if name == "recipe" else None)
    return 0.0 if name == "clip_grad" and value is None else value


def _comparable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _manifest(out: Path) -> list[str]:
    """What earlier runs of this package wrote in ``out`` (their manifest), or nothing."""
    path = out / MANIFEST_NAME
    try:
        listed = json.loads(path.read_text()).get("outputs", []) if path.is_file() else []
    except (ValueError, AttributeError):
        return []
    return [name for name in listed if name in RUN_OUTPUTS]


def _with_swap_names(out: Path, name: str) -> list[Path]:
    """``name`` and the temporary siblings this package makes while replacing it (``.name.tmp/.new/.old``,
    ``.name.<random>`` of an atomic file write)."""
    return [out / name, *out.glob(f".{name}.*")]


def _resuming_here(cfg: TrainConfig) -> bool:
    out = Path(cfg.output_dir).resolve()
    return cfg.resume is not None and Path(cfg.resume).resolve() in (out, out / "state")


def check_output_dir(cfg: TrainConfig) -> None:
    """Refuse an output folder this run may not use, before any work and without touching it: a used folder
    without ``resume`` or ``overwrite``, and, with ``overwrite``, files in the way that no earlier run wrote."""
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output-dir {out} exists and is not a folder")
    if not out.exists() or _resuming_here(cfg):
        return
    leftovers = sorted(p.name for p in out.iterdir() if p.name not in (LOCK_NAME, MANIFEST_NAME))
    if leftovers and not cfg.overwrite:
        raise FileExistsError(f"--output-dir {out} already holds a run ({', '.join(leftovers[:5])}); pass --resume "
                              f"{out} to continue it, --overwrite to replace it, or choose another folder")
    ours = set(_manifest(out))
    foreign = sorted(p.name for name in RUN_OUTPUTS if name not in ours for p in _with_swap_names(out, name)
                     if p.exists())
    if foreign:
        raise FileExistsError(f"--output-dir {out} holds {', '.join(foreign[:5])}, which no pape_hub run wrote there "
                              "(its manifest does not list them); --overwrite removes only a run's own outputs, so "
                              "move them or choose another folder")


def claim_output_dir(cfg: TrainConfig, main: bool) -> FileLock | None:
    """Lock the folder for this run, remove what an earlier run listed in its manifest (with ``overwrite``), and
    list this run's outputs before writing any. Called once everything has been checked."""
    if not main:  # only the main process writes; another one re-checking would race with its manifest write
        return None
    check_output_dir(cfg)  # again: the folder may have changed while the data and model were prepared
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout as err:
        raise RuntimeError(f"another run is writing to {out} (its lock {out / LOCK_NAME} is held); wait for it to "
                           "finish or choose another --output-dir") from err
    if cfg.overwrite and not _resuming_here(cfg):
        for name in _manifest(out):
            for path in _with_swap_names(out, name):
                shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    atomic_write(out / MANIFEST_NAME, lambda p: p.write_text(json.dumps(dict(
        written_by="pape_hub training", outputs=list(RUN_OUTPUTS)), indent=1) + "\n"))
    return lock


def release_output_dir(lock: FileLock | None, cfg: TrainConfig) -> None:
    if lock is not None:
        lock.release()
        (Path(cfg.output_dir) / LOCK_NAME).unlink(missing_ok=True)  # no empty lock file left behind


def data_transforms(cfg: TrainConfig, img_size: int, channels: int, mean: Any, std: Any, crop_pct: float,
                    video: bool = False) -> tuple[Any, Any]:
    """(train, eval) transforms of an image or video dataset: the augmentation preset, then normalisation. Clips
    take the preset's random-resized crop and flip, the same for every frame (RandAugment, jitter, Mixup and
    CutMix are image-only)."""
    aug = cfg.augmentation()
    if video:
        if aug["crop_padding"]:
            raise ValueError("crop_padding (--crop-padding) is an image augmentation; clips take --crop-scale")
        return (VideoTransform(img_size, mean, std, crop_scale=aug["crop_scale"], hflip=aug["hflip"]),
                VideoTransform(img_size, mean, std))
    eval_tf = create_transform(img_size, is_training=False, mean=mean, std=std, interpolation="bicubic",
                               crop_pct=crop_pct)
    if aug["crop_scale"] is None and not aug["crop_padding"] and not aug["hflip"] and not aug["color_jitter"] \
            and not aug["randaugment"]:
        return eval_tf, eval_tf
    train_tf = create_transform(img_size, is_training=True, scale=aug["crop_scale"] or (1.0, 1.0),
                                hflip=aug["hflip"], color_jitter=aug["color_jitter"],
                                auto_augment=aug["randaugment"] or None, mean=mean, std=std, interpolation="bicubic",
                                separate=bool(aug["crop_padding"]))
    if aug["crop_padding"]:  # the CIFAR crop: pad, then a random crop of the image size (timm has no such stage)
        _, colour, final = train_tf
        crop = transforms.Compose([
            transforms.Resize(img_size, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(img_size), transforms.RandomCrop(img_size, padding=aug["crop_padding"]),
            transforms.RandomHorizontalFlip(aug["hflip"])])
        train_tf = transforms.Compose([crop, colour, final])
    return train_tf, eval_tf


def normalisation(cfg: TrainConfig, img_size: int, channels: int, crop_pct: float, num_frames: int | None,
                  setting: Any = None) -> tuple[list[float], list[float]]:
    """Mean and std (one per channel) the run normalises with: the training split's own, or the model's.
    ``setting``: the generated task's (:func:`task_setting`), whose statistics are known in closed form."""
    if cfg.normalize == "model":
        pretrained = get_pretrained_cfg(cfg.model).to_dict()
        mean, std = list(pretrained["mean"]), list(pretrained["std"])
        if channels == 1:  # a grey model: the average of the model's per-channel values
            mean, std = [sum(mean) / len(mean)], [sum(std) / len(std)]
        return mean, std
    if setting is not None:
        mean, std = generated_task(cfg.dataset).statistics(setting)
        return [round(mean, 6)] * channels, [round(std, 6)] * channels
    if num_frames is not None:  # a video folder: decoding is slow, so fewer clips
        to_tensor = VideoTransform(img_size, (0.0,) * channels, (1.0,) * channels)
        samples = 256
    else:
        to_tensor = create_transform(img_size, is_training=False, mean=(0.0,) * channels, std=(1.0,) * channels,
                                     interpolation="bicubic", crop_pct=crop_pct)
        samples = 2048
    raw = build_data(cfg.dataset, img_size=img_size, val_fraction=cfg.val_fraction, train_transform=to_tensor,
                     eval_transform=to_tensor, image_column=cfg.image_column, label_column=cfg.label_column,
                     channels=channels, num_frames=num_frames or 16)
    return channel_statistics(raw.train, max_samples=samples)


def train(cfg: TrainConfig, on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train, validate every epoch, keep best/last, score the test split with the best; returns results.
    ``on_epoch`` receives each finished epoch's record (main process; e.g. a parent's progress bar).

    Everything is checked (settings, model, output folder, data) before the output folder is touched. Training
    ends at the checkpoints; evaluating, carding and pushing them is the caller's (``pape-hub train
    --push-to-hub`` composes them)."""
    model_args_for(cfg.model)  # an unknown name fails here, before any work
    check_output_dir(cfg)
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision, gradient_accumulation_steps=cfg.grad_accum,
        log_with=cfg.log_with, project_dir=str(cfg.output_dir),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    if cfg.flush_denormals and accelerator.device.type == "cpu":
        # PaPE's strongly negative logits make softmax terms subnormal; x86 CPUs handle those tens of times slower
        # (a PaPE training step: 3.5x a plain ViT with them, 1.2x without). Zeroing them changes no result that
        # matters; the setting is process-wide, which is why the training entry point, not the model, sets it.
        torch.set_flush_denormal(True)
    set_seed(cfg.seed)
    warn_if_launched_as_one(accelerator)
    talk = accelerator.is_main_process and not cfg.quiet
    if talk:  # at once: the data and the model take a while to prepare
        print(f"training {cfg.model} on {cfg.dataset} for {cfg.epochs} epochs into {cfg.output_dir} "
              f"({accelerator.device}, {torch.get_num_threads()} threads x {accelerator.num_processes} process(es)); "
              "preparing the data and the model", flush=True)
    run = build_run(cfg, accelerator)
    if talk:
        sizes = " / ".join(f"{len(split):,} {name}" for name, split in (("training", run.data.train),
                                                                        ("validation", run.data.val),
                                                                        ("test", run.data.test)) if split is not None)
        parameters = sum(p.numel() for p in accelerator.unwrap_model(run.model).parameters())
        print(f"  {parameters / 1e6:.2f}M parameters; {sizes} samples; {run.steps_per_epoch} steps of "
              f"{cfg.batch_size * cfg.grad_accum} per epoch", flush=True)
    lock = claim_output_dir(cfg, accelerator.is_main_process)
    try:
        return fit(cfg, accelerator, run, on_epoch)
    finally:
        release_output_dir(lock, cfg)


@dataclass
class Run:
    """Everything a training run is made of once the settings, data and model are checked."""

    data: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    criterion: torch.nn.Module
    mixup: Mixup | None
    train_loader: Any
    val_loader: Any
    test_loader: Any
    steps_per_epoch: int
    data_config: dict[str, Any]
    facts: dict[str, Any]


def _input_spec(cfg: TrainConfig, generated: Any) -> tuple[int, int | None, bool]:
    """(image size, frames per clip or None, is video), checked against the model; ``generated``: the generated
    task's setting, or None."""
    defaults = {**model_args_for(cfg.model), **cfg.model_kwargs}
    video = "num_frames" in defaults
    if video != is_video_spec(cfg.dataset):
        raise ValueError(f"{cfg.model} is {'a video' if video else 'an image'} model but {cfg.dataset!r} is "
                         f"{'a video' if is_video_spec(cfg.dataset) else 'an image'} dataset")
    img_size = generated.image_size if generated else (cfg.img_size or defaults["img_size"])
    if generated and cfg.img_size not in (None, img_size):
        raise ValueError(f"--img-size {cfg.img_size} does not match the {cfg.dataset} images ({img_size}px)")
    num_frames = None
    if video:
        num_frames = generated.frames if generated else (cfg.num_frames or defaults["num_frames"])
        if generated and list(defaults["tubelet_size"])[0] != generated.tubelet_frames:
            raise ValueError(f"the motion task keeps frames still within tubelets of {generated.tubelet_frames}, but "
                             f"the model's tubelet is {list(defaults['tubelet_size'])}; make them agree")
    return img_size, num_frames, video


def task_setting(cfg: TrainConfig) -> Any:
    """The generated task's setting (``ArrowConfig`` / ``MotionConfig`` from ``cfg.arrow`` / ``cfg.motion``), or
    None for a dataset read from files."""
    task = generated_task(cfg.dataset)
    return None if task is None else task.config_class(**getattr(cfg, task.setting_field))


def build_run(cfg: TrainConfig, accelerator: Accelerator) -> Run:
    """Data, model, optimizer, schedule and loss, prepared by accelerate."""
    arrow_cfg, motion_cfg = ArrowConfig(**cfg.arrow), MotionConfig(**cfg.motion)  # checked whatever the dataset
    setting = task_setting(cfg)
    img_size, num_frames, video = _input_spec(cfg, setting)
    channels = cfg.model_kwargs.get("in_chans", 3)
    crop_pct = get_pretrained_cfg(cfg.model).to_dict().get("crop_pct", 0.9)
    mean, std = normalisation(cfg, img_size, channels, crop_pct, num_frames, setting)
    train_tf, eval_tf = data_transforms(cfg, img_size, channels, mean, std, crop_pct, video)
    data = build_data(cfg.dataset, img_size=img_size, seed=cfg.seed, val_fraction=cfg.val_fraction,
                      train_size=cfg.train_size, eval_size=cfg.eval_size, arrow_config=arrow_cfg,
                      train_transform=train_tf, eval_transform=eval_tf, image_column=cfg.image_column,
                      label_column=cfg.label_column, channels=channels, normalize=(mean, std),
                      motion_config=motion_cfg, num_frames=num_frames or 16)
    check_splits(data)  # a broken file is named now, not after an epoch of training
    num_classes = len(data.classes)
    generator = torch.Generator().manual_seed(cfg.seed)
    train_loader = DataLoader(data.train, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                              num_workers=cfg.num_workers, generator=generator)
    val_loader = DataLoader(data.val, batch_size=cfg.batch_size, num_workers=cfg.num_workers)
    test_loader = DataLoader(data.test, batch_size=cfg.batch_size, num_workers=cfg.num_workers) \
        if data.test is not None else None
    if len(train_loader) == 0:
        raise ValueError(f"the training split has {len(data.train)} samples, fewer than one batch of {cfg.batch_size}")

    model = build_model(cfg, num_classes, img_size, num_frames)
    if cfg.init_from:
        seeded = seed_from(cfg.init_from, model)
        if accelerator.is_main_process and not cfg.quiet:
            print(seeded)
    recipe = get_recipe(cfg.recipe)
    optimizer = build_optimizer(model, recipe, cfg.lr, cfg.weight_decay)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    # the schedule counts optimizer steps of one process (its shard of the data); accelerate steps a prepared
    # scheduler once per process at each optimizer step, hence the division: N processes at batch B follow the
    # schedule of one process at batch N x B
    steps_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    warmup = max(1, round(cfg.warmup_epochs * steps_per_epoch))
    processes = accelerator.num_processes
    factor = lr_schedule(recipe, warmup, total_steps, cfg.min_lr / cfg.lr, steps_per_epoch)
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: factor(s // processes)))
    aug = cfg.augmentation()
    mixup = None
    if data.is_images and (aug["mixup"] > 0 or aug["cutmix"] > 0):
        mixup = Mixup(mixup_alpha=aug["mixup"], cutmix_alpha=aug["cutmix"], label_smoothing=cfg.label_smoothing,
                      num_classes=num_classes)
        criterion: torch.nn.Module = SoftTargetCrossEntropy()
    else:
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    if test_loader is not None:
        test_loader = accelerator.prepare(test_loader)
    data_config = dict(input_size=(channels, img_size, img_size), mean=mean, std=std)
    facts = dict(dataset=data.description, model=cfg.model, model_kwargs=cfg.model_kwargs, seed=cfg.seed,
                 recipe=recipe_summary(cfg))
    if cfg.init_from:  # where the weights started: a public checkpoint's Hub id is the card's base_model
        facts["seeded_from"] = seed_hub_id(cfg.init_from)
    return Run(data, model, optimizer, scheduler, criterion, mixup, train_loader, val_loader, test_loader,
               steps_per_epoch, data_config, facts)


def resume_state_dir(resume: str | Path) -> Path:
    """The state folder of ``--resume`` (a run folder or its ``state/``), after finishing an interrupted swap."""
    resume_dir = Path(resume)
    candidate = resume_dir / "state"
    if candidate.is_dir() or any(resume_dir.glob(".state.*")):
        return recover_dir(candidate)
    return recover_dir(resume_dir)


def fit(cfg: TrainConfig, accelerator: Accelerator, run: Run,
        on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The epochs (from a resumed state if asked), then the test score of the best checkpoint."""
    out, main = Path(cfg.output_dir), accelerator.is_main_process
    start_epoch, best, history = 0, dict(top1=-1.0, epoch=-1), []
    if cfg.resume:
        state_dir = resume_state_dir(cfg.resume)
        saved = check_resume(cfg, state_dir)
        accelerator.load_state(str(state_dir))
        start_epoch, best, history = saved["epoch"] + 1, saved["best"], saved["history"]
        if main and not cfg.quiet:
            print(f"resumed from {state_dir} after epoch {saved['epoch'] + 1} (step {saved['step']})")
    if cfg.log_with:
        accelerator.init_trackers(out.name, config={k: str(v) for k, v in asdict(cfg).items()})
    started = time.time()
    last_epoch = cfg.epochs if cfg.stop_after_epoch is None else min(cfg.epochs, cfg.stop_after_epoch)
    for epoch in range(start_epoch, last_epoch):
        epoch_started = time.time()
        train_loss = train_one_epoch(cfg, accelerator, run, epoch)
        val = evaluate_loader(run.model, run.val_loader, accelerator)
        record = dict(epoch=epoch, train_loss=train_loss, val_top1=val["top1"], val_top5=val["top5"],
                      val_loss=val["loss"], lr=run.scheduler.get_last_lr()[0],
                      images_seen=(epoch + 1) * len(run.data.train), epoch_s=round(time.time() - epoch_started, 1),
                      elapsed_s=round(time.time() - started, 1))
        history.append(record)
        accelerator.log(record, step=epoch)
        if val["top1"] > best["top1"]:
            best = dict(top1=val["top1"], epoch=epoch)
        save_epoch(cfg, accelerator, run, record, best, history)
        if main and not cfg.quiet:
            left = (time.time() - started) / (epoch + 1 - start_epoch) * (last_epoch - epoch - 1)
            print(f"epoch {epoch + 1}/{cfg.epochs}: train loss {train_loss:.4f}, val top-1 {val['top1']:.4f}, "
                  f"{duration(record['epoch_s'])} this epoch, {duration(record['elapsed_s'])} elapsed"
                  + (f", {duration(left)} left" if left else ""), flush=True)
        if on_epoch is not None and main:
            on_epoch(record)
    return finish(cfg, accelerator, run, best, history, started)


def train_one_epoch(cfg: TrainConfig, accelerator: Accelerator, run: Run, epoch: int) -> float:
    """One pass over the training split; returns the mean loss. A non-finite loss stops the run before the
    optimizer step, so the weights and the checkpoints of the last finished epoch stay as they were."""
    run.model.train()
    run.train_loader.set_epoch(epoch)
    loss_sum, seen = 0.0, 0
    # a bar on a terminal; in a log, a plain line every 30 s (and the per-epoch line save_epoch prints)
    bar = Progress(run.train_loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="batch",
                   enabled=accelerator.is_main_process and not cfg.quiet)
    for step, (images, labels) in enumerate(bar):
        with accelerator.accumulate(run.model):
            targets = labels
            if run.mixup is not None:
                images, targets = run.mixup(images, labels)
            loss = run.criterion(run.model(images), targets)
            value = loss.item()  # one host sync per step, shared by the finiteness check and the running mean
            check_finite_loss(value, accelerator, epoch, step, Path(cfg.output_dir))
            accelerator.backward(loss)
            if accelerator.sync_gradients and cfg.clip_grad:
                accelerator.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
        loss_sum += value * labels.shape[0]
        seen += labels.shape[0]
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", lr=f"{run.scheduler.get_last_lr()[0]:.2e}")
    return loss_sum / max(seen, 1)


def check_finite_loss(loss: float, accelerator: Accelerator, epoch: int, step: int, out: Path) -> None:
    """Raise on a NaN or infinite loss in any process (every process stops together)."""
    finite = math.isfinite(loss)
    if accelerator.num_processes > 1:
        flag = torch.tensor([float(finite)], device=accelerator.device)
        finite = accelerator.reduce(flag, reduction="sum").item() == accelerator.num_processes
    if not finite:
        kept = out / "last" if (out / "last").exists() else None
        raise FloatingPointError(
            f"the training loss is {loss} at epoch {epoch + 1}, step {step + 1}: stopping "
            f"({'the last good checkpoint is ' + str(kept) if kept else 'no epoch finished, so nothing was saved'}); "
            "lower --lr or check the data")


def save_epoch(cfg: TrainConfig, accelerator: Accelerator, run: Run, record: dict[str, Any], best: dict[str, Any],
               history: list[dict[str, Any]]) -> None:
    """best/ (when the validation score improved), last/, metrics.jsonl and the full training state."""
    out, main, epoch = Path(cfg.output_dir), accelerator.is_main_process, record["epoch"]
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(run.model)
    if main:
        kwargs = dict(label_names=run.data.classes, data_config=run.data_config)
        if best["epoch"] == epoch:
            save_checkpoint(unwrapped, out / "best", **kwargs,
                            extra={**run.facts, "epoch": epoch, "val_top1": record["val_top1"]})
        save_checkpoint(unwrapped, out / "last", **kwargs, extra={**run.facts, "epoch": epoch})
        # the whole file from the history the state holds: a run resumed after a kill or a failed save never repeats
        # an epoch's line
        atomic_write(out / "metrics.jsonl", lambda p: p.write_text("".join(json.dumps(h) + "\n" for h in history)))
        shutil.rmtree(out / ".state.tmp", ignore_errors=True)  # what a killed save left: never complete
        (out / ".state.tmp").mkdir()  # before any process writes its share of the state into it
    accelerator.wait_for_everyone()
    # full training state: written to a temporary folder, then swapped in once every process has written its part
    # (each writes its own random-number state; the swap must not move the folder from under a slower one)
    tmp_state = out / ".state.tmp"
    try:
        accelerator.save_state(str(tmp_state))
    except OSError as err:  # a full disk, a quota: the previous state/ was not touched
        raise OSError(f"could not write the training state of epoch {epoch + 1} to {tmp_state} ({err}); the state "
                      f"of the previous epoch in {out / 'state'} is intact: free space, then --resume {out}") from err
    accelerator.wait_for_everyone()
    if main:
        trainer_state = dict(epoch=epoch, step=(epoch + 1) * run.steps_per_epoch, best=best, history=history,
                             identity=cfg.identity(), config=asdict(cfg))
        atomic_write(tmp_state / "trainer_state.json", lambda p, s=trainer_state: p.write_text(json.dumps(s)))
        replace_dir(tmp_state, out / "state")
    accelerator.wait_for_everyone()


def finish(cfg: TrainConfig, accelerator: Accelerator, run: Run, best: dict[str, Any],
           history: list[dict[str, Any]], started: float) -> dict[str, Any]:
    out, main = Path(cfg.output_dir), accelerator.is_main_process
    results: dict[str, Any] = dict(best_epoch=best["epoch"], best_val_top1=best["top1"], history=history,
                                   output_dir=str(out), wall_s=round(time.time() - started, 1))
    if run.test_loader is not None and (out / "best").exists():
        from .checkpoint import load_checkpoint

        best_model, _ = load_checkpoint(out / "best")
        results["test"] = evaluate_loader(accelerator.prepare(best_model), run.test_loader, accelerator)
    if main:
        atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(results, indent=2)))
    accelerator.end_training()
    return dict(results, is_main_process=main)  # under `accelerate launch`, only the main process reports


def recipe_summary(cfg: TrainConfig) -> dict[str, Any]:
    """The training recipe as the model card reports it: the recipe's name, source and rules, then the values."""
    aug = cfg.augmentation()
    return dict(**get_recipe(cfg.recipe).summary(), lr=cfg.lr, min_lr=cfg.min_lr, weight_decay=cfg.weight_decay,
                batch_size=cfg.batch_size * cfg.grad_accum, epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs,
                label_smoothing=cfg.label_smoothing, drop_path=cfg.drop_path, clip_grad=cfg.clip_grad,
                augmentation=cfg.aug if not generated_task(cfg.dataset) else "none (generated task)",
                **({k: _comparable(v) for k, v in aug.items()} if not generated_task(cfg.dataset) else {}),
                normalize=cfg.normalize, train_size=cfg.train_size if generated_task(cfg.dataset) else None,
                mixed_precision=cfg.mixed_precision, seed=cfg.seed)
