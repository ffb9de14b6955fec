"""Every setting of a training run (:class:`TrainConfig`), its checks, and the recipe summary a card reports."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from ..data import DATASET_SPECS, free_token_family, generated_task
from ..recipes import AUGMENTATION_PRESETS, RECIPE_SETTINGS, RECIPES, get_recipe, resolve, setting_help
from ..settings import setting

__all__ = ["RANGES", "RESUME_HPARAMS", "TrainConfig", "comparable", "recipe_summary"]

#: settings a resumed run must share with the run it continues (``allow_changed_hparams`` permits changes)
RESUME_HPARAMS = ("recipe", "lr", "min_lr", "batch_size", "weight_decay", "warmup_epochs", "grad_accum", "clip_grad",
                  "label_smoothing", "drop_path", "aug", "crop_scale", "crop_padding", "hflip", "color_jitter",
                  "randaugment", "mixup", "cutmix", "normalize", "train_size", "val_fraction", "arrow", "motion",
                  "shapes", "events", "num_points", "num_frames", "seed", "img_size", "native_resolution",
                  "seq_lens")


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
    here once (``help=`` of each field below, shown by ``pape-hub train --help``). The settings a recipe states
    default to None and are filled from it (``__post_init__``); a value given explicitly wins. Every number is
    checked to be finite and in its range before any work, and refused by name otherwise.

    Example:
        >>> from pape_hub.training import TrainConfig
        >>> cfg = TrainConfig(model="vit_m12_pape", dataset="arrows", epochs=1)
        >>> cfg.recipe, cfg.weight_decay, cfg.warmup_epochs, cfg.label_smoothing   # filled from the recipe
        ('default', 0.05, 1.0, 0.1)
    """

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
    native_resolution: bool = setting(False, "train and validate at native aspect ratio on timm's NaFlex loader: each "
                                      "image a padded sequence of its own patches (patch_coord, patch_valid), each "
                                      "batch about --batch-size x the longest --seq-lens tokens")
    seq_lens: tuple[int, ...] | None = setting(None, "native resolution: tokens per image that batches draw from, "
                                               "as timm's --naflex-train-seq-lens; images are resized to fit, aspect "
                                               "kept (default: the model's own grid's token count; a generated task: "
                                               "every image at its own size, padded to the largest)", metavar="N,...")
    val_fraction: float = setting(0.1, "share of the training split held out for validation (datasets without one)")
    train_size: int = setting(16384, "generated tasks: training samples per epoch")
    eval_size: int = setting(2000, "generated tasks: validation and test samples")
    arrow: dict[str, Any] = setting(help="ArrowConfig fields (flags --arrow-*)", default_factory=dict, flag=False)
    motion: dict[str, Any] = setting(help="MotionConfig fields (flags --motion-*)", default_factory=dict, flag=False)
    shapes: dict[str, Any] = setting(help="ShapeConfig fields (flags --shapes-*)", default_factory=dict, flag=False)
    events: dict[str, Any] = setting(help="EventConfig fields (flags --events-*)", default_factory=dict, flag=False)
    num_points: int = setting(1024, "point-cloud files (modelnet:PATH): points read per cloud")
    num_frames: int | None = setting(None, "video folders: frames sampled per clip (default: the model's)")
    log_with: str | None = setting(None, "accelerate tracker: tensorboard, wandb, ... (--report-to, as transformers' "
                                         "Trainer names it, is the same flag)", aliases=("report-to",))
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
        for name in ("epochs", "batch_size", "grad_accum", "train_size", "eval_size", "num_points"):
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
        if self.seq_lens is not None:
            if not self.seq_lens or any(v != int(v) or v < 1 for v in self.seq_lens):
                bad("seq_lens", "must be whole numbers of tokens, at least 1 each")
            self.seq_lens = tuple(int(v) for v in self.seq_lens)
            if not self.native_resolution:
                bad("seq_lens", "sets the token budgets of --native-resolution; add --native-resolution")
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


def comparable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def recipe_summary(cfg: TrainConfig) -> dict[str, Any]:
    """The training recipe as the model card reports it: the recipe's name, source and rules, then the values."""
    aug = cfg.augmentation()
    generated = generated_task(cfg.dataset) is not None or cfg.dataset in ("shapes3d", "movingdot")
    plain = generated or free_token_family(cfg.dataset) is not None  # no image augmentation
    return dict(**get_recipe(cfg.recipe).summary(), lr=cfg.lr, min_lr=cfg.min_lr, weight_decay=cfg.weight_decay,
                batch_size=cfg.batch_size * cfg.grad_accum, epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs,
                label_smoothing=cfg.label_smoothing, drop_path=cfg.drop_path, clip_grad=cfg.clip_grad,
                augmentation=cfg.aug if not plain else "none (generated task)" if generated else "none",
                **({k: comparable(v) for k, v in aug.items()} if not plain else {}),
                normalize=cfg.normalize, train_size=cfg.train_size if generated else None,
                mixed_precision=cfg.mixed_precision, seed=cfg.seed,
                **(dict(native_resolution=True, seq_lens=comparable(cfg.seq_lens)) if cfg.native_resolution else {}))
